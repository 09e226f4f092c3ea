"""A frame's way in after the handshake: its size against the limits, its text decoded, its envelope.

The limits (docs/gateway-protocol.md, "Frame and text limits") are ``maxPayload`` for every frame and the
limit of the frame's method (``registry.method(max_frame_bytes=…)``). Both are checked on the frame's size
before it is parsed, with the method its head names (``protocol.read_frame_head``), and the method's limit
again after parsing, with the method the frame really names. Every refusal is a :class:`FrameRejected`
carrying the id to answer under.

A big frame is decoded off the event loop, in a pool of its own (its params are validated there too,
``dispatch.run_request``): the loop keeps serving every other connection meanwhile. The consumer awaits
each frame before it takes the next one, so a connection's requests still start in the order they came.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from .exceptions import FrameRejected
from .protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    CancelFrame,
    RequestFrame,
    decode_frame,
    format_validation_error,
    read_frame_head,
    request_id_of,
    utf8_len_exceeds,
)
from .registry import registry

# Above this many characters a frame is decoded and validated off the event loop. Below it the work (well
# under a millisecond) costs less than the hop to a thread and back.
OFF_LOOP_FRAME_CHARS = 64 * 1024

# Its own threads: a frame must not queue behind the long work of the loop's default executor (requests that
# wait on nodes and providers). Two are enough to keep the loop free; more would only contend for the same
# interpreter lock.
_decode_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gateway-decode")


def is_big(text: str) -> bool:
    return len(text) > OFF_LOOP_FRAME_CHARS


async def off_loop[T](fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the decode pool."""
    return await asyncio.get_running_loop().run_in_executor(_decode_pool, fn, *args)


def parse_frame(raw: Any) -> RequestFrame | CancelFrame:
    """A request (or cancel) frame from a decoded one, or :class:`FrameRejected` carrying the id to answer under."""
    if not isinstance(raw, dict):
        raise FrameRejected(f"must be an object, got {type(raw).__name__}")
    try:
        if raw.get("type") == "cancel":
            return CancelFrame.model_validate(raw)
        return RequestFrame.model_validate(raw)
    except ValidationError as exc:
        raise FrameRejected(format_validation_error(exc), frame_id=request_id_of(raw)) from None


def _check_method_limit(text: str, method: str | None, frame_id: str) -> None:
    limit = registry.frame_limit(method)
    if limit is not None and utf8_len_exceeds(text, limit):
        subject = method if method in registry.methods else "a request frame"
        raise FrameRejected(f"frame exceeds the limit of {subject} ({limit} bytes)", frame_id=frame_id)


async def take_frame(text: str, *, max_payload: int) -> RequestFrame | CancelFrame:
    """The request or cancel frame ``text`` holds, within the limits; else :class:`FrameRejected`."""
    # Only a frame past the smallest limit needs its head read (free for ASCII text up to that size).
    sized = utf8_len_exceeds(text, min(DEFAULT_MAX_FRAME_BYTES, max_payload))
    if sized:
        head = read_frame_head(text)
        if utf8_len_exceeds(text, max_payload):
            raise FrameRejected(f"frame exceeds maxPayload ({max_payload} bytes)", frame_id=head.request_id)
        if head.type == "cancel" or (head.type == "req" and head.method is not None):
            _check_method_limit(text, head.method if head.type == "req" else None, head.request_id)
    raw = await off_loop(decode_frame, text) if is_big(text) else decode_frame(text)
    frame = parse_frame(raw)
    if sized:
        _check_method_limit(text, frame.method if isinstance(frame, RequestFrame) else None, frame.id)
    return frame
