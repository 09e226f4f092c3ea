"""Start the gateway (HTTP + WebSocket on one port) under Daphne."""

from __future__ import annotations

import faulthandler
import signal
import sys

from channels.routing import get_default_application
from django.conf import settings
from django.core.management.base import BaseCommand

from gateway import state
from gateway.conf import ensure_gateway_token, gateway_setting
from gateway.daphne_server import run_gateway_server


class Command(BaseCommand):
    help = "Run the gateway: Daphne serving HTTP, the JSON API, the admin and the gateway WebSocket."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=None, help="Address to listen on (OPENCLAW_GATEWAY_BIND).")
        parser.add_argument("--port", type=int, default=None, help="Port (OPENCLAW_GATEWAY_PORT); 0 picks one.")

    def handle(self, *args, **options):
        # `kill -USR2 <pid>` writes every thread's stack to the log: how an operator sees where a
        # gateway that stopped answering is waiting, without stopping it.
        faulthandler.register(signal.SIGUSR2, all_threads=True)
        # settings.ASGI_APPLICATION: the project's routing, named by the settings rather than imported.
        application = get_default_application()
        host = options["bind"] or gateway_setting("BIND")
        port = options["port"] if options["port"] is not None else gateway_setting("PORT")
        if port:
            # Where node hosts this process starts (the local worker provider) reach it.
            state.set_listen_address(host, port)
        token, created = ensure_gateway_token()
        if created:
            self.stdout.write(f"Gateway token (generated): {token}\n  kept in {settings.STATE_DIR / 'gateway-token'}")
        layer = "Redis" if settings.REDIS_URL else "in-memory"
        database = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        model = settings.OPENCLAW_MODEL
        provider = (
            f"{model['PROVIDER']} {model['MODEL']} at {model['BASE_URL']}"
            if model["PROVIDER"] == "openai"
            else "built-in echo (set OPENCLAW_MODEL_BASE_URL for a real model)"
        )

        def ready():
            self.stdout.write(
                f"OpenClaw gateway listening on ws://{host}:{port} (database: {database}, channel layer: {layer})"
            )
            self.stdout.write(f"  model provider: {provider}; turns run {_task_place()}")
            sys.stdout.flush()

        run_gateway_server(
            application,
            host=host,
            port=port,
            max_message_bytes=2 * gateway_setting("MAX_PAYLOAD_BYTES"),
            ready_callable=ready,
            verbosity=int(options.get("verbosity", 1)),
        )


def _task_place() -> str:
    return "in Celery workers" if settings.OPENCLAW_TASK_MODE == "celery" else "in this process"
