"""Run the production topology on one machine: HAProxy in front of several gateway processes, Celery
workers and one Celery beat, on the shared PostgreSQL + Redis of the environment.

    DATABASE_URL=postgres://… REDIS_URL=redis://… ./dev cluster            (or: manage.py cluster)

The supervisor renders ``<state dir>/cluster/haproxy.cfg``, starts every process in a session of its
own (a Ctrl-C reaches the supervisor only, which stops them in order), prefixes their output with
their name, restarts a gateway or worker that exits unexpectedly (with backoff), and stops everything
when HAProxy itself exits or on SIGINT/SIGTERM. docs/deployment.md describes the topology.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from gateway.conf import gateway_setting

HEALTH_PATH = "/api/gateway/health"
STOP_GRACE_S = 30.0
# Backends above the public port, clear of the ports next to it that OpenClaw's own gateway uses.
BACKEND_PORT_OFFSET = 10
RESTART_BACKOFF_S = (1.0, 30.0)
# A process that ran this long before it exited starts again without waiting.
STABLE_AFTER_S = 60.0


@dataclass
class Child:
    """One supervised process: what starts it, and its current incarnation."""

    name: str
    argv: list[str]
    env: dict[str, str]
    restart: bool
    port: int | None = None
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    backoff: float = RESTART_BACKOFF_S[0]
    restart_at: float | None = None
    reader: threading.Thread | None = field(default=None, repr=False)


def haproxy_maxconn() -> int:
    """Connections HAProxy can hold within this process's file descriptor limit (it inherits it)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = hard if hard != resource.RLIM_INFINITY else 1_048_576
    return max(100, (limit - 100) // 2)


def render_haproxy_config(
    *, bind: str, port: int, backends: list[tuple[str, int]], health_host: str, maxconn: int
) -> str:
    """HAProxy in HTTP mode: WebSocket upgrades become tunnels, ``leastconn`` spreads long-lived sockets,
    and a backend that fails two health checks a second apart takes no new connection."""
    servers = "\n".join(f"    server {name} 127.0.0.1:{backend_port} check" for name, backend_port in backends)
    return f"""# Rendered by `manage.py cluster`; edits are overwritten at the next start.
global
    # Each proxied connection holds two descriptors (client and server side): half the process's limit.
    maxconn {maxconn}

defaults
    mode http
    option http-server-close
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    # An upgraded WebSocket: the gateway ticks every {gateway_setting("TICK_INTERVAL_MS") // 1000} s, so an hour
    # of silence means a dead peer.
    timeout tunnel 1h
    timeout client-fin 10s
    timeout server-fin 10s
    # A connection refused by a backend that died since its last check goes to another one.
    option redispatch
    retries 2

frontend gateway
    bind {bind}:{port}
    # The gateway then treats clients as remote (no loopback privileges through the proxy).
    option forwardfor
    default_backend gateways

backend gateways
    balance leastconn
    option httpchk
    http-check send meth GET uri {HEALTH_PATH} ver HTTP/1.1 hdr Host {health_host}
    http-check expect status 200
    default-server inter 1s fall 2 rise 1
{servers}
"""


class Command(BaseCommand):
    help = (
        "Run HAProxy in front of N gateway processes, Celery workers and one Celery beat on the shared "
        "PostgreSQL + Redis; Ctrl-C stops them all."
    )

    def add_arguments(self, parser):
        parser.add_argument("--gateways", type=int, default=2, help="Gateway processes behind HAProxy (default 2).")
        parser.add_argument("--workers", type=int, default=1, help="Celery worker processes (default 1).")
        parser.add_argument(
            "--worker-concurrency", type=int, default=4, help="Threads of each Celery worker (default 4)."
        )
        parser.add_argument("--bind", default=None, help="HAProxy's address (OPENCLAW_GATEWAY_BIND).")
        parser.add_argument("--port", type=int, default=None, help="HAProxy's port (OPENCLAW_GATEWAY_PORT).")
        parser.add_argument(
            "--backend-port",
            type=int,
            default=None,
            help="First gateway process's port on 127.0.0.1 (default: HAProxy's port + 10); the next ones follow.",
        )
        parser.add_argument("--haproxy", default=os.environ.get("OPENCLAW_HAPROXY", "haproxy"), help="HAProxy binary.")
        parser.add_argument(
            "--no-restart", action="store_true", help="Leave a process that exits stopped (tests kill one on purpose)."
        )
        parser.add_argument("--no-migrate", action="store_true", help="Skip `bootstrap` (migrations, token, admin).")

    def handle(self, *args, **options):
        self._check_profile()
        haproxy = shutil.which(options["haproxy"])
        if haproxy is None:
            raise CommandError(
                f"{options['haproxy']} not found: install Debian's haproxy (apt-get install haproxy) or pass --haproxy"
            )
        if options["gateways"] < 1 or options["workers"] < 1:
            raise CommandError("--gateways and --workers must be at least 1")
        if not options["no_migrate"]:
            call_command("bootstrap", stdout=self.stdout)
        bind = options["bind"] or gateway_setting("BIND")
        port = options["port"] if options["port"] is not None else gateway_setting("PORT")
        first_backend = options["backend_port"] or port + BACKEND_PORT_OFFSET
        backends = [(f"gateway-{i + 1}", first_backend + i) for i in range(options["gateways"])]
        cluster_dir = Path(settings.STATE_DIR) / "cluster"
        cluster_dir.mkdir(parents=True, exist_ok=True)
        config = cluster_dir / "haproxy.cfg"
        config.write_text(
            render_haproxy_config(
                bind=bind, port=port, backends=backends, health_host=_health_host(), maxconn=haproxy_maxconn()
            ),
            encoding="utf-8",
        )
        public_host = "127.0.0.1" if bind in ("0.0.0.0", "::") else bind
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            # Node hosts the gateway starts (local and static-ssh providers) come in through the balancer.
            "OPENCLAW_WORKER_GATEWAY_URL": os.environ.get("OPENCLAW_WORKER_GATEWAY_URL")
            or f"ws://{public_host}:{port}",
        }
        restart = not options["no_restart"]
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
        celery = [sys.executable, "-m", "celery", "-A", "openclaw_site"]
        children = [
            Child(name, [*manage, "serve", "--bind", "127.0.0.1", "--port", str(p)], env, restart, port=p)
            for name, p in backends
        ]
        children += [
            Child(
                f"worker-{i + 1}",
                [
                    *celery,
                    "worker",
                    "--loglevel",
                    "INFO",
                    "--pool",
                    "threads",
                    "--concurrency",
                    str(options["worker_concurrency"]),
                    "--hostname",
                    f"worker-{i + 1}@%h",
                    "--without-gossip",
                    "--without-mingle",
                ],
                env,
                restart,
            )
            for i in range(options["workers"])
        ]
        children.append(
            Child(
                "beat",
                [*celery, "beat", "--loglevel", "INFO", "--schedule", str(cluster_dir / "celerybeat-schedule")],
                env,
                restart,
            )
        )
        # HAProxy last: it only routes to backends its health checks find up.
        children.append(Child("haproxy", [haproxy, "-db", "-f", str(config)], env, restart=False))
        Supervisor(children, self.stdout, cluster_dir, f"ws://{public_host}:{port}").run()

    @staticmethod
    def _check_profile() -> None:
        if not settings.REDIS_URL:
            raise CommandError("the cluster needs REDIS_URL: its gateway processes share the Redis channel layer")
        if connections["default"].vendor != "postgresql":
            raise CommandError("the cluster needs DATABASE_URL=postgres://…: its processes share one PostgreSQL")
        if settings.OPENCLAW_TASK_MODE != "celery":
            raise CommandError("the cluster runs turns in Celery workers: unset OPENCLAW_TASK_MODE=inprocess")


