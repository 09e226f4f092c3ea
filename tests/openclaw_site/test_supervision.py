"""``openclaw_site.supervision``: the console (supervisord's event listener protocol, named output, the ``ready:``
line) and ``await-backends`` (HAProxy starts once the gateways answer), against real HTTP servers and real processes."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from openclaw_site.supervision import Backend, Console, listen, main
from tests.support.processes import ROOT


class HealthServer:
    """A loopback HTTP server whose answer to every GET is ``status`` (changed by the test), recording Host headers."""

    def __init__(self, status: int):
        self.status = status
        self.hosts: list[str | None] = []
        # Answer 200 once this many checks were answered with ``status`` (None: never).
        self.healthy_after: int | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.hosts.append(self.headers.get("Host"))
                status = outer.status
                if outer.healthy_after is not None and len(outer.hosts) > outer.healthy_after:
                    status = 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/api/gateway/health"

    def __enter__(self) -> HealthServer:
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def health() -> Iterator[Callable[[int], HealthServer]]:
    servers: list[HealthServer] = []

    def make(status: int) -> HealthServer:
        server = HealthServer(status).__enter__()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.__exit__()


def envelope(eventname: str, payload: str, serial: int = 1) -> str:
    """What supervisord writes to a listener: ``len`` counts the payload's characters, before UTF-8 encoding."""
    return (
        f"ver:3.0 server:openclaw-cluster serial:{serial} pool:cluster poolserial:{serial} "
        f"eventname:{eventname} len:{len(payload)}\n{payload}"
    )


def log_event(name: str, pid: int, data: str) -> tuple[str, str]:
    return "PROCESS_LOG_STDOUT", f"processname:{name} groupname:gateways pid:{pid} channel:stdout\n{data}"


def console_lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_listen_reads_each_payload_by_its_character_count_and_acknowledges_it_after_handling():
    first = "processname:gateway-1 groupname:gateways pid:7 channel:stdout\nété ✓\r\nnext"
    second = "processname:gateway-1 groupname:gateways from_state:STARTING pid:7"
    wire = (envelope("PROCESS_LOG_STDOUT", first, 1) + envelope("PROCESS_STATE_RUNNING", second, 2)).encode()
    stdin = io.TextIOWrapper(io.BytesIO(wire), encoding="utf-8", newline="")
    stdout = io.StringIO()

    received = []
    for eventname, payload in listen(stdin, stdout):
        received.append((eventname, payload, stdout.getvalue()))

    assert [(name, payload) for name, payload, _ in received] == [
        ("PROCESS_LOG_STDOUT", first),
        ("PROCESS_STATE_RUNNING", second),
    ]
    # Each event is handled while supervisord still waits for its RESULT.
    assert [written for _, _, written in received] == ["READY\n", "READY\nRESULT 2\nOKREADY\n"]
    assert stdout.getvalue() == "READY\nRESULT 2\nOKREADY\nRESULT 2\nOKREADY\n"


def test_the_console_names_every_line_and_joins_lines_that_arrive_in_pieces():
    out = io.StringIO()
    console = Console(out, url="ws://127.0.0.1:1", backends=[])

    console.handle(*log_event("gateway-1", 11, "first\nsecond\npart"))
    console.handle(*log_event("worker-1", 12, "celery ready\n"))
    console.handle(*log_event("gateway-1", 11, "ial line\n"))
    console.handle(*log_event("gateway-1", 11, "no end yet"))
    console.handle(
        "PROCESS_STATE_EXITED", "processname:gateway-1 groupname:gateways from_state:RUNNING expected:0 pid:11"
    )

    assert console_lines(out) == [
        "gateway-1  | first",
        "gateway-1  | second",
        "worker-1   | celery ready",
        "gateway-1  | partial line",
        # An exit ends the unfinished line: it is still the process's last output.
        "gateway-1  | no end yet",
        "gateway-1  | pid 11 exited unexpectedly",
    ]


def test_the_console_writes_a_line_longer_than_it_holds_in_pieces():
    out = io.StringIO()
    console = Console(out, url="ws://127.0.0.1:1", backends=[])

    console.handle(*log_event("gateway-1", 11, "x" * (64 * 1024 + 1)))

    assert console_lines(out) == ["gateway-1  | " + "x" * (64 * 1024 + 1)]
    assert console.held == {}


