"""Run the production topology on one machine: HAProxy in front of several gateway processes, Celery
workers and one Celery beat, on the shared PostgreSQL + Redis of the environment, under supervisord.

    DATABASE_URL=postgres://… REDIS_URL=redis://… ./dev cluster            (or: manage.py cluster)
    .venv/bin/supervisorctl -c <state dir>/cluster/supervisord.conf status  (from another terminal)

The command runs ``bootstrap``, renders ``<state dir>/cluster/haproxy.cfg`` and ``supervisord.conf``, then becomes
supervisord in the foreground: supervisord starts, restarts (with backoff) and stops the processes, in the order of
their priorities; Ctrl-C / SIGTERM stops them all. Two programs of ``openclaw_site.supervision`` fill what
supervisord does not do itself: the console prints every process's output with its name and the ``ready:`` line,
and HAProxy starts once every gateway answers its health check. docs/deployment.md describes the topology.
"""

from __future__ import annotations

import os
import resource
import shlex
import shutil
import socket
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from gateway.conf import gateway_setting
from openclaw_client.running_gateway import write_gateway_file
from openclaw_site.supervision import MULTIPROCESS_DIR_ENV

# Readiness (docs/operations.md, "Health"): a process that lost its database, Redis or broker, or runs before its
# migrations, gets no new clients.
HEALTH_PATH = "/readyz"
# Backends above the public port, clear of the ports next to it that OpenClaw's own gateway uses.
BACKEND_PORT_OFFSET = 10
# A start counts once the process stayed up this long; a process that dies sooner is retried after 1 s, 2 s, …
# (supervisord's backoff), at most START_RETRIES times, then left FATAL for an operator (`supervisorctl start`).
START_SECS = 5
START_RETRIES = 10
STOP_WAIT_SECS = 30
LOG_MAX_BYTES = "10MB"
LOG_BACKUPS = 3
# The longest path a unix socket address holds (sun_path is 108 bytes with its terminating NUL).
UNIX_SOCKET_PATH_MAX = 107
# Programs start in ascending and stop in descending priority; supervisord stops one group after the other and
# the programs of one group together. So: HAProxy first (no new connections), then the gateways, then Celery
# (whose running turns finish within the stop wait), the console last (it reports all of it).
CONSOLE_PRIORITY = 1
CELERY_PRIORITY = 100
GATEWAYS_PRIORITY = 200
BALANCER_PRIORITY = 300
# The programs of openclaw_site/supervision.py, run with this interpreter (supervisord runs them in the project's
# directory).
SUPERVISION = (sys.executable, "-m", "openclaw_site.supervision")
# The console's own queue of events while it writes: output bursts (a gateway's start, a traceback) must not be dropped.
CONSOLE_EVENT_BUFFER = 1024


@dataclass(frozen=True)
class Program:
    """One process supervisord runs: its command line, how long it must stay up to count as started, how long it
    gets to stop after SIGTERM before SIGKILL."""

    name: str
    argv: tuple[str, ...]
    start_secs: int = START_SECS
    stop_wait_secs: int = STOP_WAIT_SECS


@dataclass(frozen=True)
class ProgramGroup:
    """Programs that start and stop together. A group whose one program bears its name is that program alone (its
    supervisorctl name is then ``haproxy``, not ``haproxy:haproxy``)."""

    name: str
    priority: int
    programs: tuple[Program, ...]

    @property
    def standalone(self) -> bool:
        return len(self.programs) == 1 and self.programs[0].name == self.name


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
    # A request head (request line and headers) must be complete this long after accept, and after the previous
    # response on a kept-alive connection (HAProxy's keep-alive wait falls back to it): the gateways' own head
    # deadline (OPENCLAW_HTTP_HEAD_TIMEOUT_MS). Without it `timeout client` applies, an idle timeout each byte
    # restarts. HAProxy forwards a request only once its head is complete, so the gateways see no slow head from it.
    timeout http-request {gateway_setting("HTTP_HEAD_TIMEOUT_MS")}ms
    # A connection that sent nothing by then (a browser's preconnect) is closed without a 408, as the gateways do.
    option http-ignore-probes
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


def supervisord_paths(cluster_dir: Path) -> dict[str, Path]:
    return {
        "config": cluster_dir / "supervisord.conf",
        "socket": cluster_dir / "supervisor.sock",
        "log": cluster_dir / "supervisord.log",
        "pidfile": cluster_dir / "supervisord.pid",
        "logs": cluster_dir / "logs",
    }


