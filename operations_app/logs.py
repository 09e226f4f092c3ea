"""Reading the gateway's log file (``OPENCLAW_LOG_FILE``) for ``logs.tail`` and the console's Logs page.

A read is bounded: it starts at most ``maxBytes`` before the end of the file, so one call never holds more than
that (1 MB at most) whatever the file's size. The cursor is a byte offset into the file: a caller that is behind
by more than ``maxBytes``, or whose cursor lies past the end (the file was rotated or truncated since), starts
again from the newest ``maxBytes`` with ``reset`` set. Only complete lines are returned; a line still being
written is left for the next call.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from gateway.exceptions import Unavailable

# OpenClaw's defaults and ceilings (src/gateway/server-methods/logs.ts).
DEFAULT_LIMIT = 500
DEFAULT_MAX_BYTES = 250_000
MAX_LIMIT = 5000
MAX_BYTES = 1_000_000

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class LogSlice:
    file: str
    cursor: int
    size: int
    lines: list[str]
    truncated: bool
    reset: bool

    def as_payload(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "cursor": self.cursor,
            "size": self.size,
            "lines": self.lines,
            "truncated": self.truncated,
            "reset": self.reset,
        }


def log_file() -> Path:
    path = settings.OPENCLAW_LOG_FILE
    if path is None:
        raise Unavailable("no log file: OPENCLAW_LOG_FILE is set empty")
    return Path(path)


def log_tail(
    path: Path, *, cursor: int | None = None, limit: int = DEFAULT_LIMIT, max_bytes: int = DEFAULT_MAX_BYTES
) -> LogSlice:
    """The lines after ``cursor`` (none: the newest), at most ``limit`` of them (the newest) and ``max_bytes``."""
    limit = min(max(limit, 1), MAX_LIMIT)
    max_bytes = min(max(max_bytes, 1), MAX_BYTES)
    try:
        with open(path, "rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            start, truncated, reset = _window(size, cursor, max_bytes)
            if size <= start:
                return LogSlice(str(path), size, size, [], truncated, reset)
            # The byte before the window says whether the window starts at a line's beginning.
            stream.seek(start - 1 if start > 0 else 0)
            chunk = stream.read(size - start + (1 if start > 0 else 0))
    except FileNotFoundError:
        return LogSlice(str(path), 0, 0, [], False, False)
    except OSError as error:
        raise Unavailable(f"log read failed: {error.strerror}") from None
    if start > 0:
        starts_a_line, chunk = chunk[:1] == b"\n", chunk[1:]
    else:
        starts_a_line = True
    complete = chunk.rfind(b"\n") + 1
    next_cursor = start + complete
    lines = chunk[:complete].decode("utf-8", errors="replace").split("\n")[:-1]
    if not starts_a_line and lines:
        lines = lines[1:]
        truncated = True
    if len(lines) > limit:
        lines = lines[-limit:]
        truncated = True
    return LogSlice(str(path), next_cursor, size, lines, truncated, reset)


def _window(size: int, cursor: int | None, max_bytes: int) -> tuple[int, bool, bool]:
    """Where the read starts, and whether it skips older lines (``truncated``) or restarts (``reset``)."""
    newest = max(0, size - max_bytes)
    if cursor is None:
        return newest, newest > 0, False
    if cursor > size:
        return newest, newest > 0, True
    if size - cursor > max_bytes:
        return newest, True, True
    return cursor, False, False


@dataclass(frozen=True)
class LogEntry:
    """One line as the console shows it: JSON lines split into their fields, anything else kept as text."""

    time: str
    level: str
    logger: str
    process: str
    message: str
    context: str
    raw: str


def parse_line(line: str) -> LogEntry:
    try:
        data = json.loads(line)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return LogEntry("", "", "", "", line, "", line)
    message = str(data.get("message", ""))
    if data.get("exc_info"):
        message = f"{message}\n{data['exc_info']}"
    context = " ".join(
        f"{key}={data[key]}" for key in ("request_id", "run_id", "session_key", "device_id") if data.get(key)
    )
    return LogEntry(
        time=str(data.get("time", "")),
        level=str(data.get("level", "")),
        logger=str(data.get("logger", "")),
        process=str(data.get("process", "")),
        message=message,
        context=context,
        raw=line,
    )


def at_least(entry: LogEntry, level: str) -> bool:
    """Whether the entry is at ``level`` or above (lines without a level are shown only unfiltered)."""
    if not level:
        return True
    return logging.getLevelName(entry.level) >= logging.getLevelName(level) if entry.level in LEVELS else False
