"""The console's WebSocket is opened with the browser's session cookie, so a page of another site could
open it too (cross-site WebSocket hijacking). Only the console's own origin, or one named in
``CSRF_TRUSTED_ORIGINS`` (the same list Django's CSRF check trusts), may connect."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings


def same_origin(scope: dict[str, Any]) -> bool:
    headers = dict(scope.get("headers") or ())
    origin = headers.get(b"origin", b"").decode("latin-1")
    host = headers.get(b"host", b"").decode("latin-1")
    if not origin or not host:
        return False
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


class SameOriginOnly:
    """ASGI middleware: a WebSocket from another origin is refused before the application sees it."""

    def __init__(self, application: Any):
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and not same_origin(scope):
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 4403})
            return
        await self.application(scope, receive, send)
