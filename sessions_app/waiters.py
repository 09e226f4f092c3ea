"""agent.wait without polling: futures per runId, woken by the run-finished process notification."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from channels.db import database_sync_to_async
from django.conf import settings

from openclaw_site.gateway import state

from . import selectors
from .events import RUN_FINISHED


def _recheck_s() -> float:
    """Re-read the run at least this often even without a wake-up (a lost notification only delays)."""
    return settings.OPENCLAW_GATEWAY["AGENT_WAIT_RECHECK_MS"] / 1000


class RunWaiters:
    def __init__(self) -> None:
        self._futures: dict[str, set[asyncio.Future]] = defaultdict(set)

    def add(self, run_id: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._futures[run_id].add(future)
        return future

    def discard(self, run_id: str, future: asyncio.Future) -> None:
        futures = self._futures.get(run_id)
        if futures is not None:
            futures.discard(future)
            if not futures:
                del self._futures[run_id]

    def wake(self, run_id: str) -> None:
        for future in self._futures.pop(run_id, ()):
            if not future.done():
                future.set_result(None)


run_waiters = RunWaiters()
state.on_process_message(RUN_FINISHED, lambda message: run_waiters.wake(message["runId"]))


async def wait_for_run(run_id: str, timeout_ms: int) -> dict:
    """``agent.wait``: the run's terminal payload, or ``status: "timeout"`` after ``timeout_ms``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000
    while True:
        woken = run_waiters.add(run_id)  # before reading: a finish between read and wait still wakes us
        try:
            run = await database_sync_to_async(selectors.run_get)(run_id)
            if run is not None and run.is_terminal:
                return selectors.run_wait_payload(run)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return {"runId": run_id, "status": "timeout"}
            try:
                await asyncio.wait_for(woken, min(remaining, _recheck_s()))
            except TimeoutError:
                pass
        finally:
            run_waiters.discard(run_id, woken)
