"""The ``exec`` tool: one shell command in its own process group, bounded in time, output and numbers.

* Environment: built from :data:`INHERITED_ENV` only (never the caller's whole environment: the gateway's
  token, a node's device key, database and Redis URLs stay out), ``TERM=dumb``, plus the model's ``env``
  minus the keys that change how programs are found or loaded (:func:`env_problem`).
* Process: ``/bin/sh -c`` as the leader of a new session (so of a new process group), stdin ``/dev/null``,
  stdout and stderr through one pipe.
* Time: past the timeout the group gets SIGTERM, then SIGKILL after ``exec_kill_grace_s``. A cancel kills
  it at once. When the shell exits, whatever it left in its group (a background job, a daemon that kept
  the group) is killed; the pipe is then drained for at most :data:`DRAIN_AFTER_EXIT_S`, so a process that
  left the group (``setsid``) and holds the pipe cannot hold the call. Such a process keeps running: only
  a cgroup or a container could reach it.
* Output: the model's text keeps the first and last halves of ``result_max_bytes`` around a marker; up to
  ``artifact_max_bytes`` of the whole output is kept in ``ToolResult.full_text``; the rest is read, counted
  and dropped.
* Hosts: :class:`ExecSlots` bounds the commands running at once on one host, across processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .base import ExecRequest, ToolLimits, ToolResult, omitted_marker, quoted

SHELL = "/bin/sh"
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Keys that decide which program runs or what code it loads before the command's own: an approval shows
# the command and the env keys, and these would make the approved command something else.
REFUSED_ENV_KEYS = frozenset({"PATH", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "IFS", "PS4", "GCONV_PATH"})
REFUSED_ENV_PREFIXES = ("LD_", "DYLD_")
POLL_INTERVAL_S = 0.05
DRAIN_AFTER_EXIT_S = 1.0
SLOT_POLL_INTERVAL_S = 0.1
_READ_CHUNK = 64 * 1024


def env_problem(key: str, value: str) -> str | None:
    """Why the model's ``env`` entry ``key=value`` is refused, or None."""
    if not ENV_NAME.fullmatch(key):
        return f"env key {quoted(key)} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"
    if key.upper() in REFUSED_ENV_KEYS or key.upper().startswith(REFUSED_ENV_PREFIXES):
        return f"env key {quoted(key)} may not be set (it changes which programs run or what they load)"
    if "\x00" in value:
        return f"env value of {quoted(key)} contains a NUL byte"
    return None


def command_env(overrides: Mapping[str, str], source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's environment: the allowlisted keys of ``source`` (the process's own environment),
    ``TERM=dumb`` and the (already checked) ``overrides``."""
    source = os.environ if source is None else source
    env = {key: source[key] for key in INHERITED_ENV if key in source}
    env.setdefault("PATH", DEFAULT_PATH)
    env["TERM"] = "dumb"
    env.update(overrides)
    return env


# --- output -------------------------------------------------------------------------------------------------


class OutputCapture:
    """A command's output, bounded: the start (up to the artifact cap) and the last half of the model's share."""

    def __init__(self, text_max_bytes: int, artifact_max_bytes: int):
        self.text_max_bytes = text_max_bytes
        self.artifact_max_bytes = artifact_max_bytes
        self.tail_bytes = text_max_bytes - text_max_bytes // 2
        self.kept = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.artifact_max_bytes - len(self.kept)
        if room > 0:
            self.kept += data[:room]
        self.tail += data[-self.tail_bytes :]
        if len(self.tail) > 2 * self.tail_bytes:
            del self.tail[: -self.tail_bytes]

    @property
    def truncated(self) -> bool:
        return self.total > self.text_max_bytes

    def text(self) -> str:
        """What the model sees: everything, or the first and last halves around a marker."""
        if not self.truncated:
            return bytes(self.kept).decode("utf-8", "replace")
        head = bytes(self.kept[: self.text_max_bytes // 2])
        tail = bytes(self.tail[-self.tail_bytes :])
        return (
            head.decode("utf-8", "replace")
            + omitted_marker(self.total - len(head) - len(tail))
            + tail.decode("utf-8", "replace")
        )

    def full_text(self) -> str | None:
        """The whole output up to the artifact cap, when the model's text is cut."""
        if not self.truncated:
            return None
        text = bytes(self.kept).decode("utf-8", "replace")
        if self.total > len(self.kept):
            text += f"\n…[{self.total - len(self.kept)} more bytes not kept]"
        return text


