"""agent.wait without polling: futures per runId, woken by the run-finished process notification."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from openclaw_site.gateway import runtime

from .events import RUN_FINISHED


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
runtime.on_process_message(RUN_FINISHED, lambda message: run_waiters.wake(message["runId"]))