def render_supervisord_config(
    *,
    cluster_dir: Path,
    directory: Path,
    groups: Sequence[ProgramGroup],
    console: Program,
    restart: bool,
    to_terminal: bool = True,
) -> str:
    """supervisord in the foreground, its socket for supervisorctl, one program per process, and the console: an
    event listener that receives every program's output (``stdout_events_enabled``) and writes it, named, to
    supervisord's standard output. Each program's output is also kept in ``logs/<name>.log`` (``supervisorctl
    tail``). Every program runs in ``directory`` (the project, where ``-m openclaw_site.supervision`` and
    ``-A openclaw_site`` are found). Without ``restart`` a process that exits stays stopped, and one that fails to start
    is not retried. Without ``to_terminal`` the console writes to ``logs/cluster.log`` instead of supervisord's
    standard output."""
    paths = supervisord_paths(cluster_dir)
    for path in paths.values():
        _check_path(path)
    if len(os.fsencode(paths["socket"])) > UNIX_SOCKET_PATH_MAX:
        raise CommandError(
            f"{paths['socket']} is too long for a unix socket ({UNIX_SOCKET_PATH_MAX} bytes at most): "
            "set a shorter OPENCLAW_STATE_DIR"
        )
    sections = [
        "# Rendered by `manage.py cluster`, which runs supervisord on it; edits are overwritten at the next start.\n"
        f"# supervisorctl -c {paths['config']} status",
        _section(
            "supervisord",
            nodaemon="true",
            # The console is what the terminal shows; supervisord's own log stays in its file.
            silent="true",
            logfile=paths["log"],
            logfile_maxbytes=LOG_MAX_BYTES,
            logfile_backups=LOG_BACKUPS,
            pidfile=paths["pidfile"],
            childlogdir=paths["logs"],
            identifier="openclaw-cluster",
        ),
        # Owner only: whoever reaches the socket can stop and start every process.
        _section("unix_http_server", file=paths["socket"], chmod="0700"),
        _section("supervisorctl", serverurl=f"unix://{paths['socket']}"),
        _section(
            "rpcinterface:supervisor",
            **{"supervisor.rpcinterface_factory": "supervisor.rpcinterface:make_main_rpcinterface"},
        ),
        _section(
            f"eventlistener:{console.name}",
            command=_command(console.argv),
            directory=directory,
            events="PROCESS_LOG,PROCESS_STATE,SUPERVISOR_STATE_CHANGE",
            buffer_size=CONSOLE_EVENT_BUFFER,
            priority=CONSOLE_PRIORITY,
            autorestart="true",
            startsecs=console.start_secs,
            stopsignal="TERM",
            stopwaitsecs=console.stop_wait_secs,
            # Its stdout is the listener protocol; what it writes for the terminal is its stderr.
            stdout_logfile="NONE",
            stderr_logfile="/dev/stdout" if to_terminal else paths["logs"] / f"{console.name}.log",
            # A terminal or a pipe cannot be rotated.
            stderr_logfile_maxbytes=0 if to_terminal else LOG_MAX_BYTES,
        ),
    ]
    for group in groups:
        for program in group.programs:
            sections.append(_program_section(program, group.priority, directory, paths["logs"], restart=restart))
        if not group.standalone:
            sections.append(
                _section(
                    f"group:{group.name}",
                    programs=",".join(program.name for program in group.programs),
                    priority=group.priority,
                )
            )
    return "\n\n".join(sections) + "\n"


def _program_section(program: Program, priority: int, directory: Path, logs: Path, *, restart: bool) -> str:
    return _section(
        f"program:{program.name}",
        command=_command(program.argv),
        directory=directory,
        priority=priority,
        autostart="true",
        autorestart="true" if restart else "false",
        startsecs=program.start_secs,
        startretries=START_RETRIES if restart else 0,
        stopsignal="TERM",
        stopwaitsecs=program.stop_wait_secs,
        # The signals reach what the process started as well (a worker's node hosts, Celery's pool).
        stopasgroup="true",
        killasgroup="true",
        redirect_stderr="true",
        stdout_logfile=logs / f"{program.name}.log",
        stdout_logfile_maxbytes=LOG_MAX_BYTES,
        stdout_logfile_backups=LOG_BACKUPS,
        stdout_events_enabled="true",
        # Each line the program logs names it (gateway/log_context.py); the names are [a-z0-9-] only.
        environment=f'OPENCLAW_PROCESS_NAME="{program.name}"',
    )


def _section(name: str, **values: object) -> str:
    lines = [f"[{name}]"]
    for key, value in values.items():
        text = str(value)
        _check_value(text)
        lines.append(f"{key}={text}")
    return "\n".join(lines)


