"""What one gateway process holds in memory: its boot id, its live consumers, its event loop.

Only state lives here; starting and stopping the process is ``lifecycle.py``. Everything other
processes must see goes through the database (``GatewayConnection``) or the channel layer.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .protocol import EncodedEvent

BOOT_ID = str(uuid.uuid4())
STARTED_AT = time.time()

# Gateway processes join this group with one process-level channel each, for notifications that
# are about the process rather than a connection (a run finished: wake agent.wait callers).
PROCESS_GROUP = "gateway.processes"


def uptime_ms() -> int:
    return int((time.time() - STARTED_AT) * 1000)


class LocalConsumer(Protocol):
    async def send_event(self, event: str, payload: Any, *, state_version: dict | None = None) -> None: ...

    async def send_encoded_event(self, encoded: EncodedEvent) -> None: ...

    async def send_broadcast(self, encoded: EncodedEvent) -> None: ...

    async def close(self, code: int | None = None, reason: str | None = None) -> None: ...


class LocalConnections:
    """The authenticated consumers of this process, for ticks, broadcasts and the shutdown event."""

    def __init__(self) -> None:
        self._consumers: set[LocalConsumer] = set()

    def add(self, consumer: LocalConsumer) -> None:
        self._consumers.add(consumer)

    def discard(self, consumer: LocalConsumer) -> None:
        self._consumers.discard(consumer)

    def __iter__(self) -> Iterator[LocalConsumer]:
        return iter(list(self._consumers))

    def __len__(self) -> int:
        return len(self._consumers)


local_connections = LocalConnections()


class _ProcessFlags:
    def __init__(self) -> None:
        self.main_loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False
        self.listen_address: tuple[str, int] | None = None


_flags = _ProcessFlags()


class _Startup:
    """Startup reconciliation of a serving process (``lifecycle.startup``): until it has finished, what clients
    read could be the state recovery has not yet reconciled (workers.md §7: reconcile before reporting ready).
    A process that never starts it (a shell, a Celery worker, tests driving the ASGI app) has nothing to wait for.
    """

    def __init__(self) -> None:
        self.pending = False
        self.done: asyncio.Event | None = None


_startup = _Startup()


def startup_begun() -> None:
    """The server listens and its startup reconciliation is scheduled (on the main loop's thread)."""
    _startup.pending = True
    _startup.done = asyncio.Event()


def startup_finished() -> None:
    _startup.pending = False
    if _startup.done is not None:
        _startup.done.set()


def serving() -> bool:
    """Whether clients may read now: no startup reconciliation pending."""
    return not _startup.pending


async def wait_until_serving(timeout_s: float) -> bool:
    """Wait (on the main loop) until startup reconciliation has finished, at most ``timeout_s``; True once it has."""
    if not _startup.pending or _startup.done is None:
        return True
    try:
        await asyncio.wait_for(_startup.done.wait(), timeout_s)
    except TimeoutError:
        return serving()
    return True


def set_main_loop(loop: asyncio.AbstractEventLoop) -> None:
    _flags.main_loop = loop


def set_listen_address(host: str, port: int) -> None:
    _flags.listen_address = (host, port)


def listen_address() -> tuple[str, int] | None:
    """Where this gateway process serves (``manage.py serve``); None in a Celery worker or a shell."""
    return _flags.listen_address


def main_loop() -> asyncio.AbstractEventLoop | None:
    """The gateway's event loop while it runs; None in a Celery worker, a shell or a unit test."""
    loop = _flags.main_loop
    return loop if loop is not None and loop.is_running() else None


def mark_stopping() -> None:
    _flags.stopping = True


def is_stopping() -> bool:
    return _flags.stopping


# --- who is executing: an in-process task thread of this gateway, or something else ------------

_in_process_task: contextvars.ContextVar[bool] = contextvars.ContextVar("in_process_task", default=False)
IN_PROCESS_THREAD_PREFIX = "openclaw-task"


def in_process_task() -> bool:
    return _in_process_task.get() or threading.current_thread().name.startswith(IN_PROCESS_THREAD_PREFIX)


def enter_in_process_task() -> contextvars.Token:
    return _in_process_task.set(True)


def leave_in_process_task(token: contextvars.Token) -> None:
    _in_process_task.reset(token)


# --- process-level notifications -----------------------------------------------------------

_process_handlers: dict[str, Callable[[dict[str, Any]], None]] = {}


def on_process_message(message_type: str, handler: Callable[[dict[str, Any]], None]) -> None:
    """Handle channel-layer messages sent to every gateway process (see :data:`PROCESS_GROUP`)."""
    _process_handlers[message_type] = handler


def process_message_handler(message_type: str) -> Callable[[dict[str, Any]], None] | None:
    return _process_handlers.get(message_type)


# --- notifications that follow an event on one connection -----------------------------------

_delivery_handlers: dict[str, Callable[[dict[str, Any], str], None]] = {}


def on_delivered(message_type: str, handler: Callable[[dict[str, Any], str], None]) -> None:
    """Handle a notification an event carries (``events.FOLLOW_UP_KEY``), called with it and the
    connection's channel name once that connection has sent the event to its client: whatever the
    handler lets that connection answer next goes out after the event."""
    _delivery_handlers[message_type] = handler


def delivery_handler(message_type: str) -> Callable[[dict[str, Any], str], None] | None:
    return _delivery_handlers.get(message_type)
