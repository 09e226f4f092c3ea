"""HTTP reads wait for startup reconciliation too (the RPC's wait is in ``dispatch.run_request``).

Right after a start, the JSON API, the console and the admin would otherwise show placements, sessions and
environments as recovery has not yet reconciled them (workers.md §7). An ASGI wrapper, so one place covers every
HTTP route; probes and workers' calls that recovery must not wait behind pass straight through.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from . import state
from .conf import gateway_setting
from .dispatch import STILL_STARTING

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

RETRY_AFTER_S = 1


class StartupGate:
    def __init__(self, app: App, *, exempt_paths: Collection[str]):
        self.app = app
        self.exempt_paths = frozenset(exempt_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if state.serving() or scope["path"] in self.exempt_paths:
            return await self.app(scope, receive, send)
        if await state.wait_until_serving(gateway_setting("STARTUP_READ_WAIT_MS") / 1000):
            return await self.app(scope, receive, send)
        body = json.dumps(
            {"error": {"code": "UNAVAILABLE", "message": STILL_STARTING, "retryable": True, "retryAfterMs": 1000}}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(RETRY_AFTER_S).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