def _command(argv: Sequence[str]) -> str:
    """A command line for supervisord: it splits it as a shell would (``shlex``) after expanding ``%(name)s``
    references, so a literal ``%`` is written ``%%`` (Celery's ``--hostname worker-1@%h``)."""
    return shlex.join(argv).replace("%", "%%")


def _check_value(text: str) -> None:
    # supervisord's parser ends a value at a line break and cuts it at an inline comment (`;` or `#` after a space).
    if "\n" in text or "\r" in text or any(f"{space}{mark}" in text for space in " \t" for mark in ";#"):
        raise CommandError(
            f"cannot write {text!r} into supervisord.conf (a line break, or ' ;' / ' #' starts a comment)"
        )


def _check_path(path: Path) -> None:
    # supervisord expands log file names twice, so no escaping of `%` survives in a path.
    if "%" in str(path):
        raise CommandError(f"{path}: supervisord cannot take a path with '%' in it; set another OPENCLAW_STATE_DIR")


def is_socket(stream) -> bool:
    try:
        return stat.S_ISSOCK(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError):
        return False


def _socket_answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def console_program(
    *, url: str, balancer_health: str, backends: Sequence[tuple[str, int]], health_host: str, config: Path
) -> Program:
    argv = (*SUPERVISION, "console", "--url", url, "--balancer", balancer_health, "--host", health_host)
    return Program(
        "cluster", (*argv, "--config", str(config), *_backend_arguments(backends)), start_secs=1, stop_wait_secs=5
    )


def balancer_program(*, haproxy: str, config: Path, backends: Sequence[tuple[str, int]], health_host: str) -> Program:
    """HAProxy behind ``await-backends``: it becomes HAProxy once every gateway answers (supervisord's priorities
    order starts but do not wait), so that HAProxy starts with all of them up rather than waiting for its checks
    to find them (a client connecting meanwhile would get a 503)."""
    wait = (*SUPERVISION, "await-backends", "--host", health_host, *_backend_arguments(backends))
    return Program("haproxy", (*wait, "--", haproxy, "-db", "-f", str(config)), start_secs=1, stop_wait_secs=5)


def _backend_arguments(backends: Sequence[tuple[str, int]]) -> list[str]:
    return [f"--backend={name}=http://127.0.0.1:{port}{HEALTH_PATH}" for name, port in backends]


