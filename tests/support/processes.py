"""Start real processes of this project: gateways (``manage.py serve`` under Daphne), the Celery workers that run
their turns, and the mock OpenAI-compatible server. One launcher for the end-to-end tests and for ``bench/``.

Tests::

    server = start_gateway(extra_env={...})    # the test databases, TEST_TOKEN, a Celery worker if task mode is celery
    ... server.url, server.token ...
    server.stop()

Benchmarks (and anything that wants a clean profile, migrations or ``manage.py`` commands before serving)::

    launch = GatewayLaunch.prepare(settings={"DATABASE_URL": ...}, token=..., clean_env=True)
    launch.migrate()
    launch.manage("shell", "-c", "...")        # with the gateway's environment, before or while it serves
    server = launch.start(worker=False, timeout=60)
    ... server.pid, server.announced() ...
    server.stop()
    launch.remove_state()

The mock model as a process of its own: ``mock = start_mock_openai()``, ``mock.base_url``, ``mock.stop()``.
"""

from __future__ import annotations

import json
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
TEST_TOKEN = "test-gateway-token-0123456789"
STOP_TIMEOUT_S = 20.0
# Inherited variables that choose the profile under test (database, channel layer, task mode, model, ...);
# ``clean_env`` leaves them out so that the profile is exactly the one the caller's settings describe.
PROFILE_ENV_PREFIXES = (
    "OPENCLAW_",
    "DATABASE_URL",
    "HARNESS_DATABASE_URL",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "DJANGO_DEBUG",
)
# What ``manage.py serve`` prints once Daphne listens (openclaw_site/management/commands/serve.py).
ANNOUNCEMENT = re.compile(r"listening on (\S+) \(database: ([^,]+), live updates: ([^)]+)\)")
MOCK_URL_PREFIX = "MOCK_OPENAI_URL="
# The folders the launchers below make in the temp directory. In a ``./dev test`` run (``OPENCLAW_TEST_RUN_ID``,
# its shell's pid) their names carry the run's id, so that the run's clean-up finds what its tests left behind and
# nothing of a parallel run: ``gateway-state-run4242-k3j2x9``.
SCRATCH_PREFIXES = ("gateway-state-", "cluster-state-", "node-host-", "node-identity-")
TEST_RUN_ID_ENV = "OPENCLAW_TEST_RUN_ID"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Below Linux's ephemeral range (32768–60999 by default), where outgoing connections take their source ports: a
# run of consecutive listening ports chosen there can collide with a client socket opened meanwhile.
CONSECUTIVE_PORTS_RANGE = (20_000, 32_000)


def free_consecutive_ports(count: int) -> int:
    """The first of ``count`` consecutive ports that are free now (``manage.py cluster`` puts its gateway
    processes on ``--backend-port`` and the ports after it)."""
    low, high = CONSECUTIVE_PORTS_RANGE
    for _ in range(200):
        first = random.randrange(low, high - count)
        sockets = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return first
    raise RuntimeError(f"no {count} consecutive free ports in {low}–{high}")


def make_scratch_dir(prefix: str) -> str:
    """A fresh folder in the temp directory named ``<prefix>[run<id>-]<random>``; whoever makes one removes it."""
    run_id = os.environ.get(TEST_RUN_ID_ENV, "")
    return tempfile.mkdtemp(prefix=f"{prefix}run{run_id}-" if run_id else prefix)


def remove_scratch_dir(path: str | Path) -> None:
    """Remove a folder a launcher made; raises ``OSError`` when it is still there afterwards."""
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        raise OSError(f"could not remove {path}")


def stray_scratch_dirs(run_id: str) -> list[Path]:
    """The launchers' folders of test run ``run_id`` still in the temp directory."""
    if not run_id:
        return []
    temp = Path(tempfile.gettempdir())
    return sorted(path for prefix in SCRATCH_PREFIXES for path in temp.glob(f"{prefix}run{run_id}-*") if path.is_dir())


