"""``manage.py cluster``: the rendered HAProxy and supervisord configurations, what the command refuses before it
renders anything, and the rendered supervisord configuration run by the real supervisord (with small HTTP servers
in the gateways' places and the real HAProxy in front): named output, ``ready:``, ``supervisorctl status``, restart
with backoff or none, and the stop order. tests/e2e/test_cluster.py runs the whole topology."""

from __future__ import annotations

import configparser
import io
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections

from openclaw_site.management.commands.cluster import (
    BALANCER_PRIORITY,
    CELERY_PRIORITY,
    GATEWAYS_PRIORITY,
    Program,
    ProgramGroup,
    balancer_program,
    cluster_groups,
    console_program,
    is_socket,
    render_haproxy_config,
    render_supervisord_config,
    supervisord_paths,
)
from tests.support.processes import ROOT, free_port, read_log, stop_process

HAPROXY = os.environ.get("OPENCLAW_HAPROXY", "/usr/sbin/haproxy")
BACKENDS = [("gateway-1", 18799), ("gateway-2", 18800)]


def parse(text: str) -> configparser.RawConfigParser:
    """As supervisord reads it: inline comments after ``;`` or ``#``, ``%(name)s`` expanded (here: only ``%%``)."""
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";", "#"))
    parser.read_string(text)
    return parser


def rendered(
    tmp_path: Path, *, restart: bool = True, to_terminal: bool = True
) -> tuple[configparser.RawConfigParser, list[ProgramGroup]]:
    cluster_dir = tmp_path / "cluster"
    paths = supervisord_paths(cluster_dir)
    groups = cluster_groups(
        backends=BACKENDS,
        workers=2,
        worker_concurrency=4,
        cluster_dir=cluster_dir,
        balancer=balancer_program(
            haproxy=HAPROXY, config=cluster_dir / "haproxy.cfg", backends=BACKENDS, health_host="localhost"
        ),
    )
    console = console_program(
        url="ws://127.0.0.1:18789",
        balancer_health="http://127.0.0.1:18789/readyz",
        backends=BACKENDS,
        health_host="localhost",
        config=paths["config"],
    )
    text = render_supervisord_config(
        cluster_dir=cluster_dir,
        directory=ROOT,
        groups=groups,
        console=console,
        restart=restart,
        to_terminal=to_terminal,
    )
    return parse(text), groups


def command_of(config: configparser.RawConfigParser, section: str) -> list[str]:
    return shlex.split(config[section]["command"].replace("%%", "%"))


def test_every_process_is_a_program_started_in_priority_order_and_stopped_in_reverse(tmp_path):
    config, _groups = rendered(tmp_path)

    programs = {
        name.removeprefix("program:"): config[name] for name in config.sections() if name.startswith("program:")
    }
    assert set(programs) == {"gateway-1", "gateway-2", "worker-1", "worker-2", "beat", "haproxy"}
    assert config["group:gateways"]["programs"] == "gateway-1,gateway-2"
    assert config["group:celery"]["programs"] == "worker-1,worker-2,beat"
    # HAProxy stops first (no new connections), then the gateways, then Celery; the console last of all.
    assert int(config["program:haproxy"]["priority"]) == BALANCER_PRIORITY
    assert int(config["group:gateways"]["priority"]) == GATEWAYS_PRIORITY
    assert int(config["group:celery"]["priority"]) == CELERY_PRIORITY
    assert BALANCER_PRIORITY > GATEWAYS_PRIORITY > CELERY_PRIORITY > int(config["eventlistener:cluster"]["priority"])
    for name, program in programs.items():
        assert program["stopsignal"] == "TERM", name
        assert (program["stopasgroup"], program["killasgroup"]) == ("true", "true"), name
        assert (program["autorestart"], program["startretries"]) == ("true", "10"), name
        assert program["stdout_logfile"] == str(tmp_path / "cluster" / "logs" / f"{name}.log")
        assert program["stdout_events_enabled"] == "true"
        assert program["directory"] == str(ROOT)
        assert program["environment"] == f'OPENCLAW_PROCESS_NAME="{name}"'
    assert command_of(config, "program:gateway-2")[-6:] == [
        "serve", "--bind", "127.0.0.1", "--port", "18800", "--no-gateway-file"
    ]  # fmt: skip
    # Celery's %h survives supervisord's %(name)s expansion.
    assert "worker-2@%h" in command_of(config, "program:worker-2")


def test_haproxy_runs_behind_the_wait_for_every_gateway(tmp_path):
    config, _groups = rendered(tmp_path)

    command = command_of(config, "program:haproxy")

    assert command[:4] == [sys.executable, "-m", "openclaw_site.supervision", "await-backends"]
    assert "--backend=gateway-1=http://127.0.0.1:18799/readyz" in command
    assert command[command.index("--") + 1 :] == [HAPROXY, "-db", "-f", str(tmp_path / "cluster" / "haproxy.cfg")]


