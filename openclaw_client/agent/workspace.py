"""The workspace the tools are confined to: path resolution, and opening files and directories inside it.

Every path a model names is resolved with ``os.path.realpath`` (symlinks followed, ``..`` applied) and must
land inside the root, which is itself resolved once. What the tools then open is opened again from the
root one component at a time with ``O_NOFOLLOW`` (``openat``), so a symlink swapped in after the check — by
a command the model runs at the same time — makes the call fail instead of leaving the workspace. Only
regular files are read or written and only directories are listed or walked; devices, FIFOs and sockets
are refused, and opened with ``O_NONBLOCK`` so that a FIFO swapped in cannot block a call.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .base import ToolCallError, display_path, quoted

MAX_PATH_BYTES = 4096
# Directories deeper than this below a walk's start are not entered (each level holds an open descriptor).
MAX_WALK_DEPTH = 64
SKIPPED_DIRECTORY = ".git"

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class CallAborted(Exception):
    """The call's cancel event was set before it changed anything."""


def printable(name: str) -> str:
    """A file name as text for the model: bytes that are not UTF-8 become U+FFFD."""
    return os.fsencode(name).decode("utf-8", "replace")


def name_key(name: str) -> bytes:
    """Sort key of a file name: its bytes, so listings are in bytewise order."""
    return os.fsencode(name)


@dataclass(frozen=True)
class Entry:
    """One directory entry, classified without following symlinks."""

    name: str
    is_dir: bool
    is_file: bool


