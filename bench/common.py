"""Shared pieces of the benchmarks in ``bench/``: the benchmark profile of a gateway, scratch services, ``/proc``
readings, statistics and table formatting. The processes themselves (gateway, Celery worker, mock model) are
started by ``tests/support/processes.py``, the launcher the end-to-end tests use.

The benchmarks are run as scripts (``.venv/bin/python bench/<name>.py``); each puts the repository root on
``sys.path`` before importing this module as ``bench.common``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import secrets
import signal
import statistics
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from openclaw_client.client import ClientOptions, GatewayClient  # noqa: E402  (the root must be importable first)
from openclaw_client.identity import DeviceIdentity  # noqa: E402
from tests.support.clients import ALL_SCOPES  # noqa: E402
from tests.support.processes import GatewayLaunch  # noqa: E402

# A gateway on a slow machine (or PostgreSQL) may take longer than the tests allow.
STARTUP_TIMEOUT_S = 60.0
# The environment of a gateway whose process also serves the framework floor (bench/floor.py, bench/asgi.py) at
# FLOOR_PATH: the project's settings with the benchmarks' ASGI application, still started by ``manage.py serve``.
FLOOR_SETTINGS = {"DJANGO_SETTINGS_MODULE": "bench.settings"}
FLOOR_PATH = "/bench/floor"
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


# --- processes: tests/support/processes.py launches them; the benchmark's profile is a clean environment ------


def bench_gateway(
    *,
    database_url: str | None,
    redis_url: str | None,
    redis_prefix: str | None,
    extra_env: dict[str, str] | None = None,
) -> GatewayLaunch:
    """A gateway in a fresh state directory with a random token, on exactly the profile the command line asks for:
    inherited ``OPENCLAW_*``, ``DATABASE_URL``, ``REDIS_URL`` and ``DJANGO_DEBUG`` are left out (so without URLs it
    is the embedded profile of ``./dev run``). Not migrated or started yet."""
    settings: dict[str, str] = {}
    if database_url:
        settings["DATABASE_URL"] = database_url
    if redis_url:
        settings["REDIS_URL"] = redis_url
        settings["OPENCLAW_REDIS_PREFIX"] = redis_prefix or "openclaw_bench"
    return GatewayLaunch.prepare(
        settings={**settings, **(extra_env or {})},
        token=secrets.token_urlsafe(32),
        clean_env=True,
        state_prefix="openclaw-bench-state-",
    )


def count_errors(text: str, marker: str = " ERROR ") -> dict[str, int]:
    """Log lines holding ``marker``, by the message after it, in order of appearance."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if marker in line:
            message = line.split(marker, 1)[1]
            counts[message] = counts.get(message, 0) + 1
    return counts


def worker_error_counts(text: str) -> dict[str, int]:
    """ERROR records of a Celery worker log (``[time: ERROR/<process>] message``), by message."""
    counts: dict[str, int] = {}
    for message, count in count_errors(text, ": ERROR/").items():
        message = message.split("] ", 1)[-1]
        counts[message] = counts.get(message, 0) + count
    return counts


# --- client side ------------------------------------------------------------------------------


def client_for(url: str, token: str, identity: DeviceIdentity | None = None) -> GatewayClient:
    return GatewayClient(
        ClientOptions(url=url, token=token, scopes=list(ALL_SCOPES), identity=identity or DeviceIdentity.generate())
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

    ``announced`` is :meth:`GatewayServer.announced`; ``facts`` holds ``gatewayVersion``, ``protocol`` and
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


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_benchmark(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace, contextlib.ExitStack], dict[str, Any]],
    render: Callable[[dict[str, Any], argparse.Namespace], str],
) -> int:
    """A benchmark's main: ``run`` with its cleanups, then its JSON (first: a figure the table cannot show must
    not lose the run) and its table. SIGTERM and SIGHUP unwind like Ctrl-C, so the cleanups run; SIGINT gets the
    same handler: with Python's default one, asyncio.run only cancels its task, which a client call may swallow."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    with contextlib.ExitStack() as cleanups:
        report = run(args, cleanups)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        progress(f"results written to {args.json}")
    print(render(report, args))
    return 0