def test_supervisord_runs_in_the_foreground_with_an_owner_only_socket_for_supervisorctl(tmp_path):
    config, _groups = rendered(tmp_path)
    socket_path = tmp_path / "cluster" / "supervisor.sock"

    assert config["supervisord"]["nodaemon"] == "true"
    assert config["unix_http_server"]["file"] == str(socket_path)
    assert config["unix_http_server"]["chmod"] == "0700"
    assert config["supervisorctl"]["serverurl"] == f"unix://{socket_path}"
    console = config["eventlistener:cluster"]
    assert console["events"] == "PROCESS_LOG,PROCESS_STATE,SUPERVISOR_STATE_CHANGE"
    # What the console writes for the terminal goes to supervisord's own standard output, unrotated.
    assert (console["stderr_logfile"], console["stderr_logfile_maxbytes"]) == ("/dev/stdout", "0")


def test_on_a_socket_the_console_writes_to_a_rotated_file(tmp_path):
    config, _groups = rendered(tmp_path, to_terminal=False)

    console = config["eventlistener:cluster"]
    assert console["stderr_logfile"] == str(tmp_path / "cluster" / "logs" / "cluster.log")
    assert console["stderr_logfile_maxbytes"] == "10MB"


def test_only_a_socket_counts_as_one(tmp_path):
    first, second = socket.socketpair()
    with first, second, open(tmp_path / "out", "w") as file:
        assert is_socket(first)
        assert not is_socket(file)
    # Closed, or no file descriptor at all (a test's captured output).
    assert not is_socket(first)
    assert not is_socket(io.StringIO())


def test_without_restart_no_program_is_restarted_or_retried(tmp_path):
    config, _groups = rendered(tmp_path, restart=False)

    for name in config.sections():
        if name.startswith("program:"):
            assert (config[name]["autorestart"], config[name]["startretries"]) == ("false", "0"), name
    # The console is the cluster's own: it comes back whatever the option.
    assert config["eventlistener:cluster"]["autorestart"] == "true"


def test_a_state_dir_with_a_percent_sign_is_refused(tmp_path):
    with pytest.raises(CommandError, match=r"supervisord cannot take a path with '%' in it"):
        rendered(tmp_path / "100%")


def test_a_state_dir_too_long_for_a_unix_socket_is_refused(tmp_path):
    with pytest.raises(CommandError, match=r"too long for a unix socket \(107 bytes at most\)"):
        rendered(tmp_path / ("d" * 100))


@pytest.mark.parametrize("argument", ["two\nlines", "value ;comment", "value\t#comment"])
def test_a_command_line_supervisord_would_cut_is_refused(tmp_path, argument):
    program = Program("worker-1", (sys.executable, "-c", argument))

    with pytest.raises(CommandError, match=r"cannot write .* into supervisord\.conf"):
        render_supervisord_config(
            cluster_dir=tmp_path,
            directory=ROOT,
            groups=[ProgramGroup("worker-1", CELERY_PRIORITY, (program,))],
            console=Program("cluster", (sys.executable, "-V")),
            restart=True,
        )


