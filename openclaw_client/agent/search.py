"""The search tools: ``find`` (names by glob) and ``grep`` (contents by regular expression).

Both walk the workspace without following symlinks and skip ``.git``; both are bounded however hostile
the tree is: the directory entries looked at (``ToolLimits.walk_max_entries``), and for ``grep`` the size
of one file and the bytes read in one call. Paths in results are relative to the directory searched.

Python's ``re`` has no time limit: a pathological pattern on one long line can still take long (the
walk and the byte bounds do not help there); ``cancel`` is checked between files.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from .base import ToolCallError, ToolLimits, ToolResult, aborted_result, quoted, size_text
from .files import BINARY_SNIFF_BYTES, is_binary
from .schema import MAX_GREP_LIMIT, MAX_PAGE_LIMIT
from .workspace import WalkBudget, WalkItem, Workspace, printable


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob as a regular expression: ``*`` and ``?`` stay within one path segment, ``**`` spans
    directories (``**/`` also matches none), ``[abc]`` / ``[!abc]`` are classes and ``{a,b}`` alternatives."""
    try:
        return re.compile(_glob_body(pattern) + r"\Z", re.DOTALL)
    except re.error as error:
        raise ToolCallError(f"invalid glob {quoted(pattern)}: {error}") from None


def _glob_body(pattern: str) -> str:
    out: list[str] = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
            continue
        if pattern.startswith("**", index):
            out.append(".*")
            index += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and (close := pattern.find("]", index + 2)) != -1:
            body = pattern[index + 1 : close]
            negated = body[:1] in ("!", "^")
            body = body[1:] if negated else body
            out.append("[" + ("^/" if negated else "") + body.replace("\\", "\\\\") + "]")
            index = close + 1
            continue
        elif char == "{" and (close := pattern.find("}", index)) != -1:
            alternatives = pattern[index + 1 : close].split(",")
            out.append("(?:" + "|".join(_glob_body(alternative) for alternative in alternatives) + ")")
            index = close + 1
            continue
        else:
            out.append(re.escape(char))
        index += 1
    return "".join(out)


def _glob_matcher(pattern: str) -> tuple[re.Pattern[str], bool]:
    """The regex of ``pattern`` and whether it matches whole relative paths (a ``/`` in it) or names."""
    pattern = pattern.removeprefix("./")
    return glob_regex(pattern), "/" in pattern


def _walk_notes(budget: WalkBudget, limits: ToolLimits) -> list[str]:
    notes = []
    if budget.exhausted:
        notes.append(f"[Stopped after looking at {limits.walk_max_entries} directory entries; search a narrower path.]")
    if budget.too_deep:
        notes.append("[Some directories are nested too deeply and were not searched.]")
    return notes


def _joined(lines: list[str], notes: list[str]) -> str:
    return "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "")


def find_files(
    workspace: Workspace, limits: ToolLimits, arguments: dict[str, Any], cancel: threading.Event | None
) -> ToolResult:
    start = workspace.resolve(arguments.get("path", "."))
    shown = workspace.display(start)
    limit = arguments.get("limit", limits.find_limit)
    regex, whole_path = _glob_matcher(arguments["pattern"])
    budget = WalkBudget(limits.walk_max_entries)
    found: list[str] = []
    with contextlib.closing(workspace.walk(start, budget, cancel)) as items:
        for item in items:
            if regex.match(item.path if whole_path else item.entry.name):
                found.append(printable(item.path) + ("/" if item.entry.is_dir else ""))
    if cancel is not None and cancel.is_set():
        return aborted_result()
    found.sort(key=lambda path: path.encode("utf-8"))
    notes = []
    if len(found) > limit:
        more = f" Use limit={min(limit * 2, MAX_PAGE_LIMIT)} for more," if limit < MAX_PAGE_LIMIT else ""
        notes.append(f"[{len(found) - limit} more results not shown.{more} or refine the pattern.]")
    notes += _walk_notes(budget, limits)
    details = {"path": shown, "matches": min(len(found), limit), "truncated": len(found) > limit}
    if not found:
        return ToolResult(_joined([f"No files found matching {quoted(arguments['pattern'])}"], notes), False, details)
    return ToolResult(_joined(found[:limit], notes), False, details)


