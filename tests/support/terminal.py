"""A program in a pseudo-terminal for tests that drive a terminal UI: what it wrote, with its escape sequences
stripped, is searched for text; keys are written to it as a person types them. Standard library only.

    with PtyProgram([...], columns=120, rows=40) as tui:
        tui.wait_for("connected")                 # anywhere in what it wrote so far
        mark = tui.mark()
        tui.type("hello\\r")
        tui.wait_for(re.compile(r"hello"), since=mark)
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Mapping

# CSI (ESC [ … final byte), OSC (ESC ] … BEL or ST), other two-byte escapes, and the C0 controls a screen redraw
# uses besides newline.
ANSI_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b[@-Z\\-_]"
    r"|[\x00-\x08\x0b-\x1f\x7f]"
)


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE.sub("", text)


class PtyProgram:
    def __init__(
        self, argv: list[str], *, env: Mapping[str, str] | None = None, columns: int = 120, rows: int = 40
    ) -> None:
        self.argv = argv
        self.env = dict(env if env is not None else os.environ)
        self.size = (rows, columns)
        self.raw = bytearray()
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self.master = -1
        self.reader: threading.Thread | None = None

    def __enter__(self) -> PtyProgram:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", self.size[0], self.size[1], 0, 0))
        self.process = subprocess.Popen(
            self.argv,
            env={**self.env, "TERM": "xterm-256color", "COLUMNS": str(self.size[1]), "LINES": str(self.size[0])},
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            close_fds=True,
        )
        os.close(slave)
        self.master = master
        self.reader = threading.Thread(target=self._read, name="pty-reader", daemon=True)
        self.reader.start()
        return self

    def _read(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.master], [], [], 0.2)
                if not ready:
                    if self.process.poll() is not None:
                        return
                    continue
                chunk = os.read(self.master, 65536)
            except OSError:  # the program closed its end (EIO on Linux) or we closed ours
                return
            if not chunk:
                return
            with self.lock:
                self.raw.extend(chunk)

    def text(self, since: int = 0) -> str:
        """What it wrote after ``since`` (a ``mark()``), without escape sequences."""
        with self.lock:
            written = bytes(self.raw[since:])
        return strip_ansi(written.decode("utf-8", errors="replace"))

    def mark(self) -> int:
        with self.lock:
            return len(self.raw)

    def type(self, keys: str, *, per_key_s: float = 0.0) -> None:
        """Keys as typed: ``"\\r"`` is Enter, ``"\\x1b"`` Escape. With ``per_key_s`` one key at a time (a UI that
        reads a burst as a paste)."""
        if not per_key_s:
            os.write(self.master, keys.encode())
            return
        for key in keys:
            os.write(self.master, key.encode())
            time.sleep(per_key_s)

    def wait_for(self, expected: str | re.Pattern[str], *, since: int = 0, timeout: float = 20.0) -> str:
        """Until what it wrote after ``since`` holds ``expected``; the text so far. An AssertionError names what it
        showed instead when it does not come in time or the program exits."""
        deadline = time.monotonic() + timeout
        while True:
            shown = self.text(since)
            found = expected.search(shown) if isinstance(expected, re.Pattern) else expected in shown
            if found:
                return shown
            if time.monotonic() > deadline or (self.process.poll() is not None and not self.reader.is_alive()):
                raise AssertionError(f"{expected!r} not shown within {timeout:.0f} s; it showed:\n{shown[-3000:]}")
            time.sleep(0.1)

    def __exit__(self, *exc_info) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        if self.reader is not None:
            self.reader.join(5)
        os.close(self.master)