def test_the_haproxy_configuration_checks_every_gateway_and_is_valid(tmp_path):
    text = render_haproxy_config(bind="0.0.0.0", port=18789, backends=BACKENDS, health_host="gw.example", maxconn=4950)

    assert "    server gateway-2 127.0.0.1:18800 check" in text
    assert "http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host gw.example" in text
    assert "    maxconn 4950" in text
    if not os.access(HAPROXY, os.X_OK):
        pytest.skip(f"HAProxy ({HAPROXY}) is missing")
    (tmp_path / "haproxy.cfg").write_text(text)
    checked = subprocess.run([HAPROXY, "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_haproxy_cuts_a_dribbled_request_head_at_the_gateways_deadline_and_forwards_none_of_it(tmp_path, settings):
    if not os.access(HAPROXY, os.X_OK):
        pytest.skip(f"HAProxy ({HAPROXY}) is missing")
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "HTTP_HEAD_TIMEOUT_MS": 1000}
    # The gateway's place: a listener that keeps whatever reaches it (HAProxy's health checks do; they fail).
    backend = socket.create_server(("127.0.0.1", 0))
    backend.setblocking(False)
    port = free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        render_haproxy_config(
            bind="127.0.0.1",
            port=port,
            backends=[("gateway-1", backend.getsockname()[1])],
            health_host="localhost",
            maxconn=100,
        )
    )
    assert "    timeout http-request 1000ms" in config.read_text()
    haproxy = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        client = None
        for _ in range(100):
            try:
                client = socket.create_connection(("127.0.0.1", port), timeout=30)
                break
            except ConnectionRefusedError:
                time.sleep(0.1)
        assert client is not None, "HAProxy did not listen"
        silent = socket.create_connection(("127.0.0.1", port), timeout=30)
        with client, silent:
            client.sendall(b"GET /api/gateway/health HTTP/1.1\r\nHost: gateway\r\nX-a: ")
            answer, give_up = b"", time.monotonic() + 30
            while not answer and time.monotonic() < give_up:  # a byte every 0.2 s: no idle timeout would end it
                readable, _, _ = select.select([client], [], [], 0.2)
                if readable:
                    answer = client.recv(65536)
                else:
                    client.sendall(b"a")
            silent_answer = silent.recv(65536)
        forwarded = b""
        while True:
            try:
                peer, _address = backend.accept()
            except BlockingIOError:
                break
            with peer:
                peer.settimeout(1)
                try:
                    forwarded += peer.recv(65536)
                except TimeoutError:
                    pass
    finally:
        stop_process(haproxy)
        backend.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer  # HAProxy 2.6 says "Request Time-out"
    assert b"X-a" not in forwarded
    assert silent_answer == b""  # closed at the same deadline without a 408 (option http-ignore-probes)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gateways", "0"], "--gateways and --workers must be at least 1"),
        (["--workers", "0"], "--gateways and --workers must be at least 1"),
        (["--haproxy", "/nonexistent/haproxy"], "/nonexistent/haproxy not found: install Debian's haproxy"),
    ],
)
def test_wrong_options_are_refused_before_anything_starts(argv, message, settings, tmp_path):
    settings.STATE_DIR = tmp_path

    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("cluster", *argv)

    assert not (tmp_path / "cluster").exists()


def test_a_second_cluster_on_the_same_state_dir_is_refused(settings, tmp_path):
    settings.STATE_DIR = tmp_path
    # Should the check miss, the command stops at the profile check rather than start a cluster.
    settings.REDIS_URL = ""
    (tmp_path / "cluster").mkdir()
    running = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    running.bind(str(tmp_path / "cluster" / "supervisor.sock"))
    running.listen()
    try:
        with pytest.raises(CommandError, match=r"a cluster already runs from .*: supervisorctl -c .* status"):
            call_command("cluster", "--haproxy", sys.executable)
    finally:
        running.close()

    assert sorted(path.name for path in (tmp_path / "cluster").iterdir()) == ["supervisor.sock"]


def test_the_cluster_needs_redis(settings, tmp_path):
    settings.STATE_DIR = tmp_path
    settings.REDIS_URL = ""

    with pytest.raises(CommandError, match="the cluster needs REDIS_URL"):
        call_command("cluster", "--haproxy", sys.executable)


def test_the_cluster_needs_postgresql_and_celery(settings, tmp_path):
    settings.STATE_DIR = tmp_path
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    settings.OPENCLAW_TASK_MODE = "inprocess"
    expected = (
        "the cluster runs turns in Celery workers: unset OPENCLAW_TASK_MODE=inprocess"
        if connections["default"].vendor == "postgresql"
        else "the cluster needs DATABASE_URL=postgres://"
    )

    with pytest.raises(CommandError, match=re.escape(expected)):
        call_command("cluster", "--haproxy", sys.executable)


