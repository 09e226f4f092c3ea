"""The gateway's log file: JSON lines, rotated by size, shared safely by every process of one state directory.

``RotatingFileHandler`` assumes one writer: two processes rotating the same file rename each other's fresh file
away and keep writing into backups. Here every process appends (``O_APPEND``: each record is one ``write`` at the
end), the one that finds the file full rotates it under an exclusive ``flock`` after checking again that nobody
rotated it meanwhile, and every process notices the rename on its next record (``WatchedFileHandler`` compares
the path's inode with its open file's) and reopens. ``logrotate`` may rotate the file instead (``copytruncate``
is not needed: a rename is noticed the same way).
"""

from __future__ import annotations

import fcntl
import logging
import logging.handlers
import os
from pathlib import Path


def backup_path(path: Path, number: int) -> Path:
    return path.with_name(f"{path.name}.{number}")


class SharedRotatingFileHandler(logging.handlers.WatchedFileHandler):
    def __init__(self, filename: str, max_bytes: int, backup_count: int, encoding: str = "utf-8") -> None:
        Path(filename).parent.mkdir(parents=True, exist_ok=True)
        super().__init__(filename, mode="a", encoding=encoding, delay=True)
        self.max_bytes = max_bytes
        self.backup_count = backup_count
        self.lock_path = f"{self.baseFilename}.lock"

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.reopenIfNeeded()
            if self.max_bytes > 0 and self._open_file_size() >= self.max_bytes:
                self.rotate()
                self.reopenIfNeeded()
        except OSError:
            self.handleError(record)
            return
        # WatchedFileHandler.emit would check the inode a second time.
        logging.FileHandler.emit(self, record)

    def _open_file_size(self) -> int:
        if self.stream is None:
            return self._file_size()
        return os.fstat(self.stream.fileno()).st_size

    def _file_size(self) -> int:
        try:
            return os.stat(self.baseFilename).st_size
        except FileNotFoundError:
            return 0

    def rotate(self) -> None:
        """Rename ``gateway.log`` → ``.1`` → ``.2`` … (the oldest backup is dropped), once across processes."""
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                # Another process may have rotated it while this one waited for the lock.
                if self._file_size() < self.max_bytes:
                    return
                path = Path(self.baseFilename)
                for number in range(self.backup_count - 1, 0, -1):
                    older = backup_path(path, number)
                    if older.exists():
                        os.replace(older, backup_path(path, number + 1))
                if self.backup_count > 0:
                    os.replace(path, backup_path(path, 1))
                else:
                    path.unlink(missing_ok=True)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        # WatchedFileHandler.emit reopens: the path's inode is no longer the open file's.
