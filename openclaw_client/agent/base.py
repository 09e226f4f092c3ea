"""What every tool module shares: the limits, the call and result shapes, the one error a malformed call raises."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

KIB = 1024
MIB = 1024 * KIB

ABORTED_TEXT = "Tool call aborted: the turn was stopped before it ran"


@dataclass(frozen=True)
class ToolLimits:
    """Every bound the tools apply; the gateway and the node host build one from their settings."""

    read_max_lines: int = 2000
    read_max_bytes: int = 50 * KIB
    # What the model sees of any one result; past it the text keeps its head and tail.
    result_max_bytes: int = 32 * KIB
    # How much of a truncated result is kept whole for the gateway to store as an artifact.
    artifact_max_bytes: int = 4 * MIB
    exec_timeout_s: float = 120.0
    exec_max_timeout_s: float = 1800.0
    # Between SIGTERM and SIGKILL of a timed-out command's process group.
    exec_kill_grace_s: float = 2.0
    exec_slot_wait_s: float = 30.0
    grep_limit: int = 100
    find_limit: int = 1000
    ls_limit: int = 500
    grep_line_max_chars: int = 500
    grep_max_file_bytes: int = 8 * MIB
    grep_max_scan_bytes: int = 64 * MIB
    # Directory entries one ls, find or grep looks at, so a hostile tree cannot stall a call.
    walk_max_entries: int = 100_000

    def __post_init__(self) -> None:
        for item in fields(self):
            if getattr(self, item.name) <= 0:
                raise ValueError(f"ToolLimits.{item.name} must be positive")
        if self.exec_timeout_s > self.exec_max_timeout_s:
            raise ValueError("ToolLimits.exec_timeout_s must not exceed exec_max_timeout_s")
        if self.artifact_max_bytes < self.result_max_bytes:
            raise ValueError("ToolLimits.artifact_max_bytes must be at least result_max_bytes")


class ToolCallError(Exception):
    """A call the tools refuse before doing anything: ``message`` is one line for the model."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class PreparedCall:
    """A call whose arguments passed its tool's schema (normalized: integral numbers are ints)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ExecRequest:
    """What an ``exec`` would run: what an approval shows and binds."""

    command: str
    workdir: str
    env_keys: tuple[str, ...]
    timeout_s: float


@dataclass
class ToolResult:
    """A tool's answer. ``text`` is what the model is sent; ``full_text`` is the whole output (up to
    ``ToolLimits.artifact_max_bytes``) and is set only when ``text`` had to be cut."""

    text: str
    is_error: bool
    details: dict[str, Any] = field(default_factory=dict)
    full_text: str | None = None


def size_text(size: int) -> str:
    """A byte count as a person says it: ``50 KiB``, ``8 MiB``, ``100 bytes``."""
    for unit, name in ((MIB, "MiB"), (KIB, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} bytes"


def aborted_result(text: str = ABORTED_TEXT, **details: Any) -> ToolResult:
    return ToolResult(text=text, is_error=True, details={**details, "aborted": True})


def quoted(value: str, max_chars: int = 200) -> str:
    """A model-supplied string inside a message: quoted, escaped, and short."""
    shown = value if len(value) <= max_chars else value[:max_chars] + "…"
    # A lone surrogate (a model can send one as JSON "\ud800") would make the message unencodable.
    return json.dumps(shown.encode("utf-8", "backslashreplace").decode("utf-8"), ensure_ascii=False)


def omitted_marker(omitted_bytes: int) -> str:
    return f"\n…[{omitted_bytes} bytes omitted]…\n"


def head_and_tail(text: str, max_bytes: int) -> tuple[str, bool]:
    """``text`` cut to about ``max_bytes`` UTF-8 bytes: its first and last halves around a marker saying how
    much is missing (the end of an output, where errors and continuation notes are, survives).
    Returns (text, whether it was cut)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text, False
    head = data[: max_bytes // 2].decode("utf-8", "ignore")
    tail = data[len(data) - (max_bytes - max_bytes // 2) :].decode("utf-8", "ignore")
    omitted = len(data) - len(head.encode("utf-8", "replace")) - len(tail.encode("utf-8", "replace"))
    return head + omitted_marker(omitted) + tail, True


def bounded(text: str, max_bytes: int) -> str:
    """The first ``max_bytes`` UTF-8 bytes of ``text`` (the artifact copy of an output)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", "ignore") + f"\n…[{len(data) - max_bytes} more bytes not kept]"


def capped_result(result: ToolResult, limits: ToolLimits) -> ToolResult:
    """``result`` with its text within ``limits.result_max_bytes``, the whole text kept in ``full_text``."""
    text, cut = head_and_tail(result.text, limits.result_max_bytes)
    if not cut:
        return result
    details = {**result.details, "truncated": True}
    return ToolResult(text, result.is_error, details, full_text=bounded(result.text, limits.artifact_max_bytes))


def display_path(root: Path, path: Path) -> str:
    """``path`` (resolved, inside ``root``) as the model names it: relative to the workspace, ``.`` for the root."""
    return path.relative_to(root).as_posix() if path != root else "."
