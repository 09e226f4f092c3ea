"""``manage.py gateway call <method> --params '<json>'``: the protocol client as a CLI.

Defaults come from this project's settings: the running gateway recorded in ``<state dir>/gateway.json``, else the
configured address; its shared token (``OPENCLAW_GATEWAY_TOKEN`` or ``<state dir>/gateway-token``) or password; and
``<state dir>/cli`` as the CLI's device identity. Output, failures and exit codes are those of
``openclaw_client.cli``. From a shell, ``manage.py`` hands a plain call to the Django-free client before Django
loads (the same defaults, read from the environment); this command runs for ``call_command`` and for calls with
Django's own options (``--traceback``, ``--settings``).
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gateway.conf import gateway_setting, shared_password, shared_token, token_file
from openclaw_client.cli import CallFailed, Secret, add_call_arguments, call_parser_kwargs, default_address, run_call

CONFIGURED = "OPENCLAW_GATEWAY_TOKEN, OPENCLAW_GATEWAY_PASSWORD, <state dir>/gateway-token"


def configured_secrets() -> tuple[list[Secret], list[str]]:
    """The shared secrets this project is configured with, labelled by where they come from; and where it looked."""
    secrets: list[Secret] = []
    token = shared_token()
    if token:
        source = "from OPENCLAW_GATEWAY_TOKEN" if gateway_setting("TOKEN") else f"in {token_file()}"
        secrets.append(Secret("token", token, source))
    password = shared_password()
    if password:
        secrets.append(Secret("password", password, "from OPENCLAW_GATEWAY_PASSWORD"))
    return secrets, ["OPENCLAW_GATEWAY_TOKEN", "OPENCLAW_GATEWAY_PASSWORD", str(token_file())]


class Command(BaseCommand):
    help = "Talk to a gateway over its WebSocket protocol (defaults: this project's gateway and token)."

    # Set by run_from_argv (``manage.py gateway …``), not by call_command.
    from_command_line = False

    def run_from_argv(self, argv):
        self.from_command_line = True
        super().run_from_argv(argv)

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        add_call_arguments(sub.add_parser("call", **call_parser_kwargs(CONFIGURED)))

    def handle(self, *args, **options):
        namespace = argparse.Namespace(**options)
        ignored_file = None
        if not namespace.url:
            try:
                address = default_address(
                    settings.STATE_DIR, bind=gateway_setting("BIND"), port=gateway_setting("PORT")
                )
            except CallFailed as failure:
                self.stderr.write(f"error: {failure.message}")
                self._fail(failure.exit_code)
            namespace.url, ignored_file = address.url, address.ignored_file
        if not namespace.state_dir:
            namespace.state_dir = str(settings.STATE_DIR / "cli")
        configured, searched = configured_secrets()
        code = run_call(
            namespace,
            configured=configured,
            searched=searched,
            stdout=self.stdout,
            stderr=self.stderr,
            traceback=bool(options.get("traceback")),
            ignored_file=ignored_file,
        )
        if code:
            self._fail(code)

    def _fail(self, code: int) -> NoReturn:
        if self.from_command_line:
            # The one ``error: …`` line is printed; Django would add a "CommandError: …" line of its own.
            raise SystemExit(code)
        raise CommandError(f"gateway call failed (exit code {code})", returncode=code)
