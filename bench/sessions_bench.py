"""Sessions and chat benchmark: sessions.list/describe at 10 and 10,000 sessions, chat.send→agent.wait turns.

Starts a gateway as a subprocess like ``bench/gateway_bench.py`` (embedded profile by default; PostgreSQL and
Redis when their URLs are given, then also a Celery worker that runs the turns), drives it with
:class:`openclaw_client.client.GatewayClient` and prints tables. The HTTP mock provider part runs on a second
gateway (and worker) pointed at ``tests/support/mock_openai.py``. See ``bench/README.md`` for what each figure means.

    .venv/bin/python bench/sessions_bench.py
    .venv/bin/python bench/sessions_bench.py --database-url postgres://postgres@127.0.0.1:5432/postgres \\
        --redis-url redis://127.0.0.1:6379/0 --json sessions.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402  (the repository root must be importable first)
    STARTUP_TIMEOUT_S,
    ScratchPostgres,
    ScratchRedisPrefix,
    base_environment,
    bench_gateway,
    connected_client,
    count_errors,
    environment_lines,
    fmt_ms,
    is_postgres_url,
    latency_header,
    latency_row,
    own_cpu_seconds,
    peak_rss_mib,
    process_cpu_seconds,
    progress,
    rss_mib,
    run_benchmark,
    summarize,
    thread_count,
    worker_error_counts,
)
from openclaw_client.client import ConnectionClosed, GatewayClient, GatewayError  # noqa: E402
from tests.support.processes import GatewayLaunch, GatewayServer, start_mock_openai  # noqa: E402

WORKER_CONCURRENCY = 8
# A short prompt; the echo provider and the mock both answer with the same text, streamed word by word.
CHAT_MESSAGE = "Bench turn {n}: please summarise the state of the nightly build in one short sentence."
WAIT_TIMEOUT_MS = 30_000
REQUEST_TIMEOUT_S = 60.0
SEQUENTIAL_WARMUP_TURNS = 5
LOAD_WARMUP_TURNS = 2
DRIFT_WINDOW = 20  # turns compared at the start and the end of the sequential run
SEED_PROBE_S = 5.0  # "auto" seeding decides after this long whether sessions.create is fast enough
PAGE_LIMIT = 1000  # the largest sessions.list page, for counting the stored sessions
EVENT_TAIL_QUIET_S = 1.0  # after a turns/s window: no event for this long means the backlog is delivered
EVENT_TAIL_MAX_S = 60.0

# Bulk insert of sessions through the ORM (``manage.py shell -c``), with the defaults session_create gives
# a sessions.create without options: operator-created, parent = the agent's main session, one initial window.
ORM_SEED_SCRIPT = """
import json
from django.db import transaction
from sessions_app import keys
from sessions_app.models import Session, SessionWindow, WindowReason

rows = json.load(open({path!r}, encoding="utf-8"))
for start in range(0, len(rows), 1000):
    batch = rows[start : start + 1000]
    with transaction.atomic():
        sessions = Session.objects.bulk_create(
            [
                Session(
                    key=row["key"],
                    agent_id=keys.agent_of(row["key"]),
                    label=row["label"],
                    parent_session_key=keys.main_key(keys.agent_of(row["key"])),
                    created_via="operator",
                )
                for row in batch
            ]
        )
        if any(session.pk is None for session in sessions):
            by_key = dict(Session.objects.filter(key__in=[s.key for s in sessions]).values_list("key", "pk"))
            for session in sessions:
                session.pk = by_key[session.key]
        SessionWindow.objects.bulk_create(
            [SessionWindow(id=s.session_id, session=s, reason=WindowReason.INITIAL) for s in sessions]
        )
