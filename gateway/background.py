"""Where long work runs: Celery workers in production, a thread pool inside the gateway when embedded.

Apps call :func:`dispatch_on_commit` with a Celery task; the task function is the same either way
(a thin wrapper over a service that guards its own state, so a duplicate run is harmless).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery import current_app
from channels.db import DatabaseSyncToAsync
from django.conf import settings
from django.db import close_old_connections, connections, transaction

from . import state

logger = logging.getLogger(__name__)


def task_mode() -> str:
    return settings.OPENCLAW_TASK_MODE


def dispatch_now(task: Any, *args: Any) -> None:
    if task_mode() == "celery":
        task.apply_async(args=args)
    else:
        run_in_process(task, *args)


def dispatch_task_now(name: str, *args: Any) -> None:
    """:func:`dispatch_now` of the Celery task registered under ``name`` (for a caller its module imports)."""
    dispatch_now(current_app.tasks[name], *args)


def dispatch_on_commit(task: Any, *args: Any) -> None:
    transaction.on_commit(functools.partial(dispatch_now, task, *args))


CELERY_EXECUTOR_PREFIX = "celery:"


def executor_label() -> str:
    """Which process is executing right now: this gateway process (a task, a request or a gateway method, whichever
    of its threads asks; recovery can tell by its boot id when it is gone), or a Celery worker process."""
    if state.in_process_task() or state.main_loop() is not None:
        return f"gateway:{state.BOOT_ID}"
    return worker_process_label()


def worker_process_label() -> str:
    """This process as a Celery worker process: the executor of the tasks it runs, the name of its lease."""
    return f"{CELERY_EXECUTOR_PREFIX}{socket.gethostname()}:{os.getpid()}"


_task_pool: ThreadPoolExecutor | None = None
_task_pool_lock = threading.Lock()


def _in_process_task_pool() -> ThreadPoolExecutor:
    """The threads of this process's tasks (``OPENCLAW_TASK_THREADS``), not the event loop's default executor: a
    task waits on the loop for work that takes a thread of that executor (a node call looks its connection up
    there), so tasks that filled it would wait for ever, and every such lookup with them."""
    global _task_pool
    with _task_pool_lock:
        if _task_pool is None:
            _task_pool = ThreadPoolExecutor(
                max_workers=settings.OPENCLAW_TASK_THREADS, thread_name_prefix=state.IN_PROCESS_THREAD_PREFIX
            )
        return _task_pool


WORK_THREAD_PREFIX = "gateway-work"


def use_work_threads(loop: asyncio.AbstractEventLoop) -> None:
    """Size the loop's default executor for what runs there (``OPENCLAW_WORK_THREADS``): long work of requests that
    waits on nodes, providers and model streams (a node's removal, dispatches and moves, workspace transfers, the
    model calls of node turns), not CPU. asyncio's own default, ``cpu count + 4``, would let six such waits on two
    cores queue every other."""
    loop.set_default_executor(
        ThreadPoolExecutor(max_workers=settings.OPENCLAW_WORK_THREADS, thread_name_prefix=WORK_THREAD_PREFIX)
    )


def run_in_process(fn: Callable[..., Any], *args: Any) -> None:
    """Run a sync task function in a worker thread of this process.

    Started from the gateway's event loop when there is one (in a thread of the task pool), so that what the task
    publishes through the channel layer reaches this process's consumers; otherwise (a shell, a unit test) in a
    thread of its own.
    """
    loop = state.main_loop()
    if loop is None:
        thread = threading.Thread(
            target=_run_task_in_thread, args=(fn, args), name=state.IN_PROCESS_THREAD_PREFIX, daemon=True
        )
        thread.start()
        return

    async def runner() -> None:
        try:
            await DatabaseSyncToAsync(_run_task, thread_sensitive=False, executor=_in_process_task_pool())(fn, args)
        except Exception:
            logger.exception("in-process task %s failed", getattr(fn, "name", fn))

    asyncio.run_coroutine_threadsafe(runner(), loop)


def _run_task_in_thread(fn: Callable[..., Any], args: tuple) -> None:
    try:
        _run_task(fn, args)
    finally:
        # This thread ends now: its connections would otherwise stay open until garbage collection.
        connections.close_all()


def _run_task(fn: Callable[..., Any], args: tuple) -> None:
    token = state.enter_in_process_task()
    try:
        fn(*args)
    except Exception:
        logger.exception("in-process task %s failed", getattr(fn, "name", fn))
    finally:
        state.leave_in_process_task(token)
        close_old_connections()


def release_database_connections() -> None:
    """Give this thread's database connections back to the pool (PostgreSQL) before it waits on anything: a
    provider, a node, a model, an operator or another thread (docs/architecture.md, "Waiting").

    A process's threads outnumber its pooled connections: threads that held their connection while they waited
    could hold all of them, and what they waited for (a provider's or a node's own queries, a turn's steps) then
    queued for one until the pool's timeout. The next query takes a connection again. Never inside a transaction
    (it would end it; a wait has no business there); SQLite's connections are kept (no pool, nothing to run out
    of)."""
    if not any(conn.in_atomic_block for conn in connections.all(initialized_only=True)):
        close_old_connections()
