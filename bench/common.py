"""Shared pieces of the benchmarks in ``bench/``: the gateway (and Celery worker, mock model) processes,
scratch services, ``/proc`` readings, statistics and table formatting.

The benchmarks are run as scripts (``.venv/bin/python bench/<name>.py``); each puts the repository root on
``sys.path`` before importing this module as ``bench.common``.
"""

from __future__ import annotations

import os
import platform
import re
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from openclaw_client.client import ClientOptions, GatewayClient  # noqa: E402  (the root must be importable first)
from openclaw_client.identity import DeviceIdentity  # noqa: E402

SCOPES = ["operator.admin", "operator.read", "operator.write", "operator.approvals", "operator.pairing"]
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
# Inherited variables that would change the profile under test; the benchmark sets its own.
STRIPPED_ENV_PREFIXES = ("OPENCLAW_", "DATABASE_URL", "REDIS_URL", "DJANGO_DEBUG")
POSTGRES_SCHEMES = ("postgres", "postgresql", "pgsql")


# --- statistics -------------------------------------------------------------------------------


def summarize(samples_s: list[float]) -> dict[str, float]:
    """n, mean, min, p50, p90, p99 and max of durations in seconds, reported in milliseconds."""
    ms = [s * 1000 for s in samples_s]
    if not ms:
        return {"n": 0}
    if len(ms) == 1:
        cuts = ms * 99
    else:
        cuts = statistics.quantiles(ms, n=100, method="inclusive")
    return {
        "n": len(ms),
        "mean": statistics.fmean(ms),
        "min": min(ms),
        "p50": cuts[49],
        "p90": cuts[89],
        "p99": cuts[98],
        "max": max(ms),
    }


def own_cpu_seconds() -> float:
    """User + system CPU of this process (all its threads) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- /proc readings of a process ---------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return text[text.rfind(")") + 2 :].split()


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def _status_kib(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def rss_mib(pid: int) -> float:
    """VmRSS of the process and its children, in MiB."""
    return sum(_status_kib(p, "VmRSS") for p in process_tree(pid)) / 1024


def peak_rss_mib(pid: int) -> float:
    """VmHWM (peak RSS) of the process itself, in MiB."""
    return _status_kib(pid, "VmHWM") / 1024


def thread_count(pid: int) -> int:
    return _status_kib(pid, "Threads")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of the process (all threads) and its live children."""
    ticks = 0
    for p in process_tree(pid):
        fields = _stat_fields(p)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


# --- services: a scratch PostgreSQL database and a Redis key prefix ---------------------------


def is_postgres_url(url: str | None) -> bool:
    return bool(url) and urlsplit(url or "").scheme in POSTGRES_SCHEMES


class ScratchPostgres:
    """A fresh database on the server of ``server_url``, dropped by :meth:`drop`."""

    def __init__(self, server_url: str, suffix: str = ""):
        parts = urlsplit(server_url)
        self.name = f"openclaw_bench_{os.getpid()}{suffix}"
        self.admin_url = urlunsplit(parts._replace(path="/postgres"))
        self.url = urlunsplit(parts._replace(path=f"/{self.name}"))
        self.server_version = ""
        self.created = False

    def create(self) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            self.server_version = str(conn.execute("SHOW server_version").fetchone()[0])
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(self.name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        self.created = True

    def drop(self) -> None:
        if not self.created:
            return
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))
        self.created = False


class ScratchRedisPrefix:
    """A key prefix of its own on the Redis of ``url``; :meth:`cleanup` deletes its keys."""

    def __init__(self, url: str):
        self.url = url
        self.prefix = f"openclaw_bench_{os.getpid()}_{secrets.token_hex(3)}"
        self.server_version = ""

    def check(self) -> None:
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            self.server_version = str(client.info("server").get("redis_version", ""))
        finally:
            client.close()

    def cleanup(self) -> int:
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            keys = list(client.scan_iter(match=f"{self.prefix}*", count=500))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
            return len(keys)
        finally:
            client.close()

    def server_stats(self) -> dict[str, int]:
        """Server-wide counters of ``INFO stats`` (connections received, commands processed)."""
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            info = client.info("stats")
            return {
                "connections": int(info.get("total_connections_received", 0)),
                "commands": int(info.get("total_commands_processed", 0)),
            }
        finally:
            client.close()


# --- processes --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(process: subprocess.Popen[bytes] | None, timeout: float = STOP_TIMEOUT_S) -> float | None:
    """SIGTERM, then SIGKILL after ``timeout``; the seconds it took, None when it had already exited."""
    if process is None or process.poll() is not None:
        return None
    started = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
    return time.perf_counter() - started


