"""``POST /api/workers/inference/chat/completions``: a worker's model call, as a plain ASGI app (transport only).

The rules are :mod:`workers_app.inference`'s: a token of one running turn on one node, the
gateway's own provider, the reply as server-sent OpenAI chunks. This route is on the path of every
token of every node-placed turn, so it is served beside Django rather than through it: Django's
handler gives each request a thread of its own and hops to it for the request signals and again for
the view's database check (about 15 ms of a turn on a busy gateway, measured). Here the request
costs one hop, to the thread that checks its grant and then calls the model. Errors have the API's one shape
(``{"error": {code, message, details?}}``) and statuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator

from django.conf import settings
from pydantic import ValidationError

from gateway.exceptions import (
    FrameRejected,
    GatewayError,
    InvalidRequest,
    Unauthorized,
    internal_error,
)
from gateway.http_auth import bearer_token
from gateway.protocol import decode_frame, error_path, validation_message
from sessions_app.model_providers import ChatMessage, ToolCall

from .inference import INFERENCE_PATH, InferenceGrant, completion_stream, grant_for
from .plain_http import ClientGone, Receive, Scope, Send, read_body, send_error
from .schemas import InferenceMessage, InferenceRequest

logger = logging.getLogger(__name__)

TOKEN_HINT = "send 'Authorization: Bearer <the inference token of the turn>'"


async def inference_app(scope: Scope, receive: Receive, send: Send) -> None:
    chunks: AsyncGenerator[bytes] | None = None
    try:
        grant, body = await _accepted(scope, receive)
        chunks = completion_stream(grant, [_chat_message(message) for message in body.messages], tools=body.tools)
        await anext(chunks)  # the grant holds: its run is running on its node
    except ClientGone:
        return
    except GatewayError as error:
        await send_error(send, error, allow="POST")
        return
    except Exception:
        if chunks is not None:
            await chunks.aclose()
        error = internal_error(logger, f"POST {INFERENCE_PATH}")
        await send_error(send, error, allow="POST")
        return
    await _stream_until_hangup(send, receive, chunks)


async def _accepted(scope: Scope, receive: Receive) -> tuple[InferenceGrant, InferenceRequest]:
    """The request's grant and body, or the error that answers it (checked in this order; the
    grant's run is checked by :func:`completion_stream`)."""
    if scope["method"] != "POST":
        method = scope["method"]
        error = InvalidRequest(f"method {method} is not allowed on {INFERENCE_PATH}", details={"allowed": ["POST"]})
        error.http_status = 405
        raise error
    token = bearer_token(scope)
    if token is None:
        raise _unauthorized("inference token required", "AUTH_TOKEN_MISSING")
    grant = grant_for(token)
    if grant is None:
        raise _unauthorized("inference token refused", "AUTH_TOKEN_MISMATCH")
    return grant, _parsed(await read_body(receive, settings.DATA_UPLOAD_MAX_MEMORY_SIZE))


def _chat_message(message: InferenceMessage) -> ChatMessage:
    return ChatMessage(
        role=message.role,
        content=message.content or "",
        tool_calls=tuple(
            ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments)
            for call in message.tool_calls or ()
        ),
        tool_call_id=message.tool_call_id,
        name=message.name,
    )


def _unauthorized(message: str, code: str) -> Unauthorized:
    return Unauthorized(message, details={"code": code, "hint": TOKEN_HINT})


def _parsed(body: bytes) -> InferenceRequest:
    try:
        value = decode_frame(body.decode("utf-8"))
    except (UnicodeDecodeError, FrameRejected) as rejected:
        if isinstance(rejected, FrameRejected) and not rejected.malformed:
            raise InvalidRequest(f"invalid request: {rejected.reason}") from None
        raise InvalidRequest("invalid request: the body is not valid JSON") from None
    try:
        return InferenceRequest.model_validate(value)
    except ValidationError as invalid:
        problems = [
            {"in": "body", "path": error_path(tuple(item.get("loc", ()))), "message": validation_message(item)}
            for item in invalid.errors()
        ]
        message = "invalid request: " + "; ".join(f"at {p['path']} (body): {p['message']}" for p in problems)
        raise InvalidRequest(message, details={"errors": problems}) from None


async def _stream_until_hangup(send: Send, receive: Receive, chunks: AsyncGenerator[bytes]) -> None:
    """Send ``chunks`` as the response body; a worker that hangs up ends the stream (and its model call)."""

    async def stream() -> None:
        async with contextlib.aclosing(chunks):
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
                }
            )
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def hangup() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    streaming, listening = asyncio.ensure_future(stream()), asyncio.ensure_future(hangup())
    try:
        await asyncio.wait({streaming, listening}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        listening.cancel()
        if not streaming.done():
            streaming.cancel()  # the stream's generator closes: the provider stops at its next check
        try:
            await streaming
        except asyncio.CancelledError:
            pass
        except Exception:
            # The response has started: the worker sees a stream without [DONE], and the log says why.
            logger.exception("streaming the inference of a worker turn failed")
