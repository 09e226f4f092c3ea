"""Where the worker hosts this gateway starts reach it (the ``local`` and ``static-ssh`` providers)."""

from __future__ import annotations

from django.conf import settings

from gateway import state


def gateway_url() -> str:
    """Where the node hosts this gateway starts (the local and static-ssh providers) connect:
    ``OPENCLAW_WORKER_GATEWAY_URL``, else the address this gateway process serves on (in a Celery
    worker: the configured bind address and port)."""
    configured = settings.OPENCLAW_WORKERS.get("GATEWAY_URL")
    if configured:
        return configured
    bind, port = state.listen_address() or (settings.OPENCLAW_GATEWAY["BIND"], settings.OPENCLAW_GATEWAY["PORT"])
    host = "127.0.0.1" if bind in ("0.0.0.0", "", "::") else bind
    return f"ws://{host}:{port}"


def http_origin(ws_url: str) -> str:
    """The HTTP origin of a gateway WebSocket URL (its bundle and inference routes live there)."""
    scheme, _, rest = ws_url.partition("://")
    return f"{'https' if scheme == 'wss' else 'http'}://{rest.split('/', 1)[0]}"
