"""Lines nobody acts on, moved from their level down to DEBUG (docs/operations.md, "Logs").

Attached to the loggers that write them (``openclaw_site/log_config.py``): a record matched here is logged at DEBUG,
so it shows with ``OPENCLAW_LOG_LEVEL=DEBUG`` and not at the default INFO. What an operator should act on keeps its
level: a sweep that changed something says so itself (at INFO or WARNING), a failed task is Celery's ERROR line.
Standard library only: settings use it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping


class QuietRoutineTasks(logging.Filter):
    """Celery's INFO bookkeeping of the periodic sweeps: "Task <name>[<id>] received", "… succeeded in …" (the
    worker) and "Scheduler: Sending due task <entry> (<name>)" (beat), three lines every 15 seconds per sweep
    whatever it found."""

    def __init__(self, tasks: Iterable[str] = ()) -> None:
        super().__init__()
        self.tasks = frozenset(tasks)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or _task_name(record.args) not in self.tasks:
            return True
        return _at_debug(record)


class QuietBrowserRequests(logging.Filter):
    """Django's "Not Found" WARNING for what browsers ask for on their own (``/favicon.ico``, the touch icons):
    the access log keeps its INFO line of the request."""

    def __init__(self, paths: Iterable[str] = ()) -> None:
        super().__init__()
        self.paths = tuple(paths)

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) != 404 or not self.paths:
            return True
        path = getattr(getattr(record, "request", None), "path", None)
        if not (isinstance(path, str) and path.startswith(self.paths)):
            return True
        return _at_debug(record)


def _task_name(args: object) -> str | None:
    """The task a Celery record is about: ``args["name"]`` (worker) or the last of ``args`` (beat)."""
    if isinstance(args, Mapping):
        name = args.get("name")
    elif isinstance(args, tuple) and args:
        name = args[-1]
    else:
        return None
    return name if isinstance(name, str) else None


def _at_debug(record: logging.LogRecord) -> bool:
    record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
    return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