print(len(rows))
"""


# --- one gateway (and its worker) on scratch services of its own ---------------------------------


class Deployment:
    """A gateway on a scratch PostgreSQL database and Redis prefix (when asked for), plus its Celery worker.

    :meth:`close` stops and removes everything it started and may be called more than once.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        *,
        name: str,
        suffix: str,
        extra_env: dict[str, str] | None = None,
        bootstrap: bool = False,
    ):
        self.name = name
        # ``manage.py bootstrap`` (as ``./dev run``: migrations, token, admin login) instead of ``migrate``.
        self.bootstrap = bootstrap
        self.redis_url: str | None = args.redis_url
        self.keep_state: bool = args.keep_state
        self.postgres = ScratchPostgres(args.database_url, suffix) if is_postgres_url(args.database_url) else None
        self.redis_prefix = ScratchRedisPrefix(args.redis_url) if args.redis_url else None
        self.database_url: str | None = args.database_url
        self.extra_env = extra_env or {}
        self.launch: GatewayLaunch | None = None
        self.gateway: GatewayServer | None = None
        self.announced: tuple[str, str] | None = None
        self.idle: dict[str, float | None] = {}
        self.logs: dict[str, Any] = {}
        self.closed = False

    def start(self) -> None:
        if self.postgres is not None:
            self.postgres.create()
            self.database_url = self.postgres.url
        if self.redis_prefix is not None:
            self.redis_prefix.check()
        self.launch = bench_gateway(
            database_url=self.database_url,
            redis_url=self.redis_url,
            redis_prefix=self.redis_prefix.prefix if self.redis_prefix else None,
            extra_env=self.extra_env,
        )
        if self.bootstrap:
            progress(f"{self.name}: manage.py bootstrap (as ./dev run): migrations, token, admin login")
            self.launch.manage("bootstrap", timeout=300)
        else:
            progress(f"{self.name}: migrating a fresh database")
            self.launch.migrate()
        # Task mode "celery" (REDIS_URL set, OPENCLAW_TASK_MODE not): turns run in a worker the launcher starts.
        progress(f"{self.name}: starting the gateway" + (" and its Celery worker" if self.redis_url else ""))
        self.gateway = self.launch.start(worker=True, worker_concurrency=WORKER_CONCURRENCY, timeout=STARTUP_TIMEOUT_S)
        self.announced = self.gateway.announced()
        time.sleep(0.5)  # let the processes settle before the idle reading
        worker_pid = self.worker_pid
        self.idle = {
            "gatewayRssMiB": rss_mib(self.gateway.pid),
            "workerRssMiB": rss_mib(worker_pid) if worker_pid else None,
        }

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url

    @property
    def token(self) -> str:
        assert self.gateway is not None
        return self.gateway.token

    @property
    def gateway_pid(self) -> int:
        assert self.gateway is not None
        return self.gateway.pid

    @property
    def worker_pid(self) -> int | None:
        return self.gateway.worker_pid if self.gateway is not None else None

    def memory(self) -> dict[str, Any]:
        """RSS of the gateway (and worker) now, their peaks and thread counts."""
        gateway_pid, worker_pid = self.gateway_pid, self.worker_pid
        return {
            "gatewayIdleRssMiB": self.idle.get("gatewayRssMiB"),
            "gatewayRssMiB": rss_mib(gateway_pid),
            "gatewayPeakRssMiB": peak_rss_mib(gateway_pid),
            "gatewayThreads": thread_count(gateway_pid),
            "workerIdleRssMiB": self.idle.get("workerRssMiB"),
            "workerRssMiB": rss_mib(worker_pid) if worker_pid else None,
            "workerPeakRssMiB": peak_rss_mib(worker_pid) if worker_pid else None,
            "workerThreads": thread_count(worker_pid) if worker_pid else None,
        }

    def stop(self) -> None:
        """Stop the worker, then the gateway; collect what their logs say."""
        gateway = self.gateway
        if gateway is None:
            return
        if gateway.worker is not None and not self.logs.get("workerStopped"):
            progress(f"{self.name}: stopping the Celery worker")
            gateway.stop_worker()
            errors = worker_error_counts(gateway.worker_log())
            self._record_stop("worker", gateway.worker_stop_seconds, gateway.worker.returncode, errors)
        if not self.logs.get("gatewayStopped"):
            progress(f"{self.name}: stopping the gateway")
            gateway.stop()
            self._record_stop("gateway", gateway.stop_seconds, gateway.process.returncode, count_errors(gateway.log()))

    def _record_stop(self, process: str, seconds: float | None, exit_code: int | None, errors: dict[str, int]) -> None:
        self.logs.update(
            {
                f"{process}Stopped": True,
                f"{process}StopSeconds": seconds,
                f"{process}ExitCode": exit_code,
                f"{process}ErrorRecords": sum(errors.values()),
                f"{process}ErrorsByMessage": errors,
            }
        )

    def print_log_tails(self, lines: int = 30) -> None:
        if self.gateway is None:
            return
        logs = [("gateway", self.gateway.log())]
        if self.gateway.worker is not None:
            logs.append(("celery worker", self.gateway.worker_log()))
        for label, text in logs:
            tail = text.splitlines()[-lines:]
            print(f"--- last lines of the {self.name} {label} log ---", *tail, sep="\n", file=sys.stderr)

    def close(self, *, failed: bool) -> None:
        if self.closed:
            return
        self.closed = True
        _guarded(self.stop, f"{self.name}: stopping the processes")
        if failed:
            self.print_log_tails()
        if self.launch is not None:
            if self.keep_state:
                progress(f"{self.name}: state and logs kept in {self.launch.state_dir}")
            else:
                self.launch.remove_state()
        if self.postgres is not None:
            _guarded(self.postgres.drop, f"{self.name}: dropping {self.postgres.name}")
        if self.redis_prefix is not None:
            _guarded(self.redis_prefix.cleanup, f"{self.name}: deleting the Redis keys of {self.redis_prefix.prefix}")

    def analyze(self) -> bool:
        """``ANALYZE`` the scratch PostgreSQL database (what autovacuum does within a minute or so)."""
        if self.postgres is None:
            return False
        import psycopg

        with psycopg.connect(self.postgres.url, autocommit=True) as conn:
            conn.execute("ANALYZE")
        return True

    def redis_stats(self) -> dict[str, int] | None:
        return self.redis_prefix.server_stats() if self.redis_prefix is not None else None


def _guarded(action: Callable[[], object], what: str) -> None:
    """Cleanup that must not stop the rest of the cleanup: failures become warnings."""
    try:
        action()
    except Exception as exc:
        print(f"warning: {what} failed: {type(exc).__name__}: {exc}", file=sys.stderr)