# --- running ------------------------------------------------------------------------------------------------


@dataclass
class CommandOutcome:
    capture: OutputCapture
    exit_code: int | None = None
    timed_out: bool = False
    aborted: bool = False
    start_error: str | None = None
    duration_ms: int = 0
    notes: list[str] = field(default_factory=list)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _has_exited(pid: int) -> bool:
    """Whether the shell has exited, without reaping it: while it is an unreaped zombie its pid, which is
    its group's id, cannot be reused, so signalling the group cannot reach anyone else."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


EXITED = object()


def _exit_descriptor(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (Linux's pidfd), or None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def run_command(
    request: ExecRequest, env: dict[str, str], limits: ToolLimits, cancel: threading.Event | None
) -> CommandOutcome:
    """Run ``request`` to its end, its timeout or ``cancel``.

    1. Start ``/bin/sh -c`` as a session leader, output to one pipe.
    2. Until the shell exits: read what comes; on cancel SIGKILL the group; at the deadline SIGTERM it,
       and SIGKILL it ``exec_kill_grace_s`` later.
    3. SIGKILL the group (what the shell left behind), reap the shell.
    4. Drain the pipe until EOF or :data:`DRAIN_AFTER_EXIT_S`.
    """
    capture = OutputCapture(limits.result_max_bytes, limits.artifact_max_bytes)
    if "\0" in request.command:
        # An argument cannot hold one (Popen would raise ValueError, and the turn would fail with it).
        return CommandOutcome(capture, start_error="Command could not start: the command contains a NUL byte")
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            [SHELL, "-c", request.command],
            cwd=request.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as error:
        return CommandOutcome(capture, start_error=f"Command could not start: {error.strerror or error}")
    assert process.stdout is not None
    pipe = process.stdout.fileno()
    os.set_blocking(pipe, False)
    outcome = CommandOutcome(capture)
    deadline = started + request.timeout_s
    kill_at: float | None = None
    exit_fd = _exit_descriptor(process.pid)
    with selectors.DefaultSelector() as selector:
        selector.register(pipe, selectors.EVENT_READ)
        if exit_fd is not None:
            # The shell's exit wakes the wait at once (a quick command does not sit out a poll interval).
            selector.register(exit_fd, selectors.EVENT_READ, EXITED)
        try:
            while not _has_exited(process.pid):
                _read_ready(selector, capture, POLL_INTERVAL_S)
                now = time.monotonic()
                if cancel is not None and cancel.is_set() and not outcome.aborted:
                    outcome.aborted = True
                    _signal_group(process.pid, signal.SIGKILL)
                elif now >= deadline and not outcome.timed_out and not outcome.aborted:
                    outcome.timed_out = True
                    _signal_group(process.pid, signal.SIGTERM)
                    kill_at = now + limits.exec_kill_grace_s
                if kill_at is not None and now >= kill_at:
                    _signal_group(process.pid, signal.SIGKILL)
                    kill_at = None
        finally:
            _signal_group(process.pid, signal.SIGKILL)
            outcome.exit_code = process.wait()
            if exit_fd is not None:
                selector.unregister(exit_fd)
                os.close(exit_fd)
        drain_until = time.monotonic() + DRAIN_AFTER_EXIT_S
        while selector.get_map() and time.monotonic() < drain_until:
            _read_ready(selector, capture, max(drain_until - time.monotonic(), 0))
        if selector.get_map():
            outcome.notes.append("(A process that left the command's process group still holds its output open.)")
    process.stdout.close()
    outcome.duration_ms = int((time.monotonic() - started) * 1000)
    return outcome


def _read_ready(selector: selectors.BaseSelector, capture: OutputCapture, timeout: float) -> None:
    """Read what the pipe holds (waiting at most ``timeout`` for something); unregister it at EOF."""
    if not selector.get_map():
        time.sleep(timeout)
        return
    for key, _events in selector.select(timeout):
        if key.data is EXITED:
            continue  # the loop sees the exit itself (without reaping the shell)
        while True:
            try:
                data = os.read(key.fd, _READ_CHUNK)
            except BlockingIOError:
                break
            if not data:
                selector.unregister(key.fd)
                break
            capture.feed(data)


def exec_result(request: ExecRequest, outcome: CommandOutcome) -> ToolResult:
    capture = outcome.capture
    details = {
        "exitCode": outcome.exit_code,
        "durationMs": outcome.duration_ms,
        "timedOut": outcome.timed_out,
        "truncated": capture.truncated,
        "outputBytes": capture.total,
        "cwd": request.workdir,
    }
    if outcome.start_error is not None:
        return ToolResult(outcome.start_error, True, details)
    output = capture.text()
    if outcome.aborted:
        text = "Command aborted: the turn was stopped while it ran" + (
            f"; its output so far:\n{output}" if output else ""
        )
        return ToolResult(text, True, {**details, "aborted": True}, capture.full_text())
    status = []
    if outcome.timed_out:
        status.append(f"(Command timed out after {request.timeout_s:g} seconds and was killed)")
    elif outcome.exit_code is not None and outcome.exit_code < 0:
        status.append(f"(Command terminated by {_signal_name(-outcome.exit_code)})")
    elif outcome.exit_code:
        status.append(f"(Command exited with code {outcome.exit_code})")
    status += outcome.notes
    text = output or ("(no output)" if not status else "")
    if status:
        # One blank line between the output and the status, whether or not the output ended its line.
        text = (text + ("\n" if text.endswith("\n") else "\n\n") if text else "") + "\n".join(status)
    is_error = outcome.timed_out or outcome.exit_code != 0
    return ToolResult(text, is_error, details, capture.full_text())


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# --- host slots ----------------------------------------------------------------------------------------------


class ExecSlotsBusy(Exception):
    """No slot came free in time (or the wait was cancelled); ``message`` is for the model."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ExecSlots:
    """At most ``count`` commands at once per host: ``count`` lock files in ``directory``, each held with
    ``flock`` by the command using it. Processes sharing the directory share the bound (the gateway's
    threads, the worker children of a node host); a holder that dies releases its slot with its descriptor.
    The descriptor is close-on-exec, so the command itself (and what it leaves behind) never holds it."""

    def __init__(self, directory: Path, count: int):
        if count < 1:
            raise ValueError("ExecSlots count must be at least 1")
        self.directory = Path(directory)
        self.count = count
        self.directory.mkdir(parents=True, exist_ok=True)

    def _try_each(self) -> int | None:
        for index in range(self.count):
            fd = os.open(self.directory / f"slot-{index}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        return None

    @contextlib.contextmanager
    def acquire(self, wait_s: float = 30.0, cancel: threading.Event | None = None) -> Iterator[None]:
        """Hold a slot for the ``with`` block; raises :class:`ExecSlotsBusy` when none is free within ``wait_s``
        or ``cancel`` is set while waiting."""
        deadline = time.monotonic() + wait_s
        while (fd := self._try_each()) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ExecSlotsBusy(f"too many commands running on this host (limit {self.count}); try again later")
            pause = min(SLOT_POLL_INTERVAL_S, remaining)
            if cancel is not None and cancel.wait(pause):
                raise ExecSlotsBusy("cancelled while waiting for a free command slot")
            if cancel is None:
                time.sleep(pause)
        try:
            yield
        finally:
            os.close(fd)
