"""Calling the channel layer from synchronous code without a new event loop per call.

``async_to_sync`` from a thread that has no event loop (a Celery worker thread, a shell) starts a
fresh loop for every call, and channels_redis keeps its connection pools per loop: every event
would open a new Redis connection. Here such threads share one long-lived loop in a daemon thread.
In a gateway process the coroutine runs on the gateway's own loop instead (the in-memory layer's
queues belong to it).

Publications (events, control messages) go through :func:`post`: one lane per loop, in the order
they were posted from every thread, without the poster waiting for each. A turn publishes a dozen
events; waiting for the loop on each put every one of them behind whatever the loop was doing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

from . import state

logger = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 10.0
# Posted but not yet sent, per process: past this, a poster waits for its own publication (a loop
# that cannot keep up, or a channel layer that hangs, slows the posters instead of growing memory).
LANE_LIMIT = 10_000

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _layer_loop() -> asyncio.AbstractEventLoop:
    return state.main_loop() or _background_loop()


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
    loop = _layer_loop()

    async def call() -> Any:
        return await make()

    # In a context of its own: the caller's (asgiref's sync-thread markers among them) must not leak
    # into the coroutine, or its own sync_to_async calls would think they run inside the caller.
    return contextvars.Context().run(asyncio.run_coroutine_threadsafe, call(), loop)


class _Lane:
    """The publications of one loop, run one after another in posting order (touched on that loop only)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: collections.deque[tuple[Callable[[], Awaitable[Any]], Future]] = collections.deque()
        self.draining = False

    def append(self, make: Callable[[], Awaitable[Any]], done: Future) -> None:
        self.queue.append((make, done))
        if not self.draining:
            self.draining = True
            self.loop.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self.queue:
                make, done = self.queue.popleft()
                try:
                    result = await make()
                except asyncio.CancelledError as cancelled:  # the loop is shutting down
                    done.set_exception(cancelled)
                    raise
                except Exception as error:
                    done.set_exception(error)
                else:
                    done.set_result(result)
        finally:
            self.draining = False


_lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lane] = weakref.WeakKeyDictionary()
_outstanding = 0


def _lane(loop: asyncio.AbstractEventLoop) -> _Lane:
    with _lock:
        lane = _lanes.get(loop)
        if lane is None:
            lane = _lanes[loop] = _Lane(loop)
        return lane


def post(make: Callable[[], Awaitable[Any]], *, what: str) -> Future:
    """Run ``make()`` on the channel layer's loop after everything posted before it; don't wait for it.

    A failure is logged (naming ``what``) and also set on the returned future; waiting on that
    future waits for every publication posted before it too."""
    global _outstanding
    done: Future = Future()
    with _lock:
        _outstanding += 1
        overloaded = _outstanding > LANE_LIMIT
    done.add_done_callback(lambda finished: _settled(finished, what))
    try:
        loop = _layer_loop()
        # In a context of its own, for the reason given in submit().
        loop.call_soon_threadsafe(_lane(loop).append, make, done, context=contextvars.Context())
    except RuntimeError as error:  # the loop is closed: the process is stopping
        done.set_exception(error)
        return done
    if overloaded:
        # Waits (a failure is logged by _settled); a lane still stuck after that is not the poster's error.
        with contextlib.suppress(TimeoutError):
            done.exception(PUBLISH_TIMEOUT_S)
    return done


def _settled(done: Future, what: str) -> None:
    global _outstanding
    with _lock:
        _outstanding -= 1
    error = done.exception()
    if error is not None:
        # A lost event is recoverable (clients refetch on a seq gap); a failed write is not, so
        # publication problems are logged and never raised into the service that published.
        logger.error("failed to publish %s", what, exc_info=error)