# --- client helpers ---------------------------------------------------------------------------


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, all cores, from ``/proc/stat``."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / ticks, sum(fields) / ticks


def drain_events(client: GatewayClient) -> int:
    """Discard the events the client queued (chat/agent streams of every turn); how many there were."""
    count = 0
    while True:
        try:
            client.events.get_nowait()
        except asyncio.QueueEmpty:
            return count
        count += 1


async def create_session(client: GatewayClient, label: str) -> str:
    created = await client.request("sessions.create", {"label": label})
    return str(created["key"])


async def count_sessions(client: GatewayClient) -> int:
    """Stored sessions (archived or not), by paging sessions.list."""
    total, offset = 0, 0
    while True:
        page = await client.request("sessions.list", {"limit": PAGE_LIMIT, "offset": offset, "archived": "all"})
        total += int(page["count"])
        if not page.get("hasMore"):
            return total
        offset = int(page["nextOffset"])


@dataclass
class TurnResult:
    seconds: float
    error: str | None
    events: int


async def timed_turn(client: GatewayClient, session_key: str, n: int, tag: str) -> TurnResult:
    """chat.send then agent.wait on its runId; the time from sending to the wait's response."""
    message = CHAT_MESSAGE.format(n=n)
    started = time.perf_counter()
    sent = await client.request(
        "chat.send",
        {"sessionKey": session_key, "message": message, "idempotencyKey": f"{tag}-{n}-{secrets.token_hex(4)}"},
        timeout=REQUEST_TIMEOUT_S,
    )
    waited = await client.request(
        "agent.wait", {"runId": sent["runId"], "timeoutMs": WAIT_TIMEOUT_MS}, timeout=REQUEST_TIMEOUT_S
    )
    seconds = time.perf_counter() - started
    error = None
    if waited.get("status") != "ok":
        error = f"agent.wait status {waited.get('status')}: {waited.get('error')}"
    elif waited.get("outputText") != message:
        error = f"unexpected reply {str(waited.get('outputText'))[:80]!r}"
    return TurnResult(seconds, error, drain_events(client))


# --- part 1: seeding, sessions.list and sessions.describe -----------------------------------------


@dataclass
class SeedResult:
    requested: int
    method: str = "none"  # rpc | orm | rpc+orm | none
    rpc_created: int = 0
    rpc_seconds: float = 0.0
    orm_created: int = 0
    orm_seconds: float = 0.0
    keys: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "method": self.method,
            "rpcCreated": self.rpc_created,
            "rpcSeconds": self.rpc_seconds,
            "rpcSessionsPerSecond": self.rpc_created / self.rpc_seconds if self.rpc_seconds else None,
            "ormCreated": self.orm_created,
            "ormSeconds": self.orm_seconds,
            "ormSessionsPerSecond": self.orm_created / self.orm_seconds if self.orm_seconds else None,
        }


async def seed_rpc(
    url: str, token: str, *, count: int, connections: int, first: int, budget_s: float | None
) -> tuple[list[str], float]:
    """``count`` sessions.create calls over ``connections`` connections; the keys and the seconds it took.

    With ``budget_s``, stops early once the rate seen after SEED_PROBE_S says the whole batch would take
    longer than that.
    """
    clients = await asyncio.gather(*(connected_client(url, token) for _ in range(min(connections, count))))
    keys: list[str] = []
    state = {"issued": 0, "stop": False}
    started = time.perf_counter()

    async def creator(client: GatewayClient) -> None:
        while not state["stop"] and state["issued"] < count:
            state["issued"] += 1
            keys.append(await create_session(client, f"bench session {first + state['issued']}"))
            elapsed = time.perf_counter() - started
            if budget_s is not None and elapsed > SEED_PROBE_S and count * elapsed / len(keys) > budget_s:
                state["stop"] = True

    try:
        await asyncio.gather(*(creator(client) for client in clients))
    finally:
        await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)
    return keys, time.perf_counter() - started


def seed_orm(deployment: Deployment, *, count: int, first: int) -> tuple[list[str], float]:
    """Bulk-insert ``count`` sessions through the ORM in a ``manage.py shell`` of the gateway's environment."""
    assert deployment.launch is not None
    rows = [
        {"key": f"agent:main:dashboard:{uuid.uuid4()}", "label": f"bench session {first + i + 1}"} for i in range(count)
    ]
    path = Path(deployment.launch.state_dir) / f"seed-{first}.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    started = time.perf_counter()
    deployment.launch.manage("shell", "-c", ORM_SEED_SCRIPT.format(path=str(path)), timeout=600)
    seconds = time.perf_counter() - started
    path.unlink(missing_ok=True)
    return [row["key"] for row in rows], seconds