def test_the_console_reports_state_changes_in_words_an_operator_can_act_on():
    out = io.StringIO()
    console = Console(out, url="ws://127.0.0.1:1", backends=[])

    console.handle("SUPERVISOR_STATE_CHANGE_RUNNING", "")
    console.handle("PROCESS_STATE_STARTING", "processname:beat groupname:celery from_state:STOPPED tries:0")
    console.handle("PROCESS_STATE_RUNNING", "processname:beat groupname:celery from_state:STARTING pid:21")
    console.handle("PROCESS_STATE_BACKOFF", "processname:gateway-2 groupname:gateways from_state:STARTING tries:1")
    console.handle("PROCESS_STATE_FATAL", "processname:gateway-2 groupname:gateways from_state:BACKOFF")
    console.handle("PROCESS_STATE_FATAL", "processname:haproxy groupname:haproxy from_state:BACKOFF")
    console.handle("SUPERVISOR_STATE_CHANGE_STOPPING", "")
    console.handle("PROCESS_STATE_STOPPED", "processname:beat groupname:celery from_state:STOPPING pid:21")

    assert console_lines(out) == [
        "beat       | running (pid 21)",
        "gateway-2  | exited while starting (try 1): supervisord starts it again shortly",
        "gateway-2  | supervisord gave up starting it: supervisorctl start gateways:gateway-2",
        "haproxy    | supervisord gave up starting it: supervisorctl start haproxy",
        "cluster    | stopping every process: HAProxy first, then the gateways, then Celery",
        "beat       | stopped (pid 21)",
    ]


def test_ready_waits_for_every_gateway_and_the_balancer_then_names_their_pids(health):
    gateway_1, gateway_2, balancer = health(200), health(503), health(503)
    backends = [Backend("gateway-1", gateway_1.url), Backend("gateway-2", gateway_2.url)]
    out = io.StringIO()
    console = Console(out, url="ws://127.0.0.1:18789", backends=backends)
    stop = threading.Event()
    announcer = threading.Thread(target=console.announce_when_ready, args=(balancer.url, "gw.example", stop))
    announcer.start()
    try:
        console.handle(*log_event("gateway-1", 101, "listening\n"))
        console.handle(*log_event("gateway-2", 102, "listening\n"))
        time.sleep(0.6)
        # gateway-2 does not answer yet, the balancer neither: no ready line.
        assert not any("ready:" in line for line in console_lines(out))
        gateway_2.status = 200
        time.sleep(0.6)
        assert not any("ready:" in line for line in console_lines(out))
        balancer.status = 200
        announcer.join(5)
    finally:
        stop.set()
        announcer.join(5)

    assert console_lines(out)[-1] == (
        f"cluster    | ready: ws://127.0.0.1:18789 → gateway-1 (pid 101, port {backends[0].port}), "
        f"gateway-2 (pid 102, port {backends[1].port})"
    )
    # The checks carry a Host header Django accepts, as HAProxy's do.
    assert set(gateway_1.hosts) == {"gw.example"}


def test_ready_is_not_announced_before_each_gateway_pid_is_known(health):
    gateway, balancer = health(200), health(200)
    out = io.StringIO()
    console = Console(out, url="ws://127.0.0.1:1", backends=[Backend("gateway-1", gateway.url)])
    stop = threading.Event()
    announcer = threading.Thread(target=console.announce_when_ready, args=(balancer.url, None, stop))
    announcer.start()
    time.sleep(0.5)
    stop.set()
    announcer.join(5)

    assert out.getvalue() == ""
    assert not announcer.is_alive()


def await_backends(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openclaw_site.supervision", "await-backends", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_await_backends_becomes_the_command_once_every_backend_answers(health):
    gateway = health(503)
    # Healthy from its third check on: the first two are refused, however slowly the command starts.
    gateway.healthy_after = 2

    result = await_backends(
        f"--backend=gateway-1={gateway.url}", "--", sys.executable, "-c", "import os; print('pid', os.getpid())"
    )

    assert result.returncode == 0, result.stderr
    assert len(gateway.hosts) == 3
    lines = result.stdout.splitlines()
    assert lines[0] == "waiting for gateway-1 to answer its health check"
    assert lines[-1].startswith("pid ")


def test_await_backends_starts_with_the_gateways_that_answer_after_its_patience(health):
    up, down = health(200), health(503)

    result = await_backends(
        f"--backend=gateway-1={up.url}",
        f"--backend=gateway-2={down.url}",
        "--patience",
        "1",
        "--",
        sys.executable,
        "-c",
        "print('started')",
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "waiting for gateway-2 to answer its health check",
        "starting without gateway-2: no answer in 1 s",
        "started",
    ]


def test_await_backends_keeps_waiting_past_its_patience_while_no_backend_answers(health):
    down = health(503)

    with pytest.raises(subprocess.TimeoutExpired):
        await_backends(f"--backend=gateway-1={down.url}", "--patience", "0", "--", sys.executable, "-V", timeout=2)


def test_await_backends_says_so_when_the_command_cannot_start(health):
    up = health(200)

    result = await_backends(f"--backend=gateway-1={up.url}", "--", "/nonexistent/haproxy", "-db")

    assert result.returncode == 127
    assert "cannot start /nonexistent/haproxy: [Errno 2] No such file or directory" in result.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["await-backends", "--backend", "gateway-1", "--", "true"],
        ["await-backends", "--backend", "gateway-1=127.0.0.1:1/health", "--", "true"],
        ["await-backends", "--backend", "gateway-1=http://127.0.0.1:1/health"],
        ["console", "--url", "ws://127.0.0.1:1"],
    ],
)
def test_a_wrong_command_line_is_refused(argv, capsys):
    with pytest.raises(SystemExit) as refused:
        main(argv)

    assert refused.value.code == 2
    assert "error:" in capsys.readouterr().err
