"""What a log line is about: the request, run, session and device being served, and the process serving it.

The core and the apps set these context variables where the work starts (an HTTP request, a WebSocket connection,
an RPC call, a turn); :class:`LogContextFilter` copies them onto every record, so a line says what it belongs to
without each call site repeating it. Context variables follow the work into tasks and database hops (asyncio and
asgiref copy the context), and :func:`bound` restores the previous values on exit.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

# The record attributes (and JSON keys) the context adds, in the order the plain format shows them.
CONTEXT_FIELDS = ("request_id", "run_id", "session_key", "device_id")

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("openclaw_request_id", default=None)
_run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("openclaw_run_id", default=None)
_session_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("openclaw_session_key", default=None)
_device_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("openclaw_device_id", default=None)
CONTEXT_VARS: dict[str, contextvars.ContextVar[str | None]] = {
    "request_id": _request_id,
    "run_id": _run_id,
    "session_key": _session_key,
    "device_id": _device_id,
}

# Long values (a client may choose a frame id) are cut so one line stays one readable line.
MAX_FIELD_CHARS = 200


@contextlib.contextmanager
def bound(**fields: str | None) -> Iterator[None]:
    """Set some of :data:`CONTEXT_FIELDS` for the duration of the block (``None`` clears one)."""
    tokens = []
    for name, value in fields.items():
        variable = CONTEXT_VARS[name]
        tokens.append((variable, variable.set(value[:MAX_FIELD_CHARS] if value else None)))
    try:
        yield
    finally:
        for variable, token in reversed(tokens):
            variable.reset(token)


def bind(**fields: str | None) -> None:
    """Set fields until the current task or connection ends (a WebSocket connection's device, once known)."""
    for name, value in fields.items():
        CONTEXT_VARS[name].set(value[:MAX_FIELD_CHARS] if value else None)


def current() -> dict[str, str]:
    return {name: value for name, variable in CONTEXT_VARS.items() if (value := variable.get()) is not None}


def process_label() -> str:
    """``OPENCLAW_PROCESS_NAME`` (the cluster names its programs: ``gateway-1``, ``worker-1``, ``beat``), else
    ``<host>:<pid>``. Read for each record: a forked child gets its own pid."""
    return os.environ.get("OPENCLAW_PROCESS_NAME", "").strip() or f"{_HOST}:{os.getpid()}"


_HOST = socket.gethostname()


class LogContextFilter(logging.Filter):
    """Adds ``process_name`` to every record and the context fields that are set; ``log_context`` is their compact
    ``key=value`` form for the plain format. Attach it to handlers, so records of every logger pass it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if hasattr(record, "log_context"):
            return True  # the console's handler did it already; the file's sees the same context
        record.process_name = process_label()
        shown = []
        for name, variable in CONTEXT_VARS.items():
            value = getattr(record, name, None)
            if value is None:
                value = variable.get()
                if value is None:
                    continue
                setattr(record, name, value)
            shown.append(f"{name}={value}")
        record.log_context = f" [{' '.join(shown)}]" if shown else ""
        return True


class PlainFormatter(logging.Formatter):
    """The human format: ``time LEVEL logger: message``, then the context fields in brackets when there are any."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None) -> None:
        super().__init__(fmt or "%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record) + getattr(record, "log_context", "")


# Record attributes never written as JSON keys: logging's own, the plain format's helper, and objects Django attaches
# (a request's repr carries its query string, which may hold a token).
JSON_SKIPPED_ATTRS = (*RESERVED_ATTRS, "log_context", "request", "server_time", "json_line")


# OpenClaw's gateway writes tslog lines, whose ``_meta`` its Control UI's Logs page reads the level (lowercased:
# trace, debug, info, warn, error, fatal) and the subsystem from (ui/src/ui/controllers/logs.ts).
OPENCLAW_LEVEL_NAMES = {"DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "WARN", "ERROR": "ERROR", "CRITICAL": "FATAL"}


class JsonLineFormatter(JsonFormatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, ``process`` and
    the context fields that apply, plus the ``extra`` of the call (an access line's method, status, duration),
    and ``_meta`` for OpenClaw's Control UI (``logLevelName``, ``name``: the logger)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("fmt", "%(levelname)s %(name)s %(message)s")
        kwargs.setdefault("rename_fields", {"levelname": "level", "name": "logger", "process_name": "process"})
        kwargs.setdefault("reserved_attrs", JSON_SKIPPED_ATTRS)
        kwargs.setdefault("timestamp", "time")
        super().__init__(**kwargs)

    def format(self, record: logging.LogRecord) -> str:
        # The console and the file both write JSON in production: the record is serialized once for both.
        line = getattr(record, "json_line", None)
        if line is None:
            line = super().format(record)
            record.json_line = line
        return line

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        level = str(log_data.get("level", ""))
        log_data["_meta"] = {"logLevelName": OPENCLAW_LEVEL_NAMES.get(level, level), "name": log_data.get("logger")}
        return log_data