def _health_host() -> str:
    """A Host header Django accepts for the health checks."""
    allowed = [host for host in settings.ALLOWED_HOSTS if host not in ("*", "")]
    return allowed[0].lstrip(".") if allowed else "localhost"


class Supervisor:
    def __init__(self, children: list[Child], out, cluster_dir: Path, url: str):
        self.children = children
        self.out = out
        self.cluster_dir = cluster_dir
        self.url = url
        self.stopping = False
        self.write_lock = threading.Lock()

    def say(self, name: str, line: str) -> None:
        with self.write_lock:
            self.out.write(f"{name:<10} | {line.rstrip()}")
            self.out.flush()

    def run(self) -> None:
        received: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda signum, _frame: received.append(signum))
        try:
            balancer = self.children[-1]
            for child in self.children[:-1]:
                self.start(child)
            self.write_state()
            announced = False
            while not received:
                # HAProxy once every gateway answers: it then starts with all of them up, not waiting for
                # its checks to find them (a client connecting meanwhile would get a 503).
                if balancer.process is None and self.healthy():
                    self.start(balancer)
                    self.write_state()
                elif balancer.process is not None and not announced and self.healthy() and self.balancer_answers():
                    announced = True
                    self.say("cluster", f"ready: {self.url} → {', '.join(self.describe())}")
                if not self.watch():
                    break
                time.sleep(0.2)
            if received:
                self.say("cluster", f"{signal.Signals(received[0]).name}: stopping every process")
        finally:
            self.stop_all()

    def start(self, child: Child) -> None:
        child.process = subprocess.Popen(
            child.argv,
            env=child.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # A session of its own: the terminal's Ctrl-C reaches the supervisor, which stops children in order.
            start_new_session=True,
            text=True,
            errors="replace",
            bufsize=1,
        )
        child.started_at = time.monotonic()
        child.restart_at = None
        child.reader = threading.Thread(target=self.relay, args=(child, child.process), daemon=True)
        child.reader.start()
        self.say(child.name, f"started pid {child.process.pid}" + (f" on port {child.port}" if child.port else ""))

    def relay(self, child: Child, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.say(child.name, line)

    def watch(self) -> bool:
        """Restart what exited (after its backoff); False when the cluster cannot go on."""
        now = time.monotonic()
        changed = False
        for child in self.children:
            process = child.process
            if process is None or process.poll() is None:
                if child.restart_at is not None and now >= child.restart_at:
                    self.start(child)
                    changed = True
                continue
            if child.restart_at is not None:
                continue
            self.say(child.name, f"pid {process.pid} exited with {process.returncode}")
            if not child.restart:
                if child.name == "haproxy":
                    self.say("cluster", "HAProxy exited: stopping the cluster")
                    return False
                child.process = None
                changed = True
                continue
            if now - child.started_at >= STABLE_AFTER_S:
                child.backoff = RESTART_BACKOFF_S[0]
            child.restart_at = now + child.backoff
            self.say(child.name, f"restarting in {child.backoff:.0f} s")
            child.backoff = min(RESTART_BACKOFF_S[1], child.backoff * 2)
        if changed:
            self.write_state()
        return True

    def healthy(self) -> bool:
        for child in self.children:
            if child.port is None:
                continue
            if not _answers(f"http://127.0.0.1:{child.port}{HEALTH_PATH}"):
                return False
        return True

    def balancer_answers(self) -> bool:
        return _answers(self.url.replace("ws://", "http://", 1) + HEALTH_PATH)

    def describe(self) -> list[str]:
        return [
            f"{child.name} (pid {child.process.pid}, port {child.port})"
            for child in self.children
            if child.port is not None and child.process is not None
        ]

    def write_state(self) -> None:
        """Which pid is which process now: for operators and for the tests and benchmarks that kill one."""
        state = {
            "url": self.url,
            "supervisor": os.getpid(),
            "processes": {
                child.name: {"pid": child.process.pid if child.process else None, "port": child.port}
                for child in self.children
            },
        }
        target = self.cluster_dir / "cluster.json"
        partial = target.with_suffix(".json.partial")
        partial.write_text(json.dumps(state, indent=2), encoding="utf-8")
        partial.replace(target)

    def stop_all(self) -> None:
        """HAProxy first (no new connections), then gateways, workers and beat together; SIGKILL after the grace."""
        if self.stopping:
            return
        self.stopping = True
        ordered = sorted(self.children, key=lambda child: child.name != "haproxy")
        for child in ordered:
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
            if child.name == "haproxy" and child.process is not None:
                _wait(child.process, 5.0)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in ordered:
            if child.process is None:
                continue
            if not _wait(child.process, max(0.1, deadline - time.monotonic())):
                self.say(child.name, f"pid {child.process.pid} ignored SIGTERM for {STOP_GRACE_S:.0f} s: SIGKILL")
                child.process.kill()
                child.process.wait()
        for child in self.children:
            if child.reader is not None:
                child.reader.join(timeout=2)
        self.say("cluster", "stopped")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return answer.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _wait(process: subprocess.Popen, timeout: float) -> bool:
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True
