"""Calling the channel layer from synchronous code without a new event loop per call.

``async_to_sync`` from a thread that has no event loop (a Celery worker thread, a shell) starts a
fresh loop for every call, and channels_redis keeps its connection pools per loop: every event
would open a new Redis connection. Here such threads share one long-lived loop in a daemon thread.
In a gateway process the coroutine runs on the gateway's own loop instead (the in-memory layer's
queues belong to it).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

from . import state

PUBLISH_TIMEOUT_S = 10.0

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="openclaw-publisher", daemon=True).start()
            _loop = loop
        return _loop


def submit(make: Callable[[], Awaitable[Any]]) -> Future:
    """Start ``make()`` (a coroutine factory) on the channel layer's loop from synchronous code; its
    outcome arrives in the returned future."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # no loop in this thread: the normal case
    else:
        raise RuntimeError("publisher.submit called on an event loop thread; await the coroutine instead")
    loop = state.main_loop() or _background_loop()

    async def call() -> Any:
        return await make()

    # In a context of its own: the caller's (asgiref's sync-thread markers among them) must not leak
    # into the coroutine, or its own sync_to_async calls would think they run inside the caller.
    return contextvars.Context().run(asyncio.run_coroutine_threadsafe, call(), loop)


def run_sync(make: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``make()`` (a coroutine factory) to completion from synchronous code and return its result."""
    return submit(make).result(PUBLISH_TIMEOUT_S)