def seed(deployment: Deployment, *, count: int, first: int, args: argparse.Namespace) -> SeedResult:
    result = SeedResult(requested=count)
    if count <= 0:
        return result
    remaining = count
    if args.seed_method in ("rpc", "auto"):
        keys, seconds = asyncio.run(
            seed_rpc(
                deployment.url,
                deployment.token,
                count=count,
                connections=args.seed_connections,
                first=first,
                budget_s=args.seed_budget if args.seed_method == "auto" else None,
            )
        )
        result.keys += keys
        result.rpc_created, result.rpc_seconds = len(keys), seconds
        remaining -= len(keys)
        result.method = "rpc"
        if remaining:
            progress(
                f"sessions.create makes {len(keys) / seconds:.0f} sessions/s: {count} would take more than "
                f"{args.seed_budget:g} s; bulk-inserting the other {remaining} through the ORM"
            )
    if remaining:
        keys, seconds = seed_orm(deployment, count=remaining, first=first + result.rpc_created)
        result.keys += keys
        result.orm_created, result.orm_seconds = len(keys), seconds
        result.method = "rpc+orm" if result.rpc_created else "orm"
    return result


async def timed_reads(client: GatewayClient, method: str, params: Callable[[], dict[str, Any]], calls: int) -> dict:
    samples, rows = [], 0
    for _ in range(calls):
        started = time.perf_counter()
        payload = await client.request(method, params())
        samples.append(time.perf_counter() - started)
        rows = int(payload["count"]) if "count" in payload else int(payload.get("session") is not None)
    return {**summarize(samples), "rows": rows}


async def session_reads(
    url: str, token: str, *, keys: list[str], stored: int, calls: int, warmup: int, seed: int
) -> dict[str, Any]:
    """Sequential sessions.list / sessions.describe round trips on one connection."""
    rng = random.Random(seed)
    cases: list[tuple[str, str, Callable[[], dict[str, Any]]]] = [
        ("list100", "sessions.list", lambda: {"limit": 100}),
        ("list10", "sessions.list", lambda: {"limit": 10}),
        ("describe", "sessions.describe", lambda: {"key": rng.choice(keys)}),
    ]
    if stored > 100:
        last_offset = stored - 100
        cases.append(("listLastPage", "sessions.list", lambda: {"limit": 100, "offset": last_offset}))
    client = await connected_client(url, token)
    try:
        results: dict[str, Any] = {}
        for name, method, params in cases:
            await timed_reads(client, method, params, warmup)
            results[name] = await timed_reads(client, method, params, calls)
        if stored > 100:
            results["listLastPage"]["offset"] = stored - 100
        return results
    finally:
        await client.close()


# --- parts 2 and 3: chat turns -----------------------------------------------------------------


async def chat_sequential(url: str, token: str, *, turns: int, tag: str) -> dict[str, Any]:
    """``turns`` sequential send→wait turns on one new session (after a warm-up on another session)."""
    client = await connected_client(url, token)
    try:
        warmup_key = await create_session(client, f"bench {tag} warm-up")
        for n in range(SEQUENTIAL_WARMUP_TURNS):
            await timed_turn(client, warmup_key, n, f"{tag}-warmup")
        key = await create_session(client, f"bench {tag} sequential")
        await asyncio.sleep(0.2)
        drain_events(client)
        samples: list[float] = []
        errors: list[str] = []
        events = 0
        for n in range(turns):
            turn = await timed_turn(client, key, n, f"{tag}-seq")
            samples.append(turn.seconds)
            events += turn.events
            if turn.error is not None:
                errors.append(turn.error)
        described = await client.request("sessions.describe", {"key": key})
        session = described.get("session") or {}
        return {
            "turns": turns,
            "roundTrip": summarize(samples),
            "firstTurns": summarize(samples[:DRIFT_WINDOW]),
            "lastTurns": summarize(samples[-DRIFT_WINDOW:]),
            "errors": len(errors),
            "errorSamples": errors[:5],
            "eventsPerTurn": events / turns if turns else 0.0,
            "modelProvider": session.get("modelProvider"),
            "model": session.get("model"),
        }
    finally:
        await client.close()


