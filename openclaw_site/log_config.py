"""Django's ``LOGGING`` for every profile (docs/operations.md, "Logs").

The console (standard error) carries the plain human format or JSON lines (``OPENCLAW_LOG_FORMAT``); the log file,
when there is one, always carries JSON lines, which ``logs.tail`` and the console's Logs page read. Both pass the
context filter, so every line names its process and, where they apply, its request, run, session and device.
Lines nobody acts on go down to DEBUG (``gateway/log_filters.py``): Celery's bookkeeping of the periodic sweeps
(``routine_tasks``) and Django's 404 warnings for what browsers ask for on their own (``browser_paths``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

LOG_FORMATS = ("plain", "json")
# Asked for by browsers without a link to it: a 404 for these is no news to an operator.
BROWSER_PATHS = ("/favicon.ico", "/apple-touch-icon")


def logging_config(
    *,
    console_format: str,
    level: str,
    file_path: Path | None,
    file_max_bytes: int,
    file_backups: int,
    routine_tasks: Iterable[str] = (),
    browser_paths: Iterable[str] = BROWSER_PATHS,
) -> dict[str, Any]:
    handlers: dict[str, dict[str, Any]] = {
        "console": {"class": "logging.StreamHandler", "formatter": console_format, "filters": ["context"]},
    }
    if file_path is not None:
        handlers["file"] = {
            "()": "gateway.log_files.SharedRotatingFileHandler",
            "filename": str(file_path),
            "max_bytes": file_max_bytes,
            "backup_count": file_backups,
            "formatter": "json",
            "filters": ["context"],
        }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "context": {"()": "gateway.log_context.LogContextFilter"},
            "routine_tasks": {"()": "gateway.log_filters.QuietRoutineTasks", "tasks": sorted(routine_tasks)},
            "browser_requests": {"()": "gateway.log_filters.QuietBrowserRequests", "paths": list(browser_paths)},
        },
        "formatters": {
            "plain": {"()": "gateway.log_context.PlainFormatter"},
            "json": {"()": "gateway.log_context.JsonLineFormatter"},
        },
        "handlers": handlers,
        "root": {"handlers": list(handlers), "level": level},
        "loggers": {
            "daphne": {"level": "WARNING"},
            "django.channels.server": {"level": "WARNING"},
            "httpx": {"level": "WARNING"},
            "django.request": {"filters": ["browser_requests"]},
            # The worker's "received" and "succeeded" lines, and beat's "Sending due task".
            "celery.worker.strategy": {"filters": ["routine_tasks"]},
            "celery.app.trace": {"filters": ["routine_tasks"]},
            "celery.beat": {"filters": ["routine_tasks"]},
        },
    }
