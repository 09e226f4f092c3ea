"""The two small programs that the supervisord configuration of ``manage.py cluster`` runs beside the cluster's
processes (supervisord itself neither prefixes output nor waits for a health check):

    python -m openclaw_site.supervision console --url ws://… --backend gateway-1=http://…/health … --balancer http://…
    python -m openclaw_site.supervision await-backends --backend gateway-1=http://…/health … -- /usr/sbin/haproxy …

``console`` is an event listener (supervisord's documented protocol, "Event Listener Notification Protocol"): it
receives every program's output and state changes and writes them to the terminal with the program's name in front,
and prints ``cluster | ready: ws://…`` once every gateway and the balancer answer their health check.
``await-backends`` waits until every gateway answers, then becomes the program after ``--`` (HAProxy), so that HAProxy
never starts with backends its checks have not yet found up (an early client would get a 503).

Standard library only: these run before and beside the Django processes, and load no settings.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TextIO
from urllib.parse import urlsplit

from prometheus_client import multiprocess

CONSOLE_NAME = "cluster"
# Set by `manage.py cluster` for every program (docs/operations.md, Metrics).
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
NAME_WIDTH = 10
# A line longer than this is written in pieces rather than held until its end.
LONGEST_HELD_LINE = 64 * 1024
HEALTH_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.2
# How often await-backends says which gateways it still waits for.
WAITING_NOTE_EVERY_S = 10.0
# After this long, HAProxy starts with the gateways that answer: a gateway supervisord gave up on must not keep the
# balancer (and so every other gateway) out of reach.
DEFAULT_PATIENCE_S = 60.0
EXEC_FAILED = 127

# The health checks go to loopback addresses: an http_proxy of the environment must not see them.
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Backend:
    name: str
    health_url: str

    @property
    def port(self) -> int | None:
        return urlsplit(self.health_url).port


def parse_backend(text: str) -> Backend:
    name, separator, url = text.partition("=")
    if not separator or not name or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected NAME=http://host:port/path, got {text!r}")
    return Backend(name, url)


def answers(url: str, host: str | None) -> bool:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with _direct.open(request, timeout=HEALTH_TIMEOUT_S) as answer:
            return answer.status == 200
    except (OSError, urllib.error.URLError):
        return False


def fields(line: str) -> dict[str, str]:
    """``key:value key:value`` (supervisord's header lines); a value may itself hold colons."""
    pairs = (token.partition(":") for token in line.split())
    return {key: value for key, _colon, value in pairs}


def listen(stdin: TextIO, stdout: TextIO) -> Iterator[tuple[str, str]]:
    """``(eventname, payload)`` of each event supervisord sends; the event is acknowledged when the next is asked for.

    ``len`` counts characters of the payload as supervisord built it (before it encodes it as UTF-8), so ``stdin``
    must decode UTF-8 and must not translate newlines (``newline=""``): a ``\\r\\n`` in a program's output is two
    characters of the count.
    """
    while True:
        stdout.write("READY\n")
        stdout.flush()
        header = stdin.readline()
        if not header:
            return
        envelope = fields(header)
        payload = stdin.read(int(envelope["len"]))
        yield envelope["eventname"], payload
        stdout.write("RESULT 2\nOK")
        stdout.flush()


class Console:
    """Writes what supervisord reports to ``out``, one line per output line, each with its program's name."""

    def __init__(self, out: TextIO, *, url: str, backends: Sequence[Backend]):
        self.out = out
        self.url = url
        self.backends = list(backends)
        self.pids: dict[str, int] = {}
        self.held: dict[tuple[str, str], str] = {}
        self.write_lock = threading.Lock()

    def say(self, name: str, lines: Sequence[str]) -> None:
        if not lines:
            return
        text = "".join(f"{name:<{NAME_WIDTH}} | {line.rstrip()}\n" for line in lines)
        with self.write_lock:
            self.out.write(text)
            self.out.flush()

    def handle(self, eventname: str, payload: str) -> None:
        if eventname.startswith("PROCESS_LOG_"):
            header, _newline, data = payload.partition("\n")
            about = fields(header)
            self._remember_pid(about)
            self.output(about.get("processname", "?"), about.get("channel", "stdout"), data)
        elif eventname.startswith("PROCESS_STATE_"):
            about = fields(payload)
            self._remember_pid(about)
            self.state_changed(eventname.removeprefix("PROCESS_STATE_"), about)
        elif eventname == "SUPERVISOR_STATE_CHANGE_STOPPING":
            self.say(CONSOLE_NAME, ["stopping every process: HAProxy first, then the gateways, then Celery"])

    def output(self, name: str, channel: str, data: str) -> None:
        """Whole lines now; the rest of a line once its end arrives (supervisord reads pipes in chunks)."""
        key = (name, channel)
        text = self.held.pop(key, "") + data
        *lines, rest = text.split("\n")
        if len(rest) > LONGEST_HELD_LINE:
            lines.append(rest)
            rest = ""
        if rest:
            self.held[key] = rest
        self.say(name, lines)

    def state_changed(self, state: str, about: dict[str, str]) -> None:
        name = about.get("processname", "?")
        pid = about.get("pid")
        if state in ("EXITED", "STOPPED", "FATAL"):
            # A line the process left unfinished is still its output.
            self.flush_held(name)
            forget_live_metrics(pid)
        if state == "RUNNING":
            self.say(name, [f"running (pid {pid})"])
        elif state == "EXITED":
            how = "as expected" if about.get("expected") == "1" else "unexpectedly"
            self.say(name, [f"pid {pid} exited {how}"])
        elif state == "BACKOFF":
            self.say(name, [f"exited while starting (try {about.get('tries')}): supervisord starts it again shortly"])
        elif state == "FATAL":
            group = about.get("groupname", name)
            target = name if group == name else f"{group}:{name}"
            self.say(name, [f"supervisord gave up starting it: supervisorctl start {target}"])
        elif state == "STOPPED":
            self.say(name, [f"stopped (pid {pid})"])

    def flush_held(self, name: str | None = None) -> None:
        for key in [key for key in self.held if name in (None, key[0])]:
            self.say(key[0], [self.held.pop(key)])

    def _remember_pid(self, about: dict[str, str]) -> None:
        pid = about.get("pid", "")
        if pid.isdigit() and int(pid) > 0 and "processname" in about:
            self.pids[about["processname"]] = int(pid)

    def ready_line(self) -> str:
        described = ", ".join(f"{b.name} (pid {self.pids[b.name]}, port {b.port})" for b in self.backends)
        return f"ready: {self.url} → {described}"

    def announce_when_ready(self, balancer_health: str, host: str | None, stop: threading.Event) -> None:
        """Once every gateway and the balancer answer (and each gateway's pid is known): the ``ready:`` line."""
        while not stop.is_set():
            if (
                all(b.name in self.pids for b in self.backends)
                and all(answers(b.health_url, host) for b in self.backends)
                and answers(balancer_health, host)
            ):
                self.say(CONSOLE_NAME, [self.ready_line()])
                return
            stop.wait(POLL_INTERVAL_S)


def forget_live_metrics(pid: str | None) -> None:
    """A program that exited leaves its metric files in the cluster's ``PROMETHEUS_MULTIPROC_DIR``: its counters
    still count (what it did happened), its ``live*`` gauges (open connections) must not, so they go."""
    if os.environ.get(MULTIPROCESS_DIR_ENV) and pid and pid.isdigit() and int(pid) > 0:
        multiprocess.mark_process_dead(int(pid))


def run_console(args: argparse.Namespace) -> int:
    # The protocol channel (stdout) and the events (stdin) are supervisord's; the terminal is stderr, which the
    # configuration sends to supervisord's own standard output.
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace", newline="")
    stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="")
    console = Console(sys.stderr, url=args.url, backends=args.backend)
    stop = threading.Event()
    announcer = threading.Thread(
        target=console.announce_when_ready, args=(args.balancer, args.host, stop), name="ready", daemon=True
    )
    announcer.start()
    # supervisord stops the console last, but sends it no event once it is stopping it: the last lines of a stop
    # (the final state changes, a process's last output) are only in the files.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    try:
        for eventname, payload in listen(stdin, stdout):
            console.handle(eventname, payload)
    finally:
        stop.set()
        console.flush_held()
        if args.config:
            files = Path(args.config).parent
            console.say(
                CONSOLE_NAME, [f"stopped; what followed is in {files / 'logs'} and {files / 'supervisord.log'}"]
            )
    return 0


