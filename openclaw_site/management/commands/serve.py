"""Start the gateway (HTTP + WebSocket on one port) under Daphne.

Once the port is bound the command prints where everything is, with the real port (also when ``--port 0`` picked
one), and records the address in ``<state dir>/gateway.json`` for the CLI; a clean stop removes that file.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from channels.routing import get_default_application
from django.conf import settings
from django.core.management.base import BaseCommand

from gateway import state
from gateway.conf import ensure_gateway_token, gateway_setting, token_file
from gateway.daphne_server import run_gateway_server
from openclaw_client.running_gateway import connect_host, remove_gateway_file, write_gateway_file

DATABASE_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
ADMIN_CREDENTIALS_FILE = "admin-credentials"


@dataclass(frozen=True)
class Banner:
    """What the start-up banner says; :meth:`lines` words it."""

    bind: str
    port: int
    database: str
    redis: bool
    model: str
    turns_in_celery: bool
    admin_username: str | None
    admin_credentials: Path
    token_from_environment: bool
    token_path: Path

    def lines(self) -> list[str]:
        host = connect_host(self.bind)
        http = f"http://{host}:{self.port}"
        updates = "through Redis" if self.redis else "in this process"
        if self.admin_username:
            login = f"log in as {self.admin_username}, password in {self.admin_credentials}"
        else:
            login = f"no admin password kept in {self.admin_credentials}: make a login with manage.py createsuperuser"
        token = "from OPENCLAW_GATEWAY_TOKEN" if self.token_from_environment else f"in {self.token_path}"
        lines = [
            f"OpenClaw gateway listening on ws://{host}:{self.port}/ (database: {self.database}, "
            f"live updates: {updates})",
            f"  console:         {http}/ui/  ({login})",
            f"  admin:           {http}/admin/",
            f"  API docs:        {http}/api/docs",
            f"  gateway socket:  ws://{host}:{self.port}/  (token {token})",
            f"  model provider:  {self.model}",
            f"  turns run:       {'in Celery workers' if self.turns_in_celery else 'in this process'}",
            "  try it:          .venv/bin/python -m openclaw_client call health",
        ]
        if self.bind in ("0.0.0.0", "::"):
            lines.append(f"  listening on every address of this host ({self.bind}), not only {host}")
        return lines


def admin_username(credentials_file: Path) -> str | None:
    """The login ``bootstrap`` created, named in its credentials file (the password is never read out)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in credentials_file.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition("=")
            if key == "username" and value.strip():
                return value.strip()
    return None


def model_description(model: dict) -> str:
    if model["PROVIDER"] == "openai":
        return f"{model['MODEL']} at {model['BASE_URL']}"
    return "built-in echo, which repeats each message (set OPENCLAW_MODEL_BASE_URL for a real model)"


def banner_for(bind: str, port: int) -> Banner:
    """This process's banner for a gateway bound to ``bind``:``port``."""
    state_dir = Path(settings.STATE_DIR)
    credentials_file = state_dir / ADMIN_CREDENTIALS_FILE
    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    return Banner(
        bind=bind,
        port=port,
        database=DATABASE_NAMES.get(engine.removesuffix("3"), engine),
        redis=bool(settings.REDIS_URL),
        model=model_description(settings.OPENCLAW_MODEL),
        turns_in_celery=settings.OPENCLAW_TASK_MODE == "celery",
        admin_username=admin_username(credentials_file),
        admin_credentials=credentials_file,
        token_from_environment=bool(gateway_setting("TOKEN")),
        token_path=token_file(),
    )


class Command(BaseCommand):
    help = "Run the gateway: Daphne serving HTTP, the JSON API, the admin and the gateway WebSocket."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=None, help="Address to listen on (OPENCLAW_GATEWAY_BIND).")
        parser.add_argument("--port", type=int, default=None, help="Port (OPENCLAW_GATEWAY_PORT); 0 picks one.")
        parser.add_argument(
            "--no-gateway-file",
            action="store_true",
            help="Do not write <state dir>/gateway.json (a cluster's backends: the file names the balancer).",
        )

    def handle(self, *args, **options):
        # `kill -USR2 <pid>` writes every thread's stack to the log: how an operator sees where a
        # gateway that stopped answering is waiting, without stopping it.
        faulthandler.register(signal.SIGUSR2, all_threads=True)
        # settings.ASGI_APPLICATION: the project's routing, named by the settings rather than imported.
        application = get_default_application()
        host = options["bind"] or gateway_setting("BIND")
        port = options["port"] if options["port"] is not None else gateway_setting("PORT")
        token, created = ensure_gateway_token()
        if created:
            self.stdout.write(f"Gateway token (generated): {token}\n  kept in {token_file()}")

        def ready(listening: list[tuple[str, int]]):
            bound_port = listening[0][1] if listening else port
            # Where node hosts this process starts (the local worker provider) reach it.
            state.set_listen_address(host, bound_port)
            if not options["no_gateway_file"]:
                write_gateway_file(settings.STATE_DIR, bind=host, port=bound_port)
            for line in banner_for(host, bound_port).lines():
                self.stdout.write(line)
            sys.stdout.flush()

        try:
            run_gateway_server(
                application,
                host=host,
                port=port,
                max_message_bytes=2 * gateway_setting("MAX_PAYLOAD_BYTES"),
                ready_callable=ready,
                verbosity=int(options.get("verbosity", 1)),
            )
        finally:
            if not options["no_gateway_file"]:
                remove_gateway_file(settings.STATE_DIR, pid=os.getpid())
