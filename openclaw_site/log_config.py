"""Django's ``LOGGING`` for every profile (docs/operations.md, "Logs").

The console (standard error) carries the plain human format or JSON lines (``OPENCLAW_LOG_FORMAT``); the log file,
when there is one, always carries JSON lines, which ``logs.tail`` and the console's Logs page read. Both pass the
context filter, so every line names its process and, where they apply, its request, run, session and device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LOG_FORMATS = ("plain", "json")


def logging_config(
    *,
    console_format: str,
    level: str,
    file_path: Path | None,
    file_max_bytes: int,
    file_backups: int,
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
        "filters": {"context": {"()": "gateway.log_context.LogContextFilter"}},
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
        },
    }
