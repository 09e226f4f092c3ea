"""Sync database code run on the event loop's thread, its PostgreSQL waits awaited on the loop.

psycopg does all its protocol work in generators and only *waits* for the socket in one place, the
connection's :meth:`~psycopg.Connection.wait`. :class:`CooperativeConnection` (every connection of
the pool is one) waits as psycopg's own does, except inside a :func:`run_cooperatively` call: there
the wait is handed to the event loop (psycopg's ``wait_async``) and the call is suspended, not the
thread, so the loop serves other connections meanwhile. The call runs in a greenlet: plain sync
code (the ORM, Django's PostgreSQL backend) needs no async twin to do this.

The loop's other work never runs inside the call: ``enter`` and ``leave`` are called around every
stretch the call runs (to set up what the sync code expects of its thread, and undo it), so each
suspension gives the thread back as it was.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from greenlet import getcurrent, greenlet
from psycopg import waiting

# psycopg's own interval for checking interrupts while it waits.
_WAIT_INTERVAL = 0.1


class _Call(greenlet):
    """The greenlet of one cooperative call (its parent is the loop's greenlet, which drives it)."""


class _Await:
    """What a call hands its driver to await on its behalf."""

    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self.awaitable = awaitable


def in_cooperative_call() -> bool:
    return isinstance(getcurrent(), _Call)


def await_in_call(awaitable: Awaitable[Any]) -> Any:
    """Inside a cooperative call: suspend it until the loop has awaited ``awaitable``; its result."""
    current = getcurrent()
    if not isinstance(current, _Call):
        raise RuntimeError("await_in_call outside a cooperative call")
    return current.parent.switch(_Await(awaitable))


async def run_cooperatively(
    fn: Callable[..., Any], *args: Any, enter: Callable[[], None], leave: Callable[[], None]
) -> Any:
    """``fn(*args)`` on this (the loop's) thread; its database waits suspend it rather than the thread."""
    call = _Call(fn)

    def resume(method: Callable[..., Any], *values: Any) -> Any:
        enter()
        try:
            return method(*values)
        finally:
            leave()

    step = resume(call.switch, *args)
    while isinstance(step, _Await):
        try:
            value = await step.awaitable
        except BaseException as error:
            step = resume(call.throw, error)
        else:
            step = resume(call.switch, value)
    return step


class CooperativeConnection(psycopg.Connection):
    """A psycopg connection that, inside a cooperative call, awaits its waits on the event loop."""

    def wait(self, gen, interval: float = _WAIT_INTERVAL, timeout: float | None = None):
        if not isinstance(getcurrent(), _Call):
            return super().wait(gen, interval, timeout)
        return await_in_call(waiting.wait_async(gen, self.pgconn.socket, interval=interval, timeout=timeout))


__all__ = ["CooperativeConnection", "await_in_call", "in_cooperative_call", "run_cooperatively"]
