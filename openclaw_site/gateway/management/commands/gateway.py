"""``manage.py gateway call <method> --params '<json>'``: the protocol client as a CLI."""

from __future__ import annotations

import argparse

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from openclaw_client.cli import add_call_arguments, run_call
from openclaw_site.gateway.conf import gateway_setting, shared_token


class Command(BaseCommand):
    help = "Talk to a gateway over its WebSocket protocol (defaults: this project's gateway and token)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        add_call_arguments(sub.add_parser("call", help="Call one gateway method and print its JSON result"))

    def handle(self, *args, **options):
        namespace = argparse.Namespace(**options)
        if not namespace.url:
            host = gateway_setting("BIND")
            host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
            namespace.url = f"ws://{host}:{gateway_setting('PORT')}"
        if not namespace.token and not namespace.password:
            namespace.token = shared_token()
        if not namespace.state_dir:
            namespace.state_dir = str(settings.STATE_DIR / "cli")
        code = run_call(namespace, stdout=self.stdout)
        if code:
            raise CommandError("gateway call failed", returncode=code)
