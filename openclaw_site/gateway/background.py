"""Where long work runs: Celery workers in production, a thread pool inside the gateway when embedded.

Apps call :func:`dispatch_on_commit` with a Celery task; the task function is the same either way
(a thin wrapper over a service that guards its own state, so a duplicate run is harmless).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from django.conf import settings
from django.db import transaction

from . import runtime

logger = logging.getLogger(__name__)


def task_mode() -> str:
    return settings.OPENCLAW_TASK_MODE


def dispatch_now(task: Any, *args: Any) -> None:
    if task_mode() == "celery":
        task.apply_async(args=args)
    else:
        runtime.run_in_process(task, *args)


def dispatch_on_commit(task: Any, *args: Any) -> None:
    transaction.on_commit(functools.partial(dispatch_now, task, *args))


def worker_label() -> str:
    """Who is executing right now: this gateway process, or a Celery worker process."""
    if runtime.in_process_worker():
        return f"gateway:{runtime.BOOT_ID}"
    import os
    import socket

    return f"celery:{socket.gethostname()}:{os.getpid()}"