@dataclass
class LoadTotals:
    completed: int = 0
    errors: int = 0
    events: int = 0
    latencies_s: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)

    def error(self, message: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(message)


async def _turn_loop(client: GatewayClient, key: str, index: int, deadline: float, totals: LoadTotals) -> None:
    n = 0
    while time.perf_counter() < deadline:
        n += 1
        try:
            turn = await timed_turn(client, key, n, f"load{index}")
        except GatewayError as error:
            totals.error(str(error))
            continue
        except ConnectionClosed as closed:
            totals.error(str(closed))
            return
        totals.events += turn.events
        if turn.error is not None:
            totals.error(turn.error)
            continue
        totals.latencies_s.append(turn.seconds)
        totals.completed += 1


async def _late_events(clients: list[GatewayClient]) -> tuple[int, float]:
    """Events still arriving after the window (a backlog); how many, and seconds until the last one."""
    started = last = time.perf_counter()
    late = 0
    while time.perf_counter() - started < EVENT_TAIL_MAX_S:
        await asyncio.sleep(0.1)
        arrived = sum(drain_events(client) for client in clients)
        now = time.perf_counter()
        if arrived:
            late, last = late + arrived, now
        elif now - last >= EVENT_TAIL_QUIET_S:
            break
    return late, (last - started) if late else 0.0


async def chat_load(
    deployment: Deployment,
    *,
    connections: int,
    seconds: float,
    tag: str,
    redis: bool,
    events_per_turn: float,
) -> dict[str, Any]:
    """``connections`` connections, each looping send→wait on a session of its own for ``seconds``.

    A connection receives the chat/agent events of the turns it sent (none of them subscribed), so
    ``events_per_turn`` (as one connection saw them in the sequential run) are expected per turn.
    """
    url, token = deployment.url, deployment.token
    clients = await asyncio.gather(*(connected_client(url, token) for _ in range(connections)))
    try:
        keys = [await create_session(client, f"bench {tag} load {i}") for i, client in enumerate(clients)]
        for n in range(LOAD_WARMUP_TURNS):
            await asyncio.gather(
                *(timed_turn(c, k, n, f"{tag}-load-warmup") for c, k in zip(clients, keys, strict=True))
            )
        await asyncio.sleep(0.2)
        for client in clients:
            drain_events(client)
        totals = LoadTotals()
        gateway_pid, worker_pid = deployment.gateway_pid, deployment.worker_pid
        redis_before = deployment.redis_stats() if redis else None
        client_cpu, gateway_cpu = own_cpu_seconds(), process_cpu_seconds(gateway_pid)
        worker_cpu = process_cpu_seconds(worker_pid) if worker_pid else 0.0
        machine_busy, machine_total = machine_cpu_seconds()
        started = time.perf_counter()
        await asyncio.gather(
            *(
                _turn_loop(c, k, i, started + seconds, totals)
                for i, (c, k) in enumerate(zip(clients, keys, strict=True))
            )
        )
        elapsed = time.perf_counter() - started
        client_cpu = own_cpu_seconds() - client_cpu
        gateway_cpu = process_cpu_seconds(gateway_pid) - gateway_cpu
        worker_cpu = process_cpu_seconds(worker_pid) - worker_cpu if worker_pid else None
        busy_after, total_after = machine_cpu_seconds()
        machine_busy, machine_total = busy_after - machine_busy, total_after - machine_total
        redis_after = deployment.redis_stats() if redis else None
        late_events, backlog_s = await _late_events(clients)
    finally:
        await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)
    finished = totals.completed + totals.errors
    result: dict[str, Any] = {
        "connections": connections,
        "seconds": elapsed,
        "completed": totals.completed,
        "errors": totals.errors,
        "errorSamples": totals.error_samples,
        "turnsPerSecond": totals.completed / elapsed if elapsed else 0.0,
        "latencyUnderLoad": summarize(totals.latencies_s),
        "eventsPerTurn": totals.events / finished if finished else 0.0,
        "eventsExpected": round(finished * events_per_turn),
        "eventsInWindow": totals.events,
        "eventsAfterWindow": late_events,
        "eventBacklogSeconds": backlog_s,
        "clientCpuPercentOfCore": 100 * client_cpu / elapsed if elapsed else 0.0,
        "gatewayCpuPercentOfCore": 100 * gateway_cpu / elapsed if elapsed else 0.0,
        "workerCpuPercentOfCore": 100 * worker_cpu / elapsed if elapsed and worker_cpu is not None else None,
        "machineCpuPercentBusy": 100 * machine_busy / machine_total if machine_total else None,
    }
    if redis_before is not None and redis_after is not None and finished:
        result["redisConnectionsPerTurn"] = (redis_after["connections"] - redis_before["connections"]) / finished
        result["redisCommandsPerTurn"] = (redis_after["commands"] - redis_before["commands"]) / finished
    return result


async def gateway_facts(url: str, token: str) -> dict[str, Any]:
    client = await connected_client(url, token)
    try:
        hello = client.hello or {}
        health = await client.request("health")
        return {
            "gatewayVersion": (hello.get("server") or {}).get("version"),
            "protocol": hello.get("protocol"),
            "databaseVendor": (health.get("database") or {}).get("vendor"),
            "storedSessions": await count_sessions(client),
        }
    finally:
        await client.close()


async def stored_sessions(url: str, token: str) -> int:
    client = await connected_client(url, token)
    try:
        return await count_sessions(client)
    finally:
        await client.close()


# --- the run ----------------------------------------------------------------------------------


def run_reads(
    deployment: Deployment, keys: list[str], stored: int, args: argparse.Namespace, *, note: str = ""
) -> dict[str, Any]:
    progress(f"{args.calls} sequential sessions.list / sessions.describe calls each at {stored} sessions{note}")
    reads = asyncio.run(
        session_reads(
            deployment.url,
            deployment.token,
            keys=keys,
            stored=stored,
            calls=args.calls,
            warmup=args.warmup,
            seed=stored,
        )
    )
    return {"storedSessions": stored, **reads}


def seed_to(
    deployment: Deployment, *, target: int, stored: int, args: argparse.Namespace, keys: list[str]
) -> tuple[dict[str, Any], int]:
    """Seed up to ``target`` stored sessions; the seeding figures and the verified stored count."""
    count = max(0, target - stored)
    progress(f"seeding {count} sessions (to {target})")
    result = seed(deployment, count=count, first=stored, args=args)
    keys += result.keys
    verified = asyncio.run(stored_sessions(deployment.url, deployment.token))
    if verified != stored + count:
        raise RuntimeError(f"expected {stored + count} stored sessions after seeding, the gateway lists {verified}")
    return {**result.as_dict(), "target": target, "storedAfter": verified}, verified


