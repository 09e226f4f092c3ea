"""Threads that wait on the gateway's loop never wait for a thread that they hold themselves.

In-process tasks (the embedded gateway's turns, dispatches and sweeps) run in threads of their own, not in the
loop's default executor, where long work of requests runs (a node's removal, a dispatch, a transfer); and a node
call looks its node's connection up in threads where nothing waits. Else the waiting threads could fill the pool
that what they wait for needs, and wait for ever."""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from channels.db import DatabaseSyncToAsync

from gateway import background, state
from gateway.invoke import NodeCommandFailed, invoke_private

DEFAULT_EXECUTOR_THREADS = 2
WAIT_S = 20


@pytest.fixture
def gateway_loop():
    """A running loop as the gateway's main loop, its default executor small enough to fill."""
    loop = asyncio.new_event_loop()
    default = ThreadPoolExecutor(max_workers=DEFAULT_EXECUTOR_THREADS, thread_name_prefix="loop-default")
    loop.set_default_executor(default)
    runner = threading.Thread(target=loop.run_forever, name="gateway-loop", daemon=True)
    runner.start()
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(WAIT_S)  # running: it is the main loop now
    previous = state._flags.main_loop
    state.set_main_loop(loop)
    yield loop
    state._flags.main_loop = previous
    loop.call_soon_threadsafe(loop.stop)
    runner.join(WAIT_S)
    default.shutdown(wait=False, cancel_futures=True)
    loop.close()


def test_tasks_waiting_on_the_loop_for_a_thread_of_its_default_executor_all_end(gateway_loop):
    ended: queue.Queue[tuple[str, str]] = queue.Queue()

    def task() -> None:
        # What a node call does from a task: on the loop, a lookup off the thread shared by the gateway's methods.
        hop = DatabaseSyncToAsync(lambda: threading.current_thread().name, thread_sensitive=False)
        looked_up_in = asyncio.run_coroutine_threadsafe(hop(), gateway_loop).result(WAIT_S)
        ended.put((threading.current_thread().name, looked_up_in))

    tasks = DEFAULT_EXECUTOR_THREADS * 3
    for _ in range(tasks):
        background.run_in_process(task)
    outcomes = [ended.get(timeout=WAIT_S) for _ in range(tasks)]

    # The pool's threads (``openclaw-task_<n>``), not the plain thread of a process without a loop.
    assert all(task_thread.startswith(f"{state.IN_PROCESS_THREAD_PREFIX}_") for task_thread, _ in outcomes)
    assert all(lookup_thread.startswith("loop-default") for _, lookup_thread in outcomes)


@pytest.mark.django_db(transaction=True)
def test_node_calls_from_every_thread_of_the_loops_default_executor_are_answered(gateway_loop):
    async def fill_the_default_executor() -> list[str]:
        def call_node() -> str:  # what a node's removal or a dispatch does from a request's pool thread
            call = asyncio.run_coroutine_threadsafe(
                invoke_private("n" * 64, "worker.status.v1", {}, timeout_ms=WAIT_S * 1000), gateway_loop
            )
            try:
                call.result(WAIT_S)
            except NodeCommandFailed as failure:
                return failure.code
            return "answered"

        loop = asyncio.get_running_loop()
        return await asyncio.gather(*(loop.run_in_executor(None, call_node) for _ in range(DEFAULT_EXECUTOR_THREADS)))

    codes = asyncio.run_coroutine_threadsafe(fill_the_default_executor(), gateway_loop).result(WAIT_S * 2)

    assert codes == ["NOT_CONNECTED"] * DEFAULT_EXECUTOR_THREADS


def test_the_gateway_sizes_its_loops_default_executor_for_waiting_work(settings):
    settings.OPENCLAW_WORK_THREADS = 9
    loop = asyncio.new_event_loop()
    try:
        background.use_work_threads(loop)

        async def names() -> set[str]:
            barrier = threading.Barrier(9, timeout=WAIT_S)

            def wait_for_all() -> str:  # nine at once: only nine threads can meet here
                barrier.wait()
                return threading.current_thread().name

            return set(await asyncio.gather(*(loop.run_in_executor(None, wait_for_all) for _ in range(9))))

        threads = loop.run_until_complete(names())
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()

    assert len(threads) == 9 and all(name.startswith(background.WORK_THREAD_PREFIX) for name in threads)
