"""``manage.py node``: run a node host against this project's gateway (``openclaw_client.node``).

Defaults come from the settings: the gateway's own address and shared token, and ``<state dir>/node``
for the node's identity. Everything else is the node host's own (``--capacity``, ``--capacity-wait-ms``,
``--name``).
"""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gateway.conf import gateway_setting, shared_token
from openclaw_client import node


class Command(BaseCommand):
    help = "Run a node host (worker host) connected to this project's gateway."

    def add_arguments(self, parser):
        parser.add_argument("--gateway", default=None, help="default: this project's gateway address")
        parser.add_argument("--state-dir", default=None, help="default: <state dir>/node")
        parser.add_argument("--capacity", type=int, default=None, help="worker slots (1-1024)")
        parser.add_argument("--capacity-wait-ms", type=int, default=None)
        parser.add_argument("--name", default=None)

    def handle(self, *args, **options):
        host = gateway_setting("BIND")
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        host = f"[{host}]" if ":" in host else host
        argv = [
            "--gateway",
            options["gateway"] or f"ws://{host}:{gateway_setting('PORT')}",
            "--state-dir",
            options["state_dir"] or str(settings.STATE_DIR / "node"),
        ]
        token = shared_token()
        if token:
            # In the environment, not on the command line: argv is visible to every user of the machine.
            os.environ.setdefault("OPENCLAW_GATEWAY_TOKEN", token)
        for option in ("capacity", "capacity_wait_ms", "name"):
            if options[option] is not None:
                argv += [f"--{option.replace('_', '-')}", str(options[option])]
        code = node.main(argv)
        if code:
            raise CommandError(f"node host stopped (exit {code})", returncode=code)