def run_chat(deployment: Deployment, args: argparse.Namespace, tag: str, *, load: bool) -> dict[str, Any]:
    progress(f"{deployment.name}: {args.turns} sequential chat.send→agent.wait turns on one session")
    redis_before = deployment.redis_stats()
    sequential = asyncio.run(chat_sequential(deployment.url, deployment.token, turns=args.turns, tag=tag))
    redis_after = deployment.redis_stats()
    if redis_before is not None and redis_after is not None and args.turns:
        sequential["redisConnectionsPerTurn"] = (redis_after["connections"] - redis_before["connections"]) / (
            args.turns + SEQUENTIAL_WARMUP_TURNS
        )
    result: dict[str, Any] = {"sequential": sequential}
    if load:
        progress(f"{deployment.name}: {args.connections} connections looping send→wait for {args.seconds:g} s")
        result["load"] = asyncio.run(
            chat_load(
                deployment,
                connections=args.connections,
                seconds=args.seconds,
                tag=tag,
                redis=bool(args.redis_url),
                events_per_turn=sequential["eventsPerTurn"],
            )
        )
    return result


def run(args: argparse.Namespace, cleanups: contextlib.ExitStack) -> dict[str, Any]:
    report: dict[str, Any] = {}

    # Gateway A: the built-in echo provider. Reads at the small size, chat, seeding, reads at the large size.
    echo = Deployment(args, name="echo gateway", suffix="")
    cleanups.callback(lambda: echo.close(failed=not report.get("complete")))
    echo.start()
    facts = asyncio.run(gateway_facts(echo.url, echo.token))
    stored = facts["storedSessions"]
    keys: list[str] = []
    seeding_small, stored = seed_to(echo, target=args.small, stored=stored, args=args, keys=keys)
    reads_small = run_reads(echo, keys, stored, args)
    chat_echo = run_chat(echo, args, "echo", load=True)
    stored = asyncio.run(stored_sessions(echo.url, echo.token))
    seeding_large, stored = seed_to(echo, target=args.large, stored=stored, args=args, keys=keys)
    reads_large = run_reads(echo, keys, stored, args)
    reads = {"small": reads_small, "large": reads_large}
    # Right after seeding, PostgreSQL's planner statistics still describe the small table (autovacuum
    # analyzes within about a minute); measure again once they are current.
    if echo.analyze():
        reads["largeAnalyzed"] = run_reads(echo, keys, stored, args, note=" after ANALYZE")
    echo_memory = echo.memory()
    echo.stop()
    echo.close(failed=False)

    report["environment"] = {
        **base_environment(
            announced=echo.announced,
            facts=facts,
            postgres=echo.postgres,
            redis_prefix=echo.redis_prefix,
            redis_url=args.redis_url,
        ),
        "gatewayPid": echo.gateway_pid,
        "workerPid": echo.worker_pid,
        "taskMode": "celery" if args.redis_url else "inprocess",
        "workerConcurrency": WORKER_CONCURRENCY if args.redis_url else None,
    }
    report["seeding"] = {"small": seeding_small, "large": seeding_large}
    report["reads"] = reads
    report["chat"] = {"echo": chat_echo}
    report["memory"] = {"echo": echo_memory}
    report["logs"] = {"echo": echo.logs}

    # Gateway B: the OpenAI-compatible provider against tests/support/mock_openai.py (echo replies, no delay).
    if not args.skip_mock:
        progress("starting the mock OpenAI server")
        mock = start_mock_openai()
        cleanups.callback(lambda: _guarded(mock.stop, "stopping the mock OpenAI server"))
        mocked = Deployment(
            args, name="mock gateway", suffix="_mock", extra_env={"OPENCLAW_MODEL_BASE_URL": mock.base_url}
        )
        cleanups.callback(lambda: mocked.close(failed=not report.get("complete")))
        mocked.start()
        chat_mock = run_chat(mocked, args, "mock", load=args.mock_load)
        report["chat"]["mock"] = chat_mock
        report["memory"]["mock"] = mocked.memory()
        mocked.stop()
        mocked.close(failed=False)
        report["logs"]["mock"] = mocked.logs
        report["mock"] = {
            "baseUrl": mock.base_url,
            "gatewayPid": mocked.gateway_pid,
            "workerPid": mocked.worker_pid,
            "completionsServed": len(mock.requests()),
        }
        mock.stop()
    report["complete"] = True
    return report


# --- output -----------------------------------------------------------------------------------


def _ratio(small: float | None, large: float | None) -> str:
    if not small or large is None:
        return "-"
    return f"{large / small:.2f}x"