class Command(BaseCommand):
    help = (
        "Run HAProxy in front of N gateway processes, Celery workers and one Celery beat on the shared "
        "PostgreSQL + Redis, under supervisord in the foreground; Ctrl-C stops them all."
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
            "--no-restart",
            action="store_true",
            help="Restart no process that exits or fails to start (tests kill one on purpose).",
        )
        parser.add_argument("--no-migrate", action="store_true", help="Skip `bootstrap` (migrations, token, admin).")

    def handle(self, *args, **options):
        if options["gateways"] < 1 or options["workers"] < 1:
            raise CommandError("--gateways and --workers must be at least 1")
        haproxy = shutil.which(options["haproxy"])
        if haproxy is None:
            raise CommandError(
                f"{options['haproxy']} not found: install Debian's haproxy (apt-get install haproxy) or pass --haproxy"
            )
        cluster_dir = Path(settings.STATE_DIR).resolve() / "cluster"
        paths = supervisord_paths(cluster_dir)
        # Before anything is rendered: the files belong to the running cluster.
        if _socket_answers(paths["socket"]):
            raise CommandError(
                f"a cluster already runs from {cluster_dir}: supervisorctl -c {paths['config']} status (or shutdown)"
            )
        self._check_profile()
        if not options["no_migrate"]:
            call_command("bootstrap", stdout=self.stdout)
        bind = options["bind"] or gateway_setting("BIND")
        port = options["port"] if options["port"] is not None else gateway_setting("PORT")
        first_backend = options["backend_port"] or port + BACKEND_PORT_OFFSET
        backends = [(f"gateway-{i + 1}", first_backend + i) for i in range(options["gateways"])]
        public_host = "127.0.0.1" if bind in ("0.0.0.0", "::") else bind
        url = f"ws://{public_host}:{port}"
        health_host = _health_host()
        haproxy_config = cluster_dir / "haproxy.cfg"
        groups = cluster_groups(
            backends=backends,
            workers=options["workers"],
            worker_concurrency=options["worker_concurrency"],
            cluster_dir=cluster_dir,
            balancer=balancer_program(
                haproxy=haproxy, config=haproxy_config, backends=backends, health_host=health_host
            ),
        )
        console = console_program(
            url=url,
            balancer_health=f"http://{public_host}:{port}{HEALTH_PATH}",
            backends=backends,
            health_host=health_host,
            config=paths["config"],
        )
        supervisord_config = render_supervisord_config(
            cluster_dir=cluster_dir,
            directory=Path(settings.BASE_DIR),
            groups=groups,
            console=console,
            restart=not options["no_restart"],
            to_terminal=not is_socket(sys.stdout),
        )
        if is_socket(sys.stdout):
            self.stdout.write(
                f"cluster    | standard output is a socket, which supervisord cannot open as /dev/stdout: the output "
                f"of every process is in {paths['logs']}"
            )
        paths["logs"].mkdir(parents=True, exist_ok=True)
        haproxy_config.write_text(
            render_haproxy_config(
                bind=bind, port=port, backends=backends, health_host=health_host, maxconn=haproxy_maxconn()
            ),
            encoding="utf-8",
        )
        paths["config"].write_text(supervisord_config, encoding="utf-8")
        self.stdout.write(f"cluster    | starting supervisord: supervisorctl -c {paths['config']} status")
        self.stdout.flush()
        # Every process inherits supervisord's environment: the settings of this one, and these.
        os.environ["PYTHONUNBUFFERED"] = "1"
        # Every program writes its metrics into files there, and /metrics adds them up (docs/operations.md); the
        # files of an earlier cluster's processes would count again, so the directory starts empty.
        metrics_dir = cluster_dir / "metrics"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        os.environ[MULTIPROCESS_DIR_ENV] = str(metrics_dir)
        # Production logs are JSON lines on standard error too, unless the operator chose otherwise.
        os.environ.setdefault("OPENCLAW_LOG_FORMAT", "json")
        # Node hosts the gateway starts (local and static-ssh providers) come in through the balancer.
        os.environ["OPENCLAW_WORKER_GATEWAY_URL"] = os.environ.get("OPENCLAW_WORKER_GATEWAY_URL") or url
        # The CLI's `call` finds the cluster at its balancer (the backends write no gateway.json); the pid is this
        # process's, which supervisord keeps, so the file counts as stale once the cluster has stopped.
        write_gateway_file(settings.STATE_DIR, bind=public_host, port=port, pid=os.getpid())
        connections.close_all()
        sys.stdout.flush()
        sys.stderr.flush()
        # supervisord takes this process's place (its pid, its terminal): Ctrl-C and SIGTERM reach it alone, since
        # it starts each program in a process group of its own.
        os.execv(sys.executable, [sys.executable, "-m", "supervisor.supervisord", "-c", str(paths["config"])])

    @staticmethod
    def _check_profile() -> None:
        if not settings.REDIS_URL:
            raise CommandError("the cluster needs REDIS_URL: its gateway processes share the Redis channel layer")
        if connections["default"].vendor != "postgresql":
            raise CommandError("the cluster needs DATABASE_URL=postgres://…: its processes share one PostgreSQL")
        if settings.OPENCLAW_TASK_MODE != "celery":
            raise CommandError("the cluster runs turns in Celery workers: unset OPENCLAW_TASK_MODE=inprocess")


def cluster_groups(
    *,
    backends: Sequence[tuple[str, int]],
    workers: int,
    worker_concurrency: int,
    cluster_dir: Path,
    balancer: Program,
) -> list[ProgramGroup]:
    manage = (sys.executable, str(Path(settings.BASE_DIR) / "manage.py"))
    celery = (sys.executable, "-m", "celery", "-A", "openclaw_site")
    gateways = tuple(
        Program(name, (*manage, "serve", "--bind", "127.0.0.1", "--port", str(port), "--no-gateway-file"))
        for name, port in backends
    )
    worker = (*celery, "worker", "--loglevel", "INFO", "--pool", "threads", "--concurrency", str(worker_concurrency))
    workers_programs = [
        Program(
            f"worker-{i + 1}", (*worker, "--hostname", f"worker-{i + 1}@%h", "--without-gossip", "--without-mingle")
        )
        for i in range(workers)
    ]
    beat = Program(
        "beat",
        (*celery, "beat", "--loglevel", "INFO", "--schedule", str(cluster_dir / "celerybeat-schedule")),
        stop_wait_secs=10,
    )
    return [
        ProgramGroup("celery", CELERY_PRIORITY, (*workers_programs, beat)),
        ProgramGroup("gateways", GATEWAYS_PRIORITY, gateways),
        ProgramGroup("haproxy", BALANCER_PRIORITY, (balancer,)),
    ]


def _health_host() -> str:
    """A Host header Django accepts for the health checks."""
    allowed = [host for host in settings.ALLOWED_HOSTS if host not in ("*", "")]
    return allowed[0].lstrip(".") if allowed else "localhost"