class Workspace:
    def __init__(self, root: str | Path):
        resolved = Path(root).resolve(strict=True)
        if not resolved.is_dir():
            raise NotADirectoryError(f"workspace root is not a directory: {root}")
        self.root = resolved

    # --- resolution --------------------------------------------------------------------------------------

    def resolve(self, path: str, *, what: str = "path") -> Path:
        """The real path ``path`` names (relative to the root, or absolute inside it); raises
        :class:`ToolCallError` when it is malformed or resolves outside the workspace."""
        if "\x00" in path:
            raise ToolCallError(f"{what} contains a NUL byte")
        try:
            encoded = os.fsencode(path)
        except UnicodeEncodeError:
            raise ToolCallError(f"{what} is not valid Unicode text") from None
        if len(encoded) > MAX_PATH_BYTES:
            raise ToolCallError(f"{what} is longer than {MAX_PATH_BYTES} bytes")
        candidate = os.path.join(self.root, path)
        real = os.path.realpath(candidate)
        if self.contains(real):
            return Path(real)
        if self.contains(os.path.normpath(candidate)):
            raise ToolCallError(f"{what} {quoted(path)} leads outside the workspace through a symbolic link")
        raise ToolCallError(f"{what} {quoted(path)} is outside the workspace")

    def contains(self, path: str) -> bool:
        root = str(self.root)
        return path == root or path.startswith(root.rstrip("/") + "/")

    def display(self, path: Path) -> str:
        return printable(display_path(self.root, path))

    def _components(self, real: Path) -> tuple[str, ...]:
        return real.relative_to(self.root).parts if real != self.root else ()

    # --- opening ----------------------------------------------------------------------------------------

    def open_directory(self, real: Path, *, create: bool = False) -> int:
        """A descriptor of the directory ``real`` (resolved, inside the root), opened from the root without
        following any symlink; with ``create``, missing directories are made on the way."""
        fd = os.open(self.root, _DIRECTORY_FLAGS)
        parts = self._components(real)
        try:
            for depth, part in enumerate(parts, start=1):
                try:
                    child = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=fd)
                    child = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
                except OSError as error:
                    raise self._refusal(error, real, fd, part, last=depth == len(parts)) from None
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _refusal(self, error: OSError, real: Path, parent_fd: int, name: str, *, last: bool) -> OSError | ToolCallError:
        """What to tell the model when opening ``name`` (a component of ``real``) without following links failed.

        ``real`` has no symlink in it (it was resolved), so a symlink found now was put there since: Linux
        answers ``ELOOP`` for it, or ``ENOTDIR`` when a directory was asked for."""
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                swapped = stat.S_ISLNK(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode)
            except OSError:
                swapped = False
            if swapped or error.errno == errno.ELOOP:
                return ToolCallError(f"{self.display(real)} changed while in use (a symbolic link appeared); try again")
            if last:
                return ToolCallError(f"{self.display(real)} is not a directory")
            return ToolCallError(f"{self.display(real)}: a component of the path is not a directory")
        return error

    def open_regular_file(self, real: Path) -> int:
        """A read-only descriptor of the regular file ``real``; anything else is refused."""
        if real == self.root:
            raise ToolCallError(". is a directory, not a file")
        parent = self.open_directory(real.parent)
        try:
            self.require_regular(os.stat(real.name, dir_fd=parent, follow_symlinks=False), real)
            try:
                fd = os.open(real.name, _READ_FLAGS, dir_fd=parent)
            except OSError as error:
                raise self._refusal(error, real, parent, real.name, last=True) from None
        finally:
            os.close(parent)
        try:
            # The entry may have been replaced between the stat and the open.
            self.require_regular(os.fstat(fd), real)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def require_regular(self, status: os.stat_result, real: Path) -> None:
        mode = status.st_mode
        if stat.S_ISREG(mode):
            return
        if stat.S_ISDIR(mode):
            raise ToolCallError(f"{self.display(real)} is a directory, not a file")
        if stat.S_ISLNK(mode):
            raise ToolCallError(f"{self.display(real)} changed while in use (a symbolic link appeared); try again")
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a device file"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file"
        )
        raise ToolCallError(f"{self.display(real)} is {kind}; only regular files can be read or written")

    def is_directory(self, real: Path) -> bool:
        try:
            os.close(self.open_directory(real))
        except (OSError, ToolCallError):
            return False
        return True

    # --- writing ----------------------------------------------------------------------------------------

    def write_atomically(self, real: Path, data: bytes, cancel: threading.Event | None = None) -> None:
        """Replace (or create) the regular file ``real`` with ``data`` all at once: a temporary file in the
        same directory, renamed over it. An existing file's permission bits are kept. Nothing is changed
        when ``cancel`` is set before the rename."""
        if real == self.root:
            raise ToolCallError(". is a directory, not a file")
        if cancel is not None and cancel.is_set():
            raise CallAborted()
        parent = self.open_directory(real.parent, create=True)
        temporary = f".{uuid.uuid4().hex}.openclaw-tmp"
        try:
            try:
                existing = os.stat(real.name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                mode = None
            else:
                self.require_regular(existing, real)
                mode = stat.S_IMODE(existing.st_mode)
            fd = os.open(temporary, _CREATE_FLAGS, 0o666 if mode is None else 0o600, dir_fd=parent)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if mode is not None:
                    os.fchmod(fd, mode)
            finally:
                os.close(fd)
            if cancel is not None and cancel.is_set():
                raise CallAborted()
            # rename() replaces the directory entry itself: a symlink swapped in meanwhile is not followed.
            os.replace(temporary, real.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=parent)
            raise
        finally:
            os.close(parent)

    # --- listing and walking ----------------------------------------------------------------------------

    def entries(self, directory_fd: int, max_entries: int) -> tuple[list[Entry], bool]:
        """The entries of an open directory sorted by name (bytewise), and whether all were read (at most
        ``max_entries`` are)."""
        found: list[Entry] = []
        complete = True
        with os.scandir(directory_fd) as scan:
            for item in scan:
                if len(found) >= max_entries:
                    complete = False
                    break
                try:
                    is_dir = item.is_dir(follow_symlinks=False)
                    is_file = item.is_file(follow_symlinks=False)
                except OSError:
                    # Gone since the directory was read.
                    continue
                found.append(Entry(item.name, is_dir, is_file))
        found.sort(key=lambda entry: name_key(entry.name))
        return found, complete

    def walk(self, start: Path, budget: WalkBudget, cancel: threading.Event | None = None) -> Iterator[WalkItem]:
        """Every entry below the directory ``start``, depth first in name order, without following symlinks
        and without entering ``.git``. Once ``budget`` is spent no further directory is read (the entries
        already read are still yielded); stops when ``cancel`` is set. Close the iterator when leaving early."""
        top = self.open_directory(start)
        stack: list[tuple[int, str, Iterator[Entry]]] = [(top, "", iter(()))]
        try:
            entries, complete = self.entries(top, budget.remaining_entries())
            budget.spend_entries(len(entries), complete)
            stack[0] = (top, "", iter(entries))
            while stack and not (cancel is not None and cancel.is_set()):
                fd, prefix, pending = stack[-1]
                entry = next(pending, None)
                if entry is None:
                    os.close(stack.pop()[0])
                    continue
                if entry.is_dir and entry.name == SKIPPED_DIRECTORY:
                    continue
                relative = prefix + entry.name
                yield WalkItem(relative, entry, fd)
                if not entry.is_dir or budget.exhausted:
                    continue
                if len(stack) > MAX_WALK_DEPTH:
                    budget.too_deep = True
                    continue
                try:
                    child = os.open(entry.name, _DIRECTORY_FLAGS, dir_fd=fd)
                except OSError:
                    # Replaced, removed or unreadable since it was listed: not part of this walk.
                    continue
                try:
                    entries, complete = self.entries(child, budget.remaining_entries())
                except OSError:
                    os.close(child)
                    continue
                budget.spend_entries(len(entries), complete)
                stack.append((child, relative + "/", iter(entries)))
        finally:
            for fd, _prefix, _pending in stack:
                os.close(fd)

    def open_entry_file(self, item: WalkItem) -> int | None:
        """A read-only descriptor of a walked regular file, or None when it is no longer one."""
        try:
            fd = os.open(item.entry.name, _READ_FLAGS, dir_fd=item.directory_fd)
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd


@dataclass(frozen=True)
class WalkItem:
    path: str
    entry: Entry
    # The open directory holding the entry; valid only until the walk moves on.
    directory_fd: int


class WalkBudget:
    """How many directory entries one walk may look at; records why a walk stopped short."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self.seen = 0
        self.exhausted = False
        self.too_deep = False

    def remaining_entries(self) -> int:
        return max(self.max_entries - self.seen, 0)

    def spend_entries(self, count: int, complete: bool) -> None:
        self.seen += count
        if not complete:
            self.exhausted = True