def read_log(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def count_errors(text: str, marker: str = " ERROR ") -> dict[str, int]:
    """Log lines holding ``marker``, by the message after it, in order of appearance."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if marker in line:
            message = line.split(marker, 1)[1]
            counts[message] = counts.get(message, 0) + 1
    return counts


class GatewayProcess:
    """``manage.py migrate`` then ``manage.py serve`` in a fresh state directory."""

    READY_PATTERN = re.compile(r"listening on (\S+) \(database: ([^,]+), channel layer: ([^)]+)\)")

    def __init__(
        self,
        *,
        database_url: str | None,
        redis_url: str | None,
        redis_prefix: str | None,
        extra_env: dict[str, str] | None = None,
    ):
        self.state_dir = tempfile.mkdtemp(prefix="openclaw-bench-state-")
        self.port = free_port()
        self.token = secrets.token_urlsafe(32)
        self.log_path = Path(self.state_dir) / "gateway.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(STRIPPED_ENV_PREFIXES)}
        env.update(
            OPENCLAW_STATE_DIR=self.state_dir,
            OPENCLAW_GATEWAY_TOKEN=self.token,
            PYTHONUNBUFFERED="1",
        )
        if database_url:
            env["DATABASE_URL"] = database_url
        if redis_url:
            env["REDIS_URL"] = redis_url
            env["OPENCLAW_REDIS_PREFIX"] = redis_prefix or "openclaw_bench"
        env.update(extra_env or {})
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.stop_seconds: float | None = None
        self.returncode: int | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        return read_log(self.log_path)

    def manage(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """``manage.py <args>`` with the gateway's environment; raises when it fails."""
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
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
        self.manage("migrate", "--verbosity", "0", "--no-input")
        self.manage("migrate", "--database", "harness", "--verbosity", "0", "--no-input")

    def start(self) -> None:
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "serve", "--port", str(self.port)],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.process.returncode}:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(
            f"gateway did not listen on port {self.port} within {STARTUP_TIMEOUT_S:.0f} s:\n{self.log()}"
        )

    def ready_line(self, timeout: float = 5.0) -> tuple[str, str] | None:
        """(database, channel layer) as the gateway announced them when ready."""
        deadline = time.monotonic() + timeout
        while True:
            match = self.READY_PATTERN.search(self.log())
            if match or time.monotonic() >= deadline:
                return (match.group(2), match.group(3)) if match else None
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM (the gateway's graceful shutdown), then SIGKILL after STOP_TIMEOUT_S."""
        seconds = stop_process(self.process)
        if seconds is not None:
            self.stop_seconds = seconds
            assert self.process is not None
            self.returncode = self.process.returncode

    def error_counts(self) -> dict[str, int]:
        """ERROR records of the gateway log, by message (timestamps stripped), in order of appearance."""
        return count_errors(self.log())

    def remove_state(self) -> None:
        shutil.rmtree(self.state_dir, ignore_errors=True)


class CeleryWorker:
    """The Celery worker that runs a gateway's turns (task mode "celery"), with the gateway's environment.

    Started like ``tests/support/processes.py`` starts it (thread pool, no heartbeat/gossip/mingle), logging to
    ``celery.log`` in the gateway's state directory.
    """

    READY_TIMEOUT_S = 60.0

    def __init__(self, env: dict[str, str], state_dir: str, *, concurrency: int = 8):
        self.env = env
        self.concurrency = concurrency
        self.log_path = Path(state_dir) / "celery.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.stop_seconds: float | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        return read_log(self.log_path)

    def start(self) -> None:
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "openclaw_site",
                    "worker",
                    "--loglevel",
                    "INFO",
                    "--pool",
                    "threads",
                    "--concurrency",
                    str(self.concurrency),
                    "--without-heartbeat",
                    "--without-gossip",
                    "--without-mingle",
                ],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + self.READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"celery worker exited with {self.process.returncode}:\n{self.log()}")
            if " ready." in self.log():
                return
            time.sleep(0.1)
        raise RuntimeError(f"celery worker not ready within {self.READY_TIMEOUT_S:.0f} s:\n{self.log()}")

    def stop(self) -> None:
        seconds = stop_process(self.process)
        if seconds is not None:
            self.stop_seconds = seconds
            assert self.process is not None
            self.returncode = self.process.returncode

    def error_counts(self) -> dict[str, int]:
        """ERROR records of the worker log (``[time: ERROR/<process>] message``), by message."""
        counts: dict[str, int] = {}
        for message, count in count_errors(self.log(), ": ERROR/").items():
            message = message.split("] ", 1)[-1]
            counts[message] = counts.get(message, 0) + count
        return counts