def current_database_url(alias: str = "default") -> str:
    """The URL of a database pytest-django created, for processes outside this one."""
    from django.db import connections

    settings = connections[alias].settings_dict
    if settings["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings['NAME']}"
    user = settings.get("USER") or ""
    password = settings.get("PASSWORD") or ""
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host, port = settings.get("HOST") or "127.0.0.1", settings.get("PORT") or 5432
    return f"postgres://{credentials}{host}:{port}/{settings['NAME']}"


def task_mode(env: Mapping[str, str]) -> str:
    return env.get("OPENCLAW_TASK_MODE") or ("celery" if env.get("REDIS_URL") else "inprocess")


def read_log(path: str | Path | None) -> str:
    if path is None:
        return ""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def stop_process(
    process: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S
) -> float | None:
    """``sig``, then SIGKILL after ``timeout``; the seconds it took, None when the process had already exited."""
    if process is None or process.poll() is not None:
        return None
    started = time.perf_counter()
    process.send_signal(sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
    return time.perf_counter() - started


class StopFailed(RuntimeError):
    """A process that did not stop as asked: it outlived its grace period (and was killed) or exited with an error."""


def stop_process_checked(
    process: subprocess.Popen | None,
    what: str,
    *,
    clean_exit_codes: tuple[int, ...] = (0,),
    sig: int = signal.SIGTERM,
    timeout: float = STOP_TIMEOUT_S,
) -> None:
    """``stop_process``, then raise ``StopFailed`` unless the process ended by itself within ``timeout`` with one of
    ``clean_exit_codes``. The process is gone either way; a process that had already exited is judged by its code."""
    if process is None:
        return
    was_running = process.poll() is None
    if was_running:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
            raise StopFailed(
                f"{what} (pid {process.pid}) did not stop within {timeout:.0f} s of {signal.Signals(sig).name}; killed"
            ) from None
    if process.returncode not in clean_exit_codes:
        when = "when stopped" if was_running else "before it was stopped"
        raise StopFailed(f"{what} (pid {process.pid}) exited with {process.returncode} {when}")


def _spawn(argv: list[str], env: Mapping[str, str], log_path: str, *, append: bool = False) -> subprocess.Popen:
    with open(log_path, "a" if append else "w", encoding="utf-8") as log:
        return subprocess.Popen(argv, cwd=ROOT, env=dict(env), stdout=log, stderr=subprocess.STDOUT)


def _wait_ready(
    process: subprocess.Popen, ready: Callable[[], bool], *, what: str, timeout: float, log_path: str, poll: float
) -> None:
    """Until ``ready()``; a process that exits or is not ready within ``timeout`` is an error (and is killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{read_log(log_path)}")
        if ready():
            return
        time.sleep(poll)
    stop_process(process, signal.SIGKILL, 5)
    raise RuntimeError(f"{what} not ready within {timeout:.0f} s:\n{read_log(log_path)}")


def _listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def start_celery_worker(
    env: Mapping[str, str], state_dir: str, *, concurrency: int = 4, timeout: float = 60.0, name: str = "celery"
) -> tuple[subprocess.Popen, str]:
    """A Celery worker with a gateway's environment (thread pool, no heartbeat/gossip/mingle), named ``name@host`` and
    logging to ``<name>.log`` in ``state_dir``; returns once it logged `` ready.``."""
    log_path = os.path.join(state_dir, f"{name}.log")
    worker = _start_until_logged(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "openclaw_site",
            "worker",
            "--hostname",
            f"{name}@%h",
            "--loglevel",
            "INFO",
            "--pool",
            "threads",
            "--concurrency",
            str(concurrency),
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        env,
        log_path,
        ready_line=" ready.",
        what="celery worker",
        timeout=timeout,
    )
    return worker, log_path


def start_celery_beat(env: Mapping[str, str], state_dir: str, *, timeout: float = 60.0) -> tuple[subprocess.Popen, str]:
    """Celery beat with a gateway's environment (its schedule file and ``beat.log`` in ``state_dir``); returns once it
    logged that it started."""
    log_path = os.path.join(state_dir, "beat.log")
    beat = _start_until_logged(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "openclaw_site",
            "beat",
            "--loglevel",
            "INFO",
            "--schedule",
            os.path.join(state_dir, "celerybeat-schedule"),
        ],
        env,
        log_path,
        ready_line="beat: Starting...",
        what="celery beat",
        timeout=timeout,
    )
    return beat, log_path


def _start_until_logged(
    argv: list[str], env: Mapping[str, str], log_path: str, *, ready_line: str, what: str, timeout: float
) -> subprocess.Popen:
    """A process logging to ``log_path``, once its log has ``ready_line``."""
    process = _spawn(argv, env, log_path)
    _wait_ready(
        process, lambda: ready_line in read_log(log_path), what=what, timeout=timeout, log_path=log_path, poll=0.1
    )
    return process


@dataclass
class GatewayServer:
    process: subprocess.Popen
    port: int
    token: str
    state_dir: str
    log_path: str
    env: dict[str, str] = field(repr=False, default_factory=dict)
    # The Celery worker that runs this gateway's turns (task mode "celery"), started with the same env.
    worker: subprocess.Popen | None = None
    worker_log_path: str | None = None
    # How long the last stop that found the process running took (benchmarks report it).
    stop_seconds: float | None = None
    worker_stop_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def worker_pid(self) -> int | None:
        return self.worker.pid if self.worker is not None else None

    def log(self) -> str:
        return read_log(self.log_path)

    def worker_log(self) -> str:
        return read_log(self.worker_log_path)

    def announced(self, timeout: float = 5.0) -> tuple[str, str] | None:
        """(database, channel layer: "Redis" or "in-memory") as the gateway announced them when it began
        listening ("live updates: through Redis" or "in this process")."""
        deadline = time.monotonic() + timeout
        while True:
            match = ANNOUNCEMENT.search(self.log())
            if match or time.monotonic() >= deadline:
                if match is None:
                    return None
                return match.group(2), "Redis" if "Redis" in match.group(3) else "in-memory"
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """The gateway (``sig``; SIGTERM is its graceful shutdown) and its worker (SIGTERM), at the same time: each
        takes about a second to stop, and neither needs the other meanwhile."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stop-worker") as pool:
            worker_stopped = pool.submit(self.stop_worker, signal.SIGTERM, timeout)
            seconds = stop_process(self.process, sig, timeout)
            worker_stopped.result()
        if seconds is not None:
            self.stop_seconds = seconds
        return self.process.returncode

    def stop_worker(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int | None:
        if self.worker is None:
            return None
        seconds = stop_process(self.worker, sig, timeout)
        if seconds is not None:
            self.worker_stop_seconds = seconds
        return self.worker.returncode

    def stop_checked(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """A graceful stop of the gateway and then of its worker that raises ``StopFailed`` (both tried) unless each
        exits 0 within ``timeout``: a test that must fail when its gateway does not stop cleanly calls this."""
        failures = []
        for what, process in ((f"gateway on port {self.port}", self.process), ("its celery worker", self.worker)):
            try:
                stop_process_checked(process, what, timeout=timeout)
            except StopFailed as failure:
                failures.append(str(failure))
        if failures:
            raise StopFailed("; ".join(failures))

    def kill_worker(self) -> None:
        self.stop_worker(signal.SIGKILL, 10)

    def remove_state(self) -> None:
        """The state folder (logs, SQLite files) once the processes are stopped: a server from ``start_gateway``
        owns it."""
        remove_scratch_dir(self.state_dir)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


@dataclass
class GatewayLaunch:
    """A gateway's environment, scratch state directory (its logs) and port, before ``manage.py serve``."""

    env: dict[str, str]
    state_dir: str
    port: int

    @classmethod
    def prepare(
        cls,
        *,
        settings: Mapping[str, str] | None = None,
        port: int | None = None,
        token: str = TEST_TOKEN,
        clean_env: bool = False,
        state_prefix: str = "gateway-state-",
    ) -> GatewayLaunch:
        """A fresh state directory and the environment: this process's (without ``PROFILE_ENV_PREFIXES`` when
        ``clean_env``), the state dir, ``token``, then ``settings``, which win. Without a ``DATABASE_URL`` or
        ``REDIS_URL`` among them, a clean environment is the embedded profile of ``./dev run``: SQLite in the
        state dir, in-memory channel layer and cache, in-process turns."""
        state_dir = make_scratch_dir(state_prefix)
        inherited = {k: v for k, v in os.environ.items() if not (clean_env and k.startswith(PROFILE_ENV_PREFIXES))}
        # The browser tests allow themselves async-unsafe queries (tests/browser/conftest.py); a gateway keeps
        # Django's check whatever the test process allows itself.
        inherited.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        env = {
            **inherited,
            "OPENCLAW_STATE_DIR": state_dir,
            "OPENCLAW_GATEWAY_TOKEN": token,
            "PYTHONUNBUFFERED": "1",
            **(settings or {}),
        }
        return cls(env=env, state_dir=state_dir, port=port or free_port())

    @property
    def token(self) -> str:
        return self.env["OPENCLAW_GATEWAY_TOKEN"]

    def manage(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """``manage.py <args>`` with the gateway's environment; raises when it fails."""
        result = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        return result

    def migrate(self) -> None:
        """Both stores: the gateway database and the native harness store."""
        self.manage("migrate", "--verbosity", "0", "--no-input")
        self.manage("migrate", "--database", "harness", "--verbosity", "0", "--no-input")

    def start(self, *, worker: bool = True, worker_concurrency: int = 4, timeout: float = 30.0) -> GatewayServer:
        """``manage.py serve``, plus a Celery worker when ``worker`` and the task mode is celery; returns once the
        port accepts connections. On failure nothing started is left running."""
        log_path = os.path.join(self.state_dir, "gateway.log")
        argv = [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(self.port)]
        process = _spawn(argv, self.env, log_path)
        server = GatewayServer(process, self.port, self.token, self.state_dir, log_path, self.env)
        try:
            if worker and task_mode(self.env) == "celery":
                # Started while the gateway boots: both take seconds, and the gateway does not need it to listen.
                server.worker, server.worker_log_path = start_celery_worker(
                    self.env, self.state_dir, concurrency=worker_concurrency
                )
            _wait_ready(
                process,
                lambda: _listens(self.port),
                what=f"gateway on port {self.port}",
                timeout=timeout,
                log_path=log_path,
                poll=0.05,
            )
        except BaseException:
            server.kill()
            raise
        return server

    def remove_state(self) -> None:
        remove_scratch_dir(self.state_dir)


def gateway_settings_for_tests(port: int) -> dict[str, str]:
    """What a test gateway needs on top of the test run's environment: the databases pytest-django created."""
    return {
        "DATABASE_URL": current_database_url(),
        "HARNESS_DATABASE_URL": current_database_url("harness"),
        "DB_CONN_MAX_AGE": "60",
        # The periodic sweeps would change the rows a test is in the middle of (the test and its gateway
        # share the test database); they are tested directly and through startup recovery.
        "OPENCLAW_SWEEP_INTERVAL_MS": "3600000",
        # A node's connect refused for a pending pairing is answered at once, as tests of refusals expect; the
        # tests of the hold (tests/e2e/test_node_pairing_reconnect.py) turn it on.
        "OPENCLAW_PAIRING_HOLD_MS": "0",
        # Each test gateway has its own Celery worker and queue: a worker started with another
        # gateway's settings (say, another model provider) must not take this gateway's turns.
        "OPENCLAW_CELERY_QUEUE": f"openclaw-{port}",
        # Gateways of one test worker share a channel layer (multi-process tests need that);
        # gateways of different xdist workers must not see each other's broadcasts.
        "OPENCLAW_REDIS_PREFIX": f"{os.environ.get('OPENCLAW_REDIS_PREFIX', 'openclaw')}-"
        f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}",
    }


def start_gateway(
    *, extra_env: dict[str, str] | None = None, port: int | None = None, worker: bool = True
) -> GatewayServer:
    """A gateway (and its worker) for a test, on the test databases, with ``extra_env`` over the defaults."""
    port = port or free_port()
    launch = GatewayLaunch.prepare(settings={**gateway_settings_for_tests(port), **(extra_env or {})}, port=port)
    try:
        return launch.start(worker=worker)
    except BaseException:
        launch.remove_state()
        raise


def stop_and_remove(servers: list[GatewayServer]) -> None:
    """Stop each server and remove its state folder, every one tried whatever the others did; then raise what
    failed (a test's gateways, at its end)."""
    failures: list[Exception] = []
    for server in servers:
        for step in (server.stop, server.remove_state):
            try:
                step()
            except Exception as failure:  # collected and raised together: none is swallowed
                failures.append(failure)
    if failures:
        raise ExceptionGroup("stopping the test's gateways failed", failures)


def delete_redis_keys(redis_url: str, prefix: str) -> int:
    """Delete every key of a test run's Redis prefix: ``<prefix>:…`` (the test processes) and ``<prefix>-…`` (the
    gateways and workers they started, one prefix per pytest worker). SCAN + DEL, never KEYS or FLUSHDB: other runs
    and deployments may share the server. Returns how many keys were deleted."""
    import redis

    if not prefix.startswith("openclaw-test-"):
        raise ValueError(f"not a test run's Redis prefix: {prefix!r}")
    client = redis.Redis.from_url(redis_url)
    deleted = 0
    try:
        for pattern in (f"{prefix}:*", f"{prefix}-*"):
            batch: list[bytes] = []
            for key in client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    deleted += client.delete(*batch)
                    batch.clear()
            if batch:
                deleted += client.delete(*batch)
    finally:
        client.close()
    return deleted


def drop_test_databases(database_url: str, names: list[str]) -> list[str]:
    """Drop the PostgreSQL test databases pytest-django made from these database names (``test_<name>`` and the
    ``test_<name>_gw<n>`` of each xdist worker) that a killed run left behind; pytest-django drops them itself when
    the run ends normally. Returns the names dropped."""
    import psycopg
    from psycopg import sql

    server = urllib.parse.urlsplit(database_url)._replace(path="/postgres", query="", fragment="")
    dropped = []
    with psycopg.connect(urllib.parse.urlunsplit(server), autocommit=True) as conn:
        existing = [row[0] for row in conn.execute("SELECT datname FROM pg_database")]
        for name in existing:
            if any(re.fullmatch(rf"test_{re.escape(base)}(_gw\d+)?", name) for base in names):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
                dropped.append(name)
    return dropped


def cleanup_test_run() -> None:
    """What ``./dev test`` runs when the run ends, whatever its outcome (its EXIT trap): the launchers' folders that
    the run's tests left in the temp directory (reported, then removed; only this run's, by its id), the run's Redis
    keys and the test databases of the PostgreSQL databases it named (``OPENCLAW_TEST_RUN_DATABASES``, space
    separated)."""
    strays = stray_scratch_dirs(os.environ.get(TEST_RUN_ID_ENV, ""))
    if strays:
        print(
            f"test run cleanup: {len(strays)} folders left behind by tests, removed: {' '.join(map(str, strays))}",
            file=sys.stderr,
        )
        for stray in strays:
            shutil.rmtree(stray, ignore_errors=True)
    redis_url, prefix = os.environ.get("REDIS_URL", ""), os.environ.get("OPENCLAW_REDIS_PREFIX", "")
    if redis_url and prefix:
        print(f"test run cleanup: {delete_redis_keys(redis_url, prefix)} Redis keys of {prefix}", file=sys.stderr)
    names = os.environ.get("OPENCLAW_TEST_RUN_DATABASES", "").split()
    if names and os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        dropped = drop_test_databases(os.environ["DATABASE_URL"], names)
        if dropped:
            print(f"test run cleanup: dropped left-over test databases {', '.join(dropped)}", file=sys.stderr)


@dataclass
class MockOpenAIProcess:
    """``tests/support/mock_openai.py`` as a process of its own (echo replies unless scripted over HTTP)."""

    process: subprocess.Popen
    base_url: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def requests(self) -> list[dict[str, Any]]:
        """The chat completion requests it received (``GET /_mock/requests``)."""
        root = self.base_url.removesuffix("/v1")
        with urllib.request.urlopen(f"{root}/_mock/requests", timeout=30) as response:
            return json.loads(response.read())["requests"]

    def _control(self, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        root = self.base_url.removesuffix("/v1")
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(f"{root}{path}", data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def hold(self, *markers: str) -> None:
        """Requests whose last user message carries one of ``markers`` wait until released."""
        self._control("/_mock/hold", {"markers": list(markers)})

    def release(self, marker: str) -> None:
        self._control("/_mock/release", {"marker": marker})

    def release_all(self) -> None:
        self._control("/_mock/release", {"all": True})

    def has_held(self, marker: str) -> bool:
        """Is a request carrying ``marker`` waiting now?"""
        return marker in self._control("/_mock/held")["held"]

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.process, timeout=timeout)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def stop_checked(self, timeout: float = 10.0) -> None:
        """``stop`` that raises ``StopFailed`` unless the mock ends on SIGTERM within ``timeout`` (it has no handler
        of its own: SIGTERM's default action is its clean end)."""
        try:
            stop_process_checked(
                self.process,
                f"mock OpenAI server {self.base_url}",
                clean_exit_codes=(0, -signal.SIGTERM),
                timeout=timeout,
            )
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()


def start_mock_openai(*, timeout: float = 30.0) -> MockOpenAIProcess:
    """Start the mock and return once it printed its URL (its first line)."""
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "support" / "mock_openai.py"), "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdout is not None
    line = ""
    # select before readline: a mock that hangs before printing must not block past the timeout.
    if select.select([process.stdout], [], [], timeout)[0]:
        line = process.stdout.readline().decode("utf-8", "replace").strip()
    if line.startswith(MOCK_URL_PREFIX):
        return MockOpenAIProcess(process, line.removeprefix(MOCK_URL_PREFIX))
    stop_process(process, signal.SIGKILL, 5)
    process.stdout.close()
    raise RuntimeError(f"mock OpenAI server did not announce its URL (exit code {process.poll()})")


def manage_check(state_dir, **env: str) -> subprocess.CompletedProcess[str]:
    """``manage.py check`` on the embedded default (no inherited profile variables) plus ``env``: how a
    setting is validated at start."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCLAW_", "DJANGO_"))}
    base.pop("DATABASE_URL", None)
    base.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check"],
        cwd=ROOT,
        env={**base, "OPENCLAW_STATE_DIR": str(state_dir), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


PAIRING_ANNOUNCEMENT = re.compile(r"waiting for pairing approval: request (\S+)")


@dataclass
class NodeHostProcess:
    """The project's node host (``python -m openclaw_client.node``) in its own process."""

    process: subprocess.Popen
    state_dir: str
    log_path: str
    argv: list[str]
    env: dict[str, str]

    def log(self) -> str:
        return read_log(self.log_path)

    def pairing_request(self, timeout: float = 30.0) -> str:
        """The id of the pairing request the node announced (it waits for an operator's approval)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = PAIRING_ANNOUNCEMENT.search(self.log())
            if match:
                return match.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"the node host announced no pairing request:\n{self.log()}")

    def invokes(self, command: str) -> int:
        """How many ``command`` invokes the node received (it logs one line per invoke), over all its runs."""
        return len(re.findall(rf"invoke {re.escape(command)} id=", self.log()))

    @property
    def journal_path(self) -> str:
        return os.path.join(self.state_dir, "journal.jsonl")

    def journal(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The node host's journal (``--journal``: invoke errors, removal clean-ups, publishes), of one kind."""
        try:
            with open(self.journal_path, encoding="utf-8") as journal:
                records = [json.loads(line) for line in journal if line.strip()]
        except FileNotFoundError:
            return []
        return [record for record in records if kind is None or record["kind"] == kind]

    def publish_inventory(self, timeout: float = 30.0) -> dict[str, Any]:
        """Ask the running node host to declare its worker host again on its current connection (``SIGUSR1``);
        returns the outcome it journaled."""
        before = len(self.journal("inventory-publish"))
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while len(published := self.journal("inventory-publish")) == before:
            if time.monotonic() >= deadline or self.process.poll() is not None:
                raise RuntimeError(f"the node host journaled no inventory publish:\n{self.log()}")
            time.sleep(0.05)
        return published[before]

    def wait_for_workers_idle(self, timeout: float = 60.0) -> None:
        """Until the node host's worker children run no turn (seed 004's ``waitForWorkersIdle``): asked through
        its own control surface, a republished inventory whose journal record counts the turns in flight."""
        deadline = time.monotonic() + timeout
        while (published := self.publish_inventory(timeout=max(1.0, deadline - time.monotonic()))).get(
            "runsInFlight"
        ) != 0:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the node host's workers never went idle: {published}\n{self.log()}")
            time.sleep(0.1)

    def connects(self) -> int:
        """How many times the node host connected (and declared its worker host), over all its runs."""
        return len(re.findall(r"connected to \S+ as node ", self.log()))

    def wait_connects(self, count: int, timeout: float = 30.0) -> None:
        """Until the node host connected ``count`` times in all."""
        deadline = time.monotonic() + timeout
        while self.connects() < count:
            if time.monotonic() >= deadline or self.process.poll() is not None:
                raise RuntimeError(f"the node host did not connect:\n{self.log()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        stop_process(self.process, sig)
        return self.process.returncode

    def remove_state(self) -> None:
        """The state folder (identity, bundles, workspaces, log) once the process is stopped: a node host started
        without a ``state_dir`` of the caller's owns it."""
        remove_scratch_dir(self.state_dir)

    def start_again(self) -> None:
        """Start the node host again with the same state dir (identity, token, bundles, workspaces)."""
        if self.process.poll() is None:
            raise RuntimeError("the node host is still running")
        self.process = _spawn(self.argv, self.env, self.log_path, append=True)


def start_node_host(
    server: GatewayServer,
    *,
    capacity: int = 2,
    capacity_wait_ms: int = 750,
    gateway_url: str | None = None,
    state_dir: str | None = None,
) -> NodeHostProcess:
    """A node host for ``server`` (at ``gateway_url``, default its own URL), with a fresh state dir unless
    one is given; the shared token comes from the environment."""
    state_dir = state_dir or make_scratch_dir("node-host-")
    log_path = os.path.join(state_dir, "node-host.log")
    argv = [
        sys.executable,
        "-m",
        "openclaw_client.node",
        "--gateway",
        gateway_url or server.url,
        "--state-dir",
        state_dir,
        "--capacity",
        str(capacity),
        "--capacity-wait-ms",
        str(capacity_wait_ms),
        "--name",
        "test-node-host",
        "--journal",
        os.path.join(state_dir, "journal.jsonl"),
    ]
    env = {**os.environ, "OPENCLAW_GATEWAY_TOKEN": server.token, "PYTHONUNBUFFERED": "1"}
    return NodeHostProcess(_spawn(argv, env, log_path), state_dir, log_path, argv, env)


CLUSTER_READY = re.compile(r"^cluster\s+\| ready: (\S+)", re.MULTILINE)
# `gateways:gateway-1   RUNNING   pid 4242, uptime 0:00:07` (the group prefix, when there is one, dropped).
SUPERVISOR_STATUS = re.compile(
    r"^(?:[^\s:]+:)?(?P<name>\S+)\s+(?P<state>[A-Z]+)(?:\s+pid (?P<pid>\d+),)?", re.MULTILINE
)


@dataclass
class ClusterProcess:
    """``manage.py cluster`` (the documented ``./dev cluster``): HAProxy on ``port`` in front of the gateway
    processes, Celery workers and beat. ``url`` and ``token`` are the balancer's, as clients see them."""

    process: subprocess.Popen
    port: int
    token: str
    state_dir: str
    log_path: str
    env: dict[str, str] = field(repr=False, default_factory=dict)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return read_log(self.log_path)

    @property
    def supervisord_config(self) -> Path:
        return Path(self.state_dir) / "cluster" / "supervisord.conf"

    def supervisorctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``supervisorctl -c <state dir>/cluster/supervisord.conf …``, as docs/deployment.md tells operators."""
        return subprocess.run(
            [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(self.supervisord_config), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def processes(self) -> dict[str, dict[str, Any]]:
        """``{name: {"state", "pid"}}`` as ``supervisorctl status`` reports them (pid None unless running)."""
        status = self.supervisorctl("status")
        # 3: some process is not running (LSB status codes); its line is still there.
        if status.returncode not in (0, 3):
            raise RuntimeError(f"supervisorctl status failed ({status.returncode}):\n{status.stdout}{status.stderr}")
        return {
            match["name"]: {"state": match["state"], "pid": int(match["pid"]) if match["pid"] else None}
            for match in SUPERVISOR_STATUS.finditer(status.stdout)
        }

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> None:
        """One of the cluster's processes (by pid, one supervisord started)."""
        if pid not in {entry["pid"] for entry in self.processes().values()}:
            raise ValueError(f"pid {pid} is not one of the cluster's processes")
        os.kill(pid, sig)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGINT, as Ctrl-C: supervisord stops every process it started."""
        stop_process(self.process, signal.SIGINT, timeout)
        return self.process.returncode

    def remove_state(self) -> None:
        remove_scratch_dir(self.state_dir)


def start_cluster(
    settings: Mapping[str, str],
    *,
    gateways: int = 2,
    workers: int = 1,
    worker_concurrency: int = 2,
    extra_args: tuple[str, ...] = (),
    clean_env: bool = False,
    timeout: float = 90.0,
) -> ClusterProcess:
    """``manage.py cluster`` with ``settings`` over this process's environment; returns once it says ready
    (HAProxy up, every gateway process answering its health check). Backends on free ports."""
    launch = GatewayLaunch.prepare(settings=settings, clean_env=clean_env, state_prefix="cluster-state-")
    first_backend = free_consecutive_ports(gateways)
    log_path = os.path.join(launch.state_dir, "cluster.log")
    argv = [
        sys.executable,
        str(ROOT / "manage.py"),
        "cluster",
        "--port",
        str(launch.port),
        "--backend-port",
        str(first_backend),
        "--gateways",
        str(gateways),
        "--workers",
        str(workers),
        "--worker-concurrency",
        str(worker_concurrency),
        "--haproxy",
        os.environ.get("OPENCLAW_HAPROXY", "/usr/sbin/haproxy"),
        *extra_args,
    ]
    # Appending: supervisord writes the console's lines through /dev/stdout, an open file of its own on this log.
    process = _spawn(argv, launch.env, log_path, append=True)
    cluster = ClusterProcess(process, launch.port, launch.token, launch.state_dir, log_path, launch.env)
    try:
        _wait_ready(
            process,
            lambda: CLUSTER_READY.search(read_log(log_path)) is not None,
            what="cluster",
            timeout=timeout,
            log_path=log_path,
            poll=0.1,
        )
    except BaseException:
        cluster.stop()
        cluster.remove_state()
        raise
    return cluster
