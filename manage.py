#!/usr/bin/env python
import os
import sys
from pathlib import Path


def is_plain_gateway_call(argv: list[str]) -> bool:
    """`manage.py gateway call …`: the Django-free client answers it alone, in a fraction of the time loading the
    server's settings and apps takes. Django's own options go before `call` (`manage.py gateway --traceback call
    …`), and such a call goes through Django."""
    return argv[1:3] == ["gateway", "call"]


def main() -> None:
    if is_plain_gateway_call(sys.argv):
        # The project's state folder, as the settings default it; the client reads the token and the running
        # gateway's address from there, and OPENCLAW_GATEWAY_TOKEN / _PASSWORD / _BIND / _PORT as the settings do.
        os.environ.setdefault("OPENCLAW_STATE_DIR", str(Path(__file__).resolve().parent / ".openclaw-state"))
        from openclaw_client.cli import main as gateway_call

        sys.exit(gateway_call(sys.argv[2:], prog="manage.py gateway"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openclaw_site.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as error:
        # A setting that cannot be used: one line naming it, not a traceback.
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
