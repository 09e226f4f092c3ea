"""The pieces of the workers' plain ASGI routes (served beside Django, not through it): a bounded body, and
answers in the API's one shape (``{"error": {code, message, details?}}``). Their bearer token is read by
:func:`gateway.http_auth.bearer_token`."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.exceptions import GatewayError, PayloadTooLarge

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class ClientGone(Exception):
    """The worker hung up before its request was read."""


async def read_body(receive: Receive, limit: int) -> bytes:
    """The request's body, refused once it passes ``limit`` bytes (before the rest is read)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body too large (at most {limit} bytes)")
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


async def send_json(send: Send, status: int, payload: Any, *, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(payload).encode()
    start_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*start_headers, *headers]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, error: GatewayError, *, allow: str | None = None) -> None:
    """``error`` in the API's shape with its status (and, for a 405, the methods ``allow``\\ ed)."""
    headers = [(b"allow", allow.encode())] if allow and error.http_status == 405 else []
    await send_json(send, error.http_status, {"error": error.to_shape()}, headers=headers)