def await_backends(
    backends: Sequence[Backend], host: str | None, command: Sequence[str], *, patience: float, out: TextIO
) -> NoReturn:
    """Until every backend answers (or, after ``patience`` seconds, at least one does), then ``exec`` ``command``:
    the pid supervisord watches and signals becomes HAProxy's."""
    started = time.monotonic()
    noted = None
    while True:
        silent = [b.name for b in backends if not answers(b.health_url, host)]
        waited = time.monotonic() - started
        if not silent:
            break
        if waited >= patience and len(silent) < len(backends):
            out.write(f"starting without {', '.join(silent)}: no answer in {patience:.0f} s\n")
            break
        if noted is None or waited - noted >= WAITING_NOTE_EVERY_S:
            out.write(f"waiting for {', '.join(silent)} to answer its health check\n")
            out.flush()
            noted = waited
        time.sleep(POLL_INTERVAL_S)
    out.flush()
    try:
        os.execv(command[0], list(command))
    except OSError as error:
        out.write(f"cannot start {command[0]}: {error}\n")
        out.flush()
        sys.exit(EXEC_FAILED)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openclaw_site.supervision", description=__doc__.split("\n\n")[0])
    programs = parser.add_subparsers(dest="program", required=True)
    console = programs.add_parser("console", help="supervisord event listener: named output and the ready line")
    console.add_argument("--url", required=True, help="The balancer's URL, as clients see it.")
    console.add_argument("--balancer", required=True, help="The balancer's health URL.")
    console.add_argument("--backend", type=parse_backend, action="append", default=[], metavar="NAME=URL")
    console.add_argument("--host", default=None, help="Host header of the health checks.")
    console.add_argument(
        "--config", default=None, help="The supervisord configuration (its files are named at the end)."
    )
    waiter = programs.add_parser("await-backends", help="exec COMMAND once the backends answer")
    waiter.add_argument("--backend", type=parse_backend, action="append", required=True, metavar="NAME=URL")
    waiter.add_argument("--host", default=None, help="Host header of the health checks.")
    waiter.add_argument("--patience", type=float, default=DEFAULT_PATIENCE_S)
    waiter.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG …]")
    args = parser.parse_args(argv)
    if args.program == "console":
        return run_console(args)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("await-backends needs the command to run after --")
    await_backends(args.backend, args.host, command, patience=args.patience, out=sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
