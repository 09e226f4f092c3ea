"""The file tools: ``read``, ``write``, ``edit`` and ``ls``.

Each takes the workspace, the limits, the validated arguments and the call's cancel event (checked before
anything is written), and returns a :class:`ToolResult`; a refusal is raised as :class:`ToolCallError` (or
an ``OSError`` from the file system) for the runner to turn into the tool's error result.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

from .base import KIB, MIB, ToolCallError, ToolLimits, ToolResult, size_text
from .workspace import Workspace, name_key, printable

# A file whose first bytes hold a NUL is binary (as git and grep decide).
BINARY_SNIFF_BYTES = 8 * KIB
# ``edit`` reads the whole file and writes it back.
MAX_EDIT_FILE_BYTES = 8 * MIB
_READ_CHUNK = 64 * KIB


def is_binary(head: bytes) -> bool:
    return b"\x00" in head[:BINARY_SNIFF_BYTES]


def _bounded_lines(handle: BinaryIO, max_line_bytes: int) -> Iterator[tuple[bytes, int]]:
    """(the first ``max_line_bytes`` of each line, newline included, and the line's whole length): memory stays
    bounded by ``max_line_bytes`` however long a line is."""
    while piece := handle.readline(max_line_bytes + 1):
        if piece.endswith(b"\n") or len(piece) <= max_line_bytes:
            yield piece, len(piece)
            continue
        length = len(piece)
        rest = piece
        while not rest.endswith(b"\n") and (rest := handle.readline(_READ_CHUNK)):
            length += len(rest)
        yield piece[:max_line_bytes], length


def _with_note(text: str, note: str) -> str:
    return (text if text.endswith("\n") or not text else text + "\n") + "\n" + note


def _continue_note(offset: int, next_line: int, cap: str | None) -> str:
    """The note ending a read that stopped before the end: at a read limit (``cap``), or at the model's own."""
    if cap is None:
        return f"[More lines in file. Use offset={next_line} to continue.]"
    return f"[Showing lines {offset}-{next_line - 1} ({cap}). Use offset={next_line} to continue.]"


def read_file(
    workspace: Workspace, limits: ToolLimits, arguments: dict[str, Any], cancel: threading.Event | None
) -> ToolResult:
    real = workspace.resolve(arguments["path"])
    shown = workspace.display(real)
    offset: int = arguments.get("offset", 1)
    max_lines = min(arguments.get("limit", limits.read_max_lines), limits.read_max_lines)
    cap = size_text(limits.read_max_bytes)
    with os.fdopen(workspace.open_regular_file(real), "rb") as handle:
        if is_binary(handle.read(BINARY_SNIFF_BYTES)):
            raise ToolCallError(f"{shown} is a binary file; read shows text files only")
        handle.seek(0)
        shown_lines: list[bytes] = []
        used = 0
        number = 0
        note = ""
        for piece, length in _bounded_lines(handle, limits.read_max_bytes):
            number += 1
            if number < offset:
                continue
            if len(shown_lines) >= max_lines:
                capped = max_lines == limits.read_max_lines
                note = _continue_note(offset, number, f"read limit {max_lines} lines" if capped else None)
                break
            if used + length > limits.read_max_bytes:
                if shown_lines:
                    note = _continue_note(offset, number, f"read limit {cap}")
                else:
                    shown_lines.append(piece)
                    note = (
                        f"[Line {number} is {length} bytes, over the {cap} read limit; showing its first "
                        f"{cap}. Use exec (e.g. head -c or cut) for the rest of it, or offset={number + 1} "
                        "to go past it.]"
                    )
                break
            shown_lines.append(piece)
            used += length
    if offset > max(number, 1):
        raise ToolCallError(f"offset {offset} is beyond the end of {shown} ({number} lines)")
    text = b"".join(shown_lines).decode("utf-8", "replace")
    next_offset = offset + len(shown_lines) if note else None
    details = {"path": shown, "offset": offset, "lines": len(shown_lines), "nextOffset": next_offset}
    if number == 0:
        return ToolResult("(empty file)", False, details)
    return ToolResult(_with_note(text, note) if note else text, False, details)


def write_file(
    workspace: Workspace, limits: ToolLimits, arguments: dict[str, Any], cancel: threading.Event | None
) -> ToolResult:
    real = workspace.resolve(arguments["path"])
    data = arguments["content"].encode("utf-8")
    workspace.write_atomically(real, data, cancel)
    shown = workspace.display(real)
    return ToolResult(f"Wrote {len(data)} bytes to {shown}", False, {"path": shown, "bytes": len(data)})


def _occurrences(text: str, needle: str, stop_after: int = 1000) -> list[int]:
    """Where ``needle`` starts in ``text`` (overlapping matches included), up to ``stop_after`` places."""
    found: list[int] = []
    start = text.find(needle)
    while start != -1 and len(found) < stop_after:
        found.append(start)
        start = text.find(needle, start + 1)
    return found


def edit_file(
    workspace: Workspace, limits: ToolLimits, arguments: dict[str, Any], cancel: threading.Event | None
) -> ToolResult:
    """Exact replacements, each located in the original content; all apply or nothing is written.

    1. Read the file (a regular UTF-8 text file of at most 8 MiB).
    2. Locate every ``oldText``: exactly one occurrence each, spans not overlapping.
    3. Build the new content from the original and the spans, back to front.
    4. Write it atomically, unless the call was cancelled meanwhile.
    """
    real = workspace.resolve(arguments["path"])
    shown = workspace.display(real)
    with os.fdopen(workspace.open_regular_file(real), "rb") as handle:
        data = handle.read(MAX_EDIT_FILE_BYTES + 1)
    if len(data) > MAX_EDIT_FILE_BYTES:
        raise ToolCallError(f"{shown} is larger than {size_text(MAX_EDIT_FILE_BYTES)}; use write or exec to change it")
    if is_binary(data):
        raise ToolCallError(f"{shown} is a binary file; edit changes text files only")
    try:
        original = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolCallError(f"{shown} is not valid UTF-8 text; edit would corrupt it") from None

    spans: list[tuple[int, int, int]] = []
    for index, edit in enumerate(arguments["edits"]):
        places = _occurrences(original, edit["oldText"])
        if not places:
            raise ToolCallError(
                f"Could not find edits[{index}].oldText in {shown}. "
                "It must match exactly, including whitespace and line breaks."
            )
        if len(places) > 1:
            raise ToolCallError(
                f"Found {len(places)} occurrences of edits[{index}] in {shown}. "
                "Each oldText must be unique. Please provide more context to make it unique."
            )
        spans.append((places[0], places[0] + len(edit["oldText"]), index))
    spans.sort()
    for (_start, end, first), (start, _end, second) in itertools.pairwise(spans):
        if start < end:
            low, high = sorted((first, second))
            raise ToolCallError(f"edits[{low}] and edits[{high}] overlap in {shown}; merge them into one edit")

    updated = original
    for start, end, index in reversed(spans):
        updated = updated[:start] + arguments["edits"][index]["newText"] + updated[end:]
    if updated == original:
        raise ToolCallError(f"No changes made to {shown}: the replacements produce identical content")
    workspace.write_atomically(real, updated.encode("utf-8"), cancel)
    first_changed_line = original.count("\n", 0, spans[0][0]) + 1
    return ToolResult(
        f"Successfully replaced {len(spans)} block(s) in {shown}.",
        False,
        {"path": shown, "replacements": len(spans), "firstChangedLine": first_changed_line},
    )


def list_directory(
    workspace: Workspace, limits: ToolLimits, arguments: dict[str, Any], cancel: threading.Event | None
) -> ToolResult:
    real = workspace.resolve(arguments.get("path", "."))
    shown = workspace.display(real)
    limit = arguments.get("limit", limits.ls_limit)
    fd = workspace.open_directory(real)
    try:
        entries, complete = workspace.entries(fd, limits.walk_max_entries)
    finally:
        os.close(fd)
    after = arguments.get("after")
    if after:
        cursor = os.fsencode(after)
        entries = [entry for entry in entries if name_key(entry.name) > cursor]
    page = entries[:limit]
    lines = [printable(entry.name) + ("/" if entry.is_dir else "") for entry in page]
    next_after = printable(page[-1].name) if len(entries) > limit else None
    notes = []
    if next_after is not None:
        cursor_text = json.dumps(next_after, ensure_ascii=False)
        notes.append(f"[{len(entries) - limit} more entries. Use after={cursor_text} to continue.]")
    if not complete:
        notes.append(
            f"[{shown} has more than {limits.walk_max_entries} entries; only the first {limits.walk_max_entries} "
            "read are listed, in name order. Use find or exec to look further.]"
        )
    text = "\n".join(lines) if lines else ("(no more entries)" if after else "(empty directory)")
    details = {
        "path": shown,
        "entries": len(page),
        "nextAfter": next_after,
        "complete": complete,
    }
    return ToolResult(_with_note(text, "\n".join(notes)) if notes else text, False, details)