class MockOpenAIProcess:
    """``tests/support/mock_openai.py --port 0`` as a process of its own (echo replies, no delay)."""

    URL_PREFIX = "MOCK_OPENAI_URL="

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.base_url = ""

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 30.0) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "support" / "mock_openai.py"), "--port", "0"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        # The URL is the first line; a mock that dies before printing it ends the read with EOF.
        while time.monotonic() < deadline:
            line = self.process.stdout.readline().decode("utf-8", "replace").strip()
            if line.startswith(self.URL_PREFIX):
                self.base_url = line[len(self.URL_PREFIX) :]
                return
            if not line and self.process.poll() is not None:
                break
        raise RuntimeError(f"mock OpenAI server did not announce its URL (exit code {self.process.poll()})")

    def request_count(self) -> int:
        """How many chat completions the mock answered (``GET /_mock/requests``)."""
        import json
        import urllib.request

        root = self.base_url.removesuffix("/v1")
        with urllib.request.urlopen(f"{root}/_mock/requests", timeout=30) as response:
            return len(json.loads(response.read())["requests"])

    def stop(self) -> None:
        stop_process(self.process, timeout=10)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()


# --- client side ------------------------------------------------------------------------------


def client_for(url: str, token: str, identity: DeviceIdentity | None = None) -> GatewayClient:
    return GatewayClient(
        ClientOptions(url=url, token=token, scopes=list(SCOPES), identity=identity or DeviceIdentity.generate())
    )


async def connected_client(url: str, token: str) -> GatewayClient:
    client = client_for(url, token)
    await client.connect()
    return client


# --- environment and output -------------------------------------------------------------------


def package_versions() -> dict[str, str]:
    versions = {}
    for name in ("django", "channels", "daphne", "channels-redis", "websockets"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "-"
    return versions


def base_environment(
    *,
    announced: tuple[str, str] | None,
    facts: dict[str, Any],
    postgres: ScratchPostgres | None,
    redis_prefix: ScratchRedisPrefix | None,
    redis_url: str | None,
) -> dict[str, Any]:
    """What was measured: database, channel layer, gateway version, interpreter, machine, packages.

    ``announced`` is :meth:`GatewayProcess.ready_line`; ``facts`` holds ``gatewayVersion``, ``protocol`` and
    ``databaseVendor`` as the gateway reported them (hello-ok, ``health``).
    """
    return {
        "database": announced[0] if announced else facts["databaseVendor"],
        "databaseVendor": facts["databaseVendor"],
        "databaseServerVersion": postgres.server_version if postgres else None,
        "databaseName": postgres.name if postgres else None,
        "channelLayer": announced[1] if announced else ("Redis" if redis_url else "in-memory"),
        "redisServerVersion": redis_prefix.server_version if redis_prefix else None,
        "redisPrefix": redis_prefix.prefix if redis_prefix else None,
        "gatewayVersion": facts["gatewayVersion"],
        "protocol": facts["protocol"],
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "cpuCount": os.cpu_count(),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "packages": package_versions(),
    }


def environment_lines(env: dict[str, Any]) -> list[str]:
    """The header lines under a benchmark's title (``env`` as :func:`base_environment` plus ``gatewayPid``)."""
    database = env["database"]
    if env["databaseServerVersion"]:
        database += f" {env['databaseServerVersion']} (scratch database {env['databaseName']})"
    layer = env["channelLayer"]
    if env["redisServerVersion"]:
        layer += f" {env['redisServerVersion']} (prefix {env['redisPrefix']})"
    packages = ", ".join(f"{name} {version}" for name, version in env["packages"].items())
    return [
        f"  gateway        {env['gatewayVersion']} (protocol {env['protocol']}), pid {env['gatewayPid']}",
        f"  database       {database}",
        f"  channel layer  {layer}",
        f"  python         {env['python']} (gateway and client)",
        f"  cpus           {env['cpuCount']} ({env['platform']})",
        f"  packages       {packages}",
    ]


def progress(message: str) -> None:
    print(f"... {message}", file=sys.stderr, flush=True)


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:8.2f}"


LATENCY_COLUMNS = ("p50", "p90", "p99", "mean", "max")


def latency_header(title: str, width: int = 36) -> str:
    return f"{title:<{width}}{'n':>6}" + "".join(f"{key:>9}" for key in LATENCY_COLUMNS)


def latency_row(label: str, stats: dict[str, float], width: int = 36) -> str:
    return f"{label:<{width}}{stats['n']:>6}" + "".join(f"{fmt_ms(stats.get(key)):>9}" for key in LATENCY_COLUMNS)
