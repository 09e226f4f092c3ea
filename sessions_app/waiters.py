"""agent.wait without polling: waiters per runId, woken with the run's terminal answer.

Two notifications carry the answer (``events.py``). The run-finished process notification reaches
every gateway process; the same notification rides as a follow-up on the run's terminal ``chat``
event, handled by each connection right after it sent that event to its client. A waiter on a
connection that receives the run's events answers from that follow-up, so agent.wait's answer
never reaches a client before the run's events: the process notification travels on another
channel and can be handled first. Any other waiter answers from the process notification.
"""

from __future__ import annotations

import asyncio
import collections
from collections import defaultdict
from datetime import timedelta

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from gateway import state
from gateway.context import RpcContext
from gateway.registry import registry
from gateway.visibility import event_visible

from . import selectors
from .events import EVENT_CHAT, RUN_FINISHED

# How long a waiter whose connection receives the run's events waits for its copy of the terminal
# event once it knows the run ended (it is normally on its way within milliseconds; a copy that
# was lost, or a subscription made after it went out, must not hold the answer back for long).
DELIVERY_GRACE_S = 2.0
# Which (connection channel, run) terminal events this process delivered lately: a wait that starts
# after the delivery answers at once. Markers only (no answers): a wait always has read the run.
DELIVERED_MEMORY = 4096


def _recheck_s() -> float:
    """Re-read the run at least this often even without a wake-up (a lost notification only delays)."""
    return settings.OPENCLAW_GATEWAY["AGENT_WAIT_RECHECK_MS"] / 1000


class _Waiter:
    """One agent.wait call: what it learned so far, and an event that wakes it when that changes."""

    def __init__(self, ctx: RpcContext | None) -> None:
        self.ctx = ctx
        self.woken = asyncio.Event()
        self.result: dict | None = None  # the answer, once this waiter may send it
        self.reread = False  # a notification without an answer: read the run again
        # The answer, known before this connection's copy of the terminal event went out: sent at
        # ``fallback_at`` at the latest, if that copy does not arrive first.
        self.fallback: dict | None = None
        self.fallback_at = 0.0

    @property
    def channel_name(self) -> str | None:
        return self.ctx.channel_name if self.ctx is not None else None

    def receives_events(self, origin_channel: str | None) -> bool:
        """Whether this connection is sent the run's ``chat`` events: as the connection that sent
        the turn (a direct copy) or as a ``sessions.subscribe`` subscriber."""
        ctx = self.ctx
        if ctx is None:
            return False
        spec = registry.events.get(EVENT_CHAT)
        visible = {"role": ctx.role, "scopes": ctx.scopes, "subscriptions": ctx.subscriptions}
        if origin_channel and origin_channel == ctx.channel_name and event_visible(spec, direct=True, **visible):
            return True
        return event_visible(spec, **visible)

    def answer_by(self, answer: dict, deadline: float) -> None:
        if self.result is None and self.fallback is None:
            self.fallback, self.fallback_at = answer, deadline


class RunWaiters:
    def __init__(self) -> None:
        self._waiters: dict[str, set[_Waiter]] = defaultdict(set)
        self._delivered: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()

    def add(self, run_id: str, ctx: RpcContext | None = None) -> _Waiter:
        waiter = _Waiter(ctx)
        self._waiters[run_id].add(waiter)
        return waiter

    def discard(self, run_id: str, waiter: _Waiter) -> None:
        waiters = self._waiters.get(run_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[run_id]

    def finished(self, run_id: str, result: dict | None, origin_channel: str | None) -> None:
        """The process notification: the run ended (``result`` is its answer, if carried)."""
        now = asyncio.get_running_loop().time()
        for waiter in self._waiters.get(run_id, ()):
            if result is None:
                waiter.reread = True
            elif waiter.receives_events(origin_channel) and not self.was_delivered(waiter.channel_name, run_id):
                waiter.answer_by(result, now + DELIVERY_GRACE_S)
            elif waiter.result is None:
                waiter.result = result
            waiter.woken.set()

    def delivered(self, run_id: str, result: dict, channel_name: str) -> None:
        """The follow-up: the connection ``channel_name`` has sent the run's terminal event."""
        self._delivered[(channel_name, run_id)] = None
        self._delivered.move_to_end((channel_name, run_id))
        while len(self._delivered) > DELIVERED_MEMORY:
            self._delivered.popitem(last=False)
        for waiter in self._waiters.get(run_id, ()):
            if waiter.channel_name == channel_name:
                waiter.result = result
                waiter.woken.set()

    def was_delivered(self, channel_name: str | None, run_id: str) -> bool:
        return channel_name is not None and (channel_name, run_id) in self._delivered


run_waiters = RunWaiters()
state.on_process_message(
    RUN_FINISHED,
    lambda message: run_waiters.finished(message["runId"], message.get("result"), message.get("originChannel")),
)
state.on_delivered(
    RUN_FINISHED, lambda message, channel_name: run_waiters.delivered(message["runId"], message["result"], channel_name)
)


async def wait_for_run(run_id: str, timeout_ms: int, ctx: RpcContext | None = None) -> dict:
    """``agent.wait``: the run's terminal payload, or ``status: "timeout"`` after ``timeout_ms``.

    ``ctx``: the connection waiting, whose client must have the run's events before the answer.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000
    # Registered before reading: a finish between the read and the wait still wakes it.
    waiter = run_waiters.add(run_id, ctx)
    try:
        waiter.reread = True
        while True:
            if waiter.result is not None:
                return waiter.result
            if waiter.reread:
                waiter.reread = False
                run = await database_sync_to_async(selectors.run_get)(run_id)
                if waiter.result is not None:
                    return waiter.result
                if run is not None and run.is_terminal:
                    answer = selectors.run_wait_payload(run)
                    if (
                        run.ended_at is None
                        or timezone.now() - run.ended_at >= timedelta(seconds=DELIVERY_GRACE_S)
                        or not waiter.receives_events(run.origin_channel)
                        or run_waiters.was_delivered(waiter.channel_name, run_id)
                    ):
                        return answer
                    # It ended a moment ago: this connection's copy of its end may still be on its way.
                    waiter.answer_by(answer, loop.time() + DELIVERY_GRACE_S)
            now = loop.time()
            if waiter.fallback is not None and now >= min(waiter.fallback_at, deadline):
                return waiter.fallback
            if now >= deadline:
                return {"runId": run_id, "status": "timeout"}
            until = min(deadline, now + _recheck_s())
            if waiter.fallback is not None:
                until = min(until, waiter.fallback_at)
            waiter.woken.clear()
            try:
                await asyncio.wait_for(waiter.woken.wait(), until - now)
            except TimeoutError:
                if waiter.fallback is None:
                    waiter.reread = True
    finally:
        run_waiters.discard(run_id, waiter)