def _seeding_line(label: str, seeding: dict[str, Any]) -> str:
    parts = []
    if seeding["rpcCreated"]:
        parts.append(
            f"{seeding['rpcCreated']} via sessions.create in {seeding['rpcSeconds']:.2f} s "
            f"({seeding['rpcSessionsPerSecond']:.0f} sessions/s)"
        )
    if seeding["ormCreated"]:
        parts.append(
            f"{seeding['ormCreated']} via ORM bulk insert in {seeding['ormSeconds']:.2f} s "
            f"({seeding['ormSessionsPerSecond']:.0f} sessions/s, manage.py shell start included)"
        )
    return f"  {label:<22}" + ("; ".join(parts) if parts else "nothing to create") + f" -> {seeding['storedAfter']}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render(report: dict[str, Any], args: argparse.Namespace) -> str:
    env = report["environment"]
    task_mode = (
        f"celery (worker pid {env['workerPid']}, --pool threads --concurrency {env['workerConcurrency']})"
        if env["taskMode"] == "celery"
        else "in-process (turns run in worker threads of the gateway)"
    )
    lines = ["OpenClaw sessions benchmark", *environment_lines(env), f"  task mode      {task_mode}"]
    mock = report.get("mock")
    if mock:
        lines.append(
            f"  mock provider  {mock['baseUrl']} (tests/support/mock_openai.py), "
            f"second gateway pid {mock['gatewayPid']}"
            + (f", worker pid {mock['workerPid']}" if mock["workerPid"] else "")
        )

    seeding = report["seeding"]
    lines += [
        "",
        f"seeding ({args.seed_connections} connections for sessions.create; --seed-method {args.seed_method})",
        _seeding_line(f"to {seeding['small']['target']:,} sessions", seeding["small"]),
        _seeding_line(f"to {seeding['large']['target']:,} sessions", seeding["large"]),
    ]

    reads = report["reads"]
    small = reads["small"]
    larger = [(name, reads[name]) for name in ("large", "largeAnalyzed") if name in reads]
    titles = {"large": "{:,} sessions", "largeAnalyzed": "{:,}, after ANALYZE"}
    group = 42  # rows, p50, p99 and the two ratios of one larger table
    lines += [
        "",
        f"sessions reads: {args.calls} sequential calls each on one connection (ms; x = p50 and p99 "
        "as multiples of the small table's)",
        f"{'':<30}{small['storedSessions']:>14,} sessions"
        + "".join(f"{titles[name].format(r['storedSessions']):>{group}}" for name, r in larger),
        f"{'method':<30}{'rows':>6}{'p50':>8}{'p99':>8}"
        + f"{'rows':>8}{'p50':>8}{'p99':>8}{'x p50':>9}{'x p99':>9}" * len(larger),
    ]
    labels = {
        "list100": "sessions.list limit 100",
        "list10": "sessions.list limit 10",
        "describe": "sessions.describe random key",
        "listLastPage": "sessions.list last page",
    }
    for name, label in labels.items():
        measured = [r[name] for _, r in larger if name in r]
        if not measured and name not in small:
            continue
        a = small.get(name)
        cells = f"{a['rows']:>6}{fmt_ms(a.get('p50')):>8}{fmt_ms(a.get('p99')):>8}" if a else f"{'':>6}{'':>8}{'':>8}"
        for b in measured:
            cells += f"{b['rows']:>8}{fmt_ms(b.get('p50')):>8}{fmt_ms(b.get('p99')):>8}"
            cells += f"{_ratio(a.get('p50'), b.get('p50')):>9}{_ratio(a.get('p99'), b.get('p99')):>9}" if a else ""
        if name == "listLastPage" and measured:
            label = f"{label} (@{measured[0]['offset']:,})"
        lines.append(f"{label:<30}{cells}".rstrip())
    lines += ["", latency_header("sessions reads in detail (ms)", 56)]
    for key, measured in reads.items():
        suffix = ", analyzed" if key == "largeAnalyzed" else ""
        for name, label in labels.items():
            if name in measured:
                row = f"{label}, {measured['storedSessions']:,} sessions{suffix}"
                lines.append(latency_row(row, measured[name], 56))

    chat = report["chat"]
    providers = [("echo", "echo provider (built-in)"), ("mock", "HTTP mock provider (openai)")]
    lines += [
        "",
        f"chat.send→agent.wait round trip: {args.turns} sequential turns on one session, one connection",
        latency_header("round trips (ms)", 44),
    ]
    for name, label in providers:
        if name not in chat:
            continue
        seq = chat[name]["sequential"]
        lines.append(latency_row(label, seq["roundTrip"], 44))
        first, last = seq["firstTurns"], seq["lastTurns"]
        lines.append(latency_row(f"  first {first['n']} turns", first, 44))
        lines.append(latency_row(f"  last {last['n']} turns", last, 44))
    for name, label in providers:
        if name in chat:
            seq = chat[name]["sequential"]
            extra = (
                f", {seq['redisConnectionsPerTurn']:.1f} new Redis connections per turn (server-wide)"
                if "redisConnectionsPerTurn" in seq
                else ""
            )
            lines.append(
                f"  {label}: errors {seq['errors']}, {seq['eventsPerTurn']:.1f} events received per turn, "
                f"session model {seq['modelProvider']}/{seq['model']}{extra}"
            )
            lines += [f"    error: {sample}" for sample in seq["errorSamples"]]

    loads = [(label, chat[name]["load"]) for name, label in providers if name in chat and "load" in chat[name]]
    if loads:
        lines += [
            "",
            f"turns/s: {args.connections} connections, each with its own session looping send→wait for "
            f"{args.seconds:g} s; CPU in % of one core, machine = busy share of all cores",
            f"{'provider':<28}{'turns/s':>8}{'turns':>7}{'errors':>7}{'p50 ms':>9}{'p99 ms':>9}{'events/turn':>12}"
            f"{'client':>8}{'gateway':>9}{'worker':>8}{'machine':>9}",
        ]
        for label, load in loads:
            stats = load["latencyUnderLoad"]
            lines.append(
                f"{label:<28}{load['turnsPerSecond']:>8.1f}{load['completed']:>7}{load['errors']:>7}"
                f"{fmt_ms(stats.get('p50')):>9}{fmt_ms(stats.get('p99')):>9}{load['eventsPerTurn']:>12.1f}"
                f"{_pct(load['clientCpuPercentOfCore']):>8}{_pct(load['gatewayCpuPercentOfCore']):>9}"
                f"{_pct(load['workerCpuPercentOfCore']):>8}{_pct(load['machineCpuPercentBusy']):>9}"
            )
            received = load["eventsInWindow"] + load["eventsAfterWindow"]
            expected = load["eventsExpected"]
            lines.append(
                f"    events: {expected} expected (each connection: its own turns' streams), "
                f"{load['eventsInWindow']} received in the window, {load['eventsAfterWindow']} in the "
                f"{load['eventBacklogSeconds']:.1f} s after it; "
                f"{100 * received / expected if expected else 0:.1f}% delivered"
            )
            if "redisConnectionsPerTurn" in load:
                lines.append(
                    f"    Redis (server-wide): {load['redisConnectionsPerTurn']:.1f} new connections and "
                    f"{load['redisCommandsPerTurn']:.0f} commands per turn"
                )
            lines += [f"    error: {sample}" for sample in load["errorSamples"]]

    lines += [
        "",
        "memory (RSS of the process and its children, MiB; at the end of each gateway's part)",
        f"{'':<16}{'gw idle':>9}{'gw end':>9}{'gw peak':>9}{'gw thr':>8}"
        f"{'wk idle':>9}{'wk end':>9}{'wk peak':>9}{'wk thr':>8}",
    ]
    for name, memory in report["memory"].items():
        lines.append(
            f"{name + ' gateway':<16}{_mib(memory['gatewayIdleRssMiB']):>9}{_mib(memory['gatewayRssMiB']):>9}"
            f"{_mib(memory['gatewayPeakRssMiB']):>9}{memory['gatewayThreads']:>8}"
            f"{_mib(memory['workerIdleRssMiB']):>9}{_mib(memory['workerRssMiB']):>9}"
            f"{_mib(memory['workerPeakRssMiB']):>9}{memory['workerThreads'] or '-':>8}"
        )
    if mock:
        lines.append(f"mock OpenAI server: {mock['completionsServed']} chat completions served")

    lines.append("")
    for name, logs in report["logs"].items():
        parts = [
            f"gateway exit code {logs.get('gatewayExitCode')} after {logs.get('gatewayStopSeconds') or 0:.2f} s, "
            f"{logs.get('gatewayErrorRecords', 0)} ERROR records"
        ]
        if logs.get("workerStopped"):
            parts.append(
                f"worker exit code {logs.get('workerExitCode')} after {logs.get('workerStopSeconds') or 0:.2f} s, "
                f"{logs.get('workerErrorRecords', 0)} ERROR records"
            )
        lines.append(f"{name} gateway stop: " + "; ".join(parts))
        for key in ("gatewayErrorsByMessage", "workerErrorsByMessage"):
            lines += [f"  {count:>5} x {message}" for message, count in list(logs.get(key, {}).items())[:10]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--database-url", help="PostgreSQL server to use (a scratch database is created and dropped)")
    parser.add_argument(
        "--redis-url", help="Redis for the channel layer, cache and Celery (a unique key prefix per gateway)"
    )
    parser.add_argument("--small", type=int, default=10, help="stored sessions of the first read measurement")
    parser.add_argument("--large", type=int, default=10_000, help="stored sessions of the second read measurement")
    parser.add_argument("--calls", type=int, default=500, help="sequential calls per read method and size")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured calls before each read series")
    parser.add_argument(
        "--seed-method",
        choices=("auto", "rpc", "orm"),
        default="auto",
        help="seed through sessions.create, the ORM, or sessions.create with an ORM\n"
        "bulk insert for the rest when it would exceed --seed-budget (auto)",
    )
    parser.add_argument("--seed-budget", type=float, default=120.0, help="seconds sessions.create may take (auto)")
    parser.add_argument("--seed-connections", type=int, default=8, help="concurrent sessions.create connections")
    parser.add_argument("--turns", type=int, default=200, help="sequential chat turns per provider")
    parser.add_argument("--connections", type=int, default=8, help="concurrent sessions of the turns/s runs")
    parser.add_argument("--seconds", type=float, default=15.0, help="duration of each turns/s run")
    parser.add_argument("--skip-mock", action="store_true", help="leave out the HTTP mock provider part")
    parser.add_argument(
        "--mock-load",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the turns/s run with the mock provider",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--keep-state", action="store_true", help="keep the gateway state dirs and logs")
    args = parser.parse_args(argv)
    for name in ("calls", "turns", "connections", "seed_connections", "small"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.large < args.small:
        parser.error("--large must not be smaller than --small")
    if args.seconds <= 0 or args.warmup < 0 or args.seed_budget <= 0:
        parser.error("--seconds and --seed-budget must be positive and --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