class Supervised:
    """The rendered configuration under the real supervisord, with ``python -m http.server`` answering
    ``/readyz`` in place of each gateway, a sleeping worker, and the real HAProxy in front."""

    def __init__(self, tmp_path: Path, *, restart: bool):
        self.cluster_dir = tmp_path / "cluster"
        self.paths = supervisord_paths(self.cluster_dir)
        self.paths["logs"].mkdir(parents=True)
        site = tmp_path / "site"
        site.mkdir()
        (site / "readyz").write_text("ok")
        self.port = free_port()
        backends = [("gateway-1", free_port()), ("gateway-2", free_port())]
        haproxy_config = self.cluster_dir / "haproxy.cfg"
        haproxy_config.write_text(
            render_haproxy_config(
                bind="127.0.0.1", port=self.port, backends=backends, health_host="localhost", maxconn=1000
            )
        )
        gateways = tuple(
            Program(
                name,
                (sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(site), str(port)),
                start_secs=1,
                stop_wait_secs=5,
            )
            for name, port in backends
        )
        worker = Program(
            "worker-1",
            (sys.executable, "-c", "import time; print('worker at 100%', flush=True); time.sleep(3600)"),
            start_secs=1,
            stop_wait_secs=5,
        )
        groups = [
            ProgramGroup("celery", CELERY_PRIORITY, (worker,)),
            ProgramGroup("gateways", GATEWAYS_PRIORITY, gateways),
            ProgramGroup(
                "haproxy",
                BALANCER_PRIORITY,
                (balancer_program(haproxy=HAPROXY, config=haproxy_config, backends=backends, health_host="localhost"),),
            ),
        ]
        console = console_program(
            url=f"ws://127.0.0.1:{self.port}",
            balancer_health=f"http://127.0.0.1:{self.port}/readyz",
            backends=backends,
            health_host="localhost",
            config=self.paths["config"],
        )
        self.paths["config"].write_text(
            render_supervisord_config(
                cluster_dir=self.cluster_dir, directory=ROOT, groups=groups, console=console, restart=restart
            )
        )
        self.output = tmp_path / "terminal.log"
        with open(self.output, "a") as terminal:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "supervisor.supervisord", "-c", str(self.paths["config"])],
                cwd=ROOT,
                stdout=terminal,
                stderr=subprocess.STDOUT,
            )

    def terminal(self) -> str:
        return read_log(self.output)

    def until(self, predicate, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise AssertionError(f"{what}:\n{self.terminal()}\n{read_log(self.paths['log'])}")
            time.sleep(0.1)

    def status(self) -> dict[str, tuple[str, int | None]]:
        answer = subprocess.run(
            [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(self.paths["config"]), "status"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        rows = re.findall(r"^(\S+)\s+([A-Z]+)(?:\s+pid (\d+),)?", answer.stdout, re.MULTILINE)
        return {name: (state, int(pid) if pid else None) for name, state, pid in rows}

    def stop(self) -> int | None:
        stop_process(self.process, signal.SIGINT, 30)
        return self.process.returncode


@pytest.fixture
def supervised(tmp_path):
    if not os.access(HAPROXY, os.X_OK):
        pytest.skip(f"HAProxy ({HAPROXY}) is missing")
    started: list[Supervised] = []

    def start(*, restart: bool) -> Supervised:
        started.append(Supervised(tmp_path, restart=restart))
        return started[-1]

    yield start
    for cluster in started:
        cluster.stop()


@pytest.mark.slow
def test_supervisord_runs_the_rendered_cluster_restarts_what_dies_and_stops_it_in_order(supervised):
    cluster = supervised(restart=True)
    cluster.until(lambda: "cluster    | ready: " in cluster.terminal(), "no ready line")
    cluster.until(
        lambda: {state for state, _pid in cluster.status().values()} == {"RUNNING"}, "not every program is running"
    )
    status = cluster.status()
    assert set(status) == {"cluster", "celery:worker-1", "gateways:gateway-1", "gateways:gateway-2", "haproxy"}
    # The ready line names the pids supervisorctl reports.
    assert f"gateway-1 (pid {status['gateways:gateway-1'][1]}, port " in cluster.terminal()

    killed = status["gateways:gateway-2"][1]
    os.kill(killed, signal.SIGKILL)
    cluster.until(
        lambda: (
            cluster.status()["gateways:gateway-2"][0] == "RUNNING"
            and cluster.status()["gateways:gateway-2"][1] != killed
        ),
        "gateway-2 was not restarted",
    )
    returncode = cluster.stop()

    terminal = cluster.terminal()
    assert returncode == 0
    assert "worker-1   | worker at 100%" in terminal
    assert re.search(r"^gateway-1  \| Serving HTTP on 127\.0\.0\.1 port \d+", terminal, re.MULTILINE)
    assert f"gateway-2  | pid {killed} exited unexpectedly" in terminal
    assert "cluster    | stopping every process: HAProxy first, then the gateways, then Celery" in terminal
    assert "Traceback" not in read_log(cluster.paths["logs"] / "haproxy.log")
    stops = re.findall(r"stopped: (\S+)", read_log(cluster.paths["log"]))
    assert stops[0] == "haproxy" and set(stops[1:3]) == {"gateway-1", "gateway-2"}, stops
    assert stops[3:] == ["worker-1", "cluster"], stops
    assert not cluster.paths["socket"].exists()


@pytest.mark.slow
def test_without_restart_a_process_that_dies_stays_stopped(supervised):
    cluster = supervised(restart=False)
    cluster.until(lambda: "cluster    | ready: " in cluster.terminal(), "no ready line")
    cluster.until(lambda: cluster.status()["gateways:gateway-1"][0] == "RUNNING", "gateway-1 is not running")
    killed = cluster.status()["gateways:gateway-1"][1]

    os.kill(killed, signal.SIGKILL)
    cluster.until(lambda: cluster.status()["gateways:gateway-1"][0] == "EXITED", "gateway-1 is not reported exited")
    time.sleep(1.5)

    assert cluster.status()["gateways:gateway-1"] == ("EXITED", None)
    assert cluster.status()["gateways:gateway-2"][0] == "RUNNING"
    assert f"gateway-1  | pid {killed} exited unexpectedly" in cluster.terminal()