@dataclass
class _GrepScan:
    """What one grep call has read and found so far."""

    limits: ToolLimits
    regex: re.Pattern[str]
    context: int
    limit: int
    lines: list[str] = field(default_factory=list)
    matches: int = 0
    bytes_scanned: int = 0
    files_scanned: int = 0
    too_large: int = 0
    out_of_bytes: bool = False

    @property
    def full(self) -> bool:
        return self.matches >= self.limit or self.out_of_bytes

    def scan(self, fd: int, shown: str) -> None:
        with os.fdopen(fd, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > self.limits.grep_max_file_bytes:
                self.too_large += 1
                return
            if self.bytes_scanned + size > self.limits.grep_max_scan_bytes:
                self.out_of_bytes = True
                return
            data = handle.read(self.limits.grep_max_file_bytes + 1)
        self.bytes_scanned += len(data)
        self.files_scanned += 1
        if len(data) > self.limits.grep_max_file_bytes:
            # It grew after the size was read.
            self.too_large += 1
            return
        if is_binary(data[:BINARY_SNIFF_BYTES]):
            return
        self._collect(data.decode("utf-8", "replace").split("\n"), shown)

    def _collect(self, lines: list[str], shown: str) -> None:
        lines = [line.removesuffix("\r") for line in lines]
        if lines and lines[-1] == "":
            lines.pop()
        hits = []
        for number, line in enumerate(lines):
            if self.regex.search(line):
                hits.append(number)
                if self.matches + len(hits) >= self.limit:
                    break
        if not hits:
            return
        self.matches += len(hits)
        selected = sorted(
            {
                near
                for hit in hits
                for near in range(max(hit - self.context, 0), min(hit + self.context + 1, len(lines)))
            }
        )
        hit_set = set(hits)
        previous = None
        for number in selected:
            if self.context and previous is not None and number > previous + 1:
                self.lines.append("--")
            separator = ":" if number in hit_set else "-"
            self.lines.append(f"{shown}{separator}{number + 1}{separator} {self._cut(lines[number])}")
            previous = number

    def _cut(self, line: str) -> str:
        limit = self.limits.grep_line_max_chars
        return line if len(line) <= limit else line[:limit] + f"… [{len(line) - limit} more characters]"


def grep_files(
    workspace: Workspace, limits: ToolLimits, arguments: dict[str, Any], cancel: threading.Event | None
) -> ToolResult:
    pattern = arguments["pattern"]
    flags = re.IGNORECASE if arguments.get("ignoreCase") else 0
    try:
        regex = re.compile(re.escape(pattern) if arguments.get("literal") else pattern, flags)
    except re.error as error:
        raise ToolCallError(f"invalid regular expression {quoted(pattern)}: {error}") from None
    file_filter = _glob_matcher(arguments["glob"]) if "glob" in arguments else None
    limit = arguments.get("limit", limits.grep_limit)
    scan = _GrepScan(limits, regex, arguments.get("context", 0), limit)
    start = workspace.resolve(arguments.get("path", "."))
    budget = WalkBudget(limits.walk_max_entries)
    if workspace.is_directory(start):
        with contextlib.closing(workspace.walk(start, budget, cancel)) as items:
            for item in items:
                if scan.full:
                    break
                if item.entry.is_file and _wanted(item, file_filter):
                    fd = workspace.open_entry_file(item)
                    if fd is not None:
                        scan.scan(fd, printable(item.path))
    else:
        scan.scan(workspace.open_regular_file(start), workspace.display(start))
    if cancel is not None and cancel.is_set():
        return aborted_result()

    notes = []
    if scan.matches >= limit:
        more = f" Use limit={min(limit * 2, MAX_GREP_LIMIT)} for more," if limit < MAX_GREP_LIMIT else ""
        notes.append(f"[{limit} matches limit reached.{more} or refine the pattern.]")
    if scan.too_large:
        notes.append(f"[{scan.too_large} file(s) over {size_text(limits.grep_max_file_bytes)} skipped.]")
    if scan.out_of_bytes:
        notes.append(
            f"[Stopped after reading {size_text(limits.grep_max_scan_bytes)}; search a narrower path or glob.]"
        )
    notes += _walk_notes(budget, limits)
    details = {
        "path": workspace.display(start),
        "matches": scan.matches,
        "filesScanned": scan.files_scanned,
        "bytesScanned": scan.bytes_scanned,
        "truncated": bool(notes),
    }
    return ToolResult(_joined(scan.lines or ["No matches found"], notes), False, details)


def _wanted(item: WalkItem, file_filter: tuple[re.Pattern[str], bool] | None) -> bool:
    if file_filter is None:
        return True
    regex, whole_path = file_filter
    return regex.match(item.path if whole_path else item.entry.name) is not None
