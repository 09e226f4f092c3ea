"""The benchmarks' framework floor: a WebSocket consumer that answers without doing any work.

``bench/gateway_bench.py`` measures it beside the gateway, in the same process, under the same Daphne and Channels,
and reports the gateway's figures as ratios to it: what is left above 1× is the gateway's own cost per call, not the
server's or the framework's. Only the benchmarks' own ASGI application (``bench/asgi.py``, named by
``bench/settings.py``) routes it, at ``/bench/floor``; it has no authentication, so it never belongs in a deployment.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer

FLOOR_PATH = "bench/floor"


class FloorConsumer(AsyncWebsocketConsumer):
    """Answers each request frame ``{"type": "req", "id": …}`` with ``{"type": "res", "id": …, "ok": true,
    "payload": {}}``; anything else is ignored.

    On connect it sends a ``connect.challenge`` event like the gateway, so the benchmark drives it with the
    same client (:class:`openclaw_client.client.GatewayClient`) and the same code path; its ``connect``
    request gets the same empty answer as any other.
    """

    async def dispatch(self, message: dict[str, Any]) -> None:
        # The gateway's consumer skips channels' per-message `aclose_old_connections()` database-thread hop
        # too (it has no database work outside its own hops); a floor that paid it would flatter the gateway.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        await self.accept()
        challenge = {"nonce": str(uuid.uuid4()), "ts": int(time.time() * 1000)}
        await self.send(text_data=json.dumps({"type": "event", "event": "connect.challenge", "payload": challenge}))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            frame = json.loads(text_data if text_data is not None else (bytes_data or b""))
        except ValueError:
            return
        if isinstance(frame, dict) and frame.get("type") == "req":
            await self.send(text_data=json.dumps({"type": "res", "id": frame.get("id"), "ok": True, "payload": {}}))
