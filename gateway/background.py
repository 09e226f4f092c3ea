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
    """Which process is executing right now: this gateway process, or a Celery worker process."""
    if state.in_process_task():
        return f"gateway:{state.BOOT_ID}"
    return worker_process_label()


def worker_process_label() -> str:
    """This process as a Celery worker process: the executor of the tasks it runs, the name of its lease."""
    return f"{CELERY_EXECUTOR_PREFIX}{socket.gethostname()}:{os.getpid()}"


def run_in_process(fn: Callable[..., Any], *args: Any) -> None:
    """Run a sync task function in a worker thread of this process.

    On the gateway's event loop when there is one, so that what the task publishes through the
    channel layer reaches this process's consumers; otherwise (a shell, a unit test) in a thread.
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
            await DatabaseSyncToAsync(_run_task, thread_sensitive=False)(fn, args)
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
    """Give this thread's database connections back to the pool (PostgreSQL) before it waits a long time.

    A Celery worker's threads and its pool are the same size: tasks that held their connection while
    they waited (a node's answer, an operator's decision, a turn) could hold all of them, and the waits'
    own connection lookups then queue for one until the pool's timeout. Never inside a transaction (it
    would end it); SQLite's connections are kept (no pool, nothing to run out of)."""
    if not any(conn.in_atomic_block for conn in connections.all(initialized_only=True)):
        close_old_connections()
