"""Worker placement bursts: many connections sending the same ``sessions.move`` (or ``sessions.dispatch``, or
``sessions.reclaim``) at once, on a ``local`` worker profile, and what every call waited.

    .venv/bin/python bench/worker_moves.py --database-url postgres://postgres@127.0.0.1:5432/postgres
    .venv/bin/python bench/worker_moves.py --database-url ... --redis-url redis://127.0.0.1:6379/0 \\
        --writers 16,64 --rounds 3 --operations move,dispatch,reclaim --json worker-moves.json

Starts one gateway (``manage.py serve``; with ``--redis-url`` also its Celery worker, which runs the dispatch stages)
on a scratch database, with a ``local`` profile: each dispatch starts a real node host on this machine. For every
round it creates a worktree session and dispatches it (until ``active``), connects ``writers`` operator clients,
then sends the burst from all of them at once and times each answer:

- ``move``: ``sessions.move {key, expected: {generation, environmentId, ownerEpoch}, target: {kind: "gateway"}}``
  with the exact facts of the active placement (the issue-27 burst);
- ``dispatch``: ``sessions.dispatch {key, profileId}`` of a local session (then it is moved back);
- ``reclaim``: ``sessions.reclaim {key}`` of the active placement.

After the burst it checks what must hold whatever the calls answered: the placement settled (``local`` or
``reclaimed`` for moves and reclaims, ``active`` for dispatches), its history one linear chain (each row's
``from`` is the previous row's ``to``, generations consecutive), the environment ``destroyed`` (or ``active`` after a
dispatch burst, and exactly one environment), no node host state left and no local worker node still paired once
the session is back. A call may answer an error only as the stale refusal or joined outcome the protocol allows
(``INVALID_REQUEST`` naming the changed placement); a call that waited for a pool timeout answers ``UNAVAILABLE``
and is counted. Exits non-zero when a round leaves a wrong state; never for speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402  (the repository root must be importable first)

from bench.common import (  # noqa: E402
    ScratchPostgres,
    ScratchRedisPrefix,
    bench_gateway,
    connected_client,
    latency_header,
    latency_row,
    progress,
    run_benchmark,
    summarize,
)
from openclaw_client.client import GatewayClient, GatewayError  # noqa: E402
from tests.support.clients import move_back_params  # noqa: E402

PROFILE_ID = "local-bench"
PROFILES = {PROFILE_ID: {"provider": "local", "settings": {"capacity": 2, "capacityWaitMs": 500}}}
AGENT_ID = "bench"
REQUEST_TIMEOUT_S = 120.0
GIT = ["git", "-c", "user.email=bench@example.com", "-c", "user.name=bench", "-c", "commit.gpgsign=false"]
OPERATIONS = ("move", "dispatch", "reclaim")
SETTLED = {"move": ("local",), "dispatch": ("active",), "reclaim": ("reclaimed",)}


def publish_checkout(root: Path) -> Path:
    source = root / "published"
    source.mkdir(parents=True)
    subprocess.run([*GIT, "-C", str(source), "init", "-q", "-b", "main"], check=True)
    (source / "README.md").write_text("published workspace\n")
    (source / "app.py").write_text("print('hello')\n")
    subprocess.run([*GIT, "-C", str(source), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(source), "commit", "-q", "-m", "publish"], check=True)
    return source


class Rig:
    def __init__(self, url: str, token: str, published: Path, state_dir: Path, database_url: str):
        self.url = url
        self.token = token
        self.published = published
        self.state_dir = state_dir
        self.database_url = database_url
        self.sequence = 0

    async def create_session(self, client: GatewayClient) -> str:
        self.sequence += 1
        key = f"agent:{AGENT_ID}:burst-{self.sequence}"
        await client.request(
            "sessions.create",
            {
                "key": key,
                "agentId": AGENT_ID,
                "worktree": True,
                "worktreeName": f"burst-{self.sequence}",
                "worktreeBaseRef": "main",
                "cwd": str(self.published),
            },
        )
        return key

    @staticmethod
    async def placement(client: GatewayClient, key: str) -> dict[str, Any]:
        return (await client.request("sessions.describe", {"key": key}))["session"].get("placement") or {}

    async def dispatch(self, client: GatewayClient, key: str) -> dict[str, Any]:
        """The session dispatched until active (a dispatch that fails answers UNAVAILABLE with its reason)."""
        answer = await client.request("sessions.dispatch", {"key": key, "profileId": PROFILE_ID}, timeout=120)
        return answer["placement"]

    def rows(self, sql: str, params: tuple) -> list[tuple]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def history(self, key: str) -> list[tuple[str, str, int]]:
        return [
            (from_state, to_state, generation)
            for from_state, to_state, generation in self.rows(
                "SELECT h.from_state, h.to_state, h.generation FROM workers_app_placementhistory h "
                "JOIN sessions_app_session s ON s.id = h.session_id WHERE s.key = %s ORDER BY h.id",
                (key,),
            )
        ]

    def environments(self, key: str) -> list[tuple[str, str]]:
        """The environments this session's placement ever named (its history rows carry them)."""
        return self.rows(
            "SELECT e.environment_id, e.state FROM workers_app_workerenvironment e WHERE e.environment_id IN "
            "(SELECT h.environment_id FROM workers_app_placementhistory h JOIN sessions_app_session s "
            "ON s.id = h.session_id WHERE s.key = %s) ORDER BY e.environment_id",
            (key,),
        )

    def leftovers(self) -> dict[str, Any]:
        """Node hosts' state dirs and paired local worker nodes still there (none once every session is back)."""
        local = self.state_dir / "local-workers"
        dirs = sorted(p.name for p in local.iterdir()) if local.exists() else []
        nodes = self.rows(
            "SELECT count(*) FROM gateway_paireddevice WHERE display_name LIKE %s AND is_node",
            ("local worker %",),
        )
        return {"stateDirs": dirs, "pairedLocalNodes": nodes[0][0]}


def chain_problem(history: list[tuple[str, str, int]]) -> str | None:
    """Each row leaves the state the row before entered, one generation on (a repeated failure: failed → failed at
    the same generation, its new reason only)."""
    previous_state, previous_generation = "", -1
    for from_state, to_state, generation in history:
        repeat = from_state == to_state == previous_state == "failed" and generation == previous_generation
        if not repeat and (from_state != previous_state or generation != previous_generation + 1):
            return f"placement history is not one linear chain: {history}"
        previous_state, previous_generation = to_state, generation
    return None


async def burst(
    clients: list[GatewayClient], method: str, params: dict[str, Any]
) -> tuple[list[float], Counter, float]:
    start = asyncio.Event()
    times: list[float] = []
    outcomes: Counter = Counter()

    async def one(client: GatewayClient) -> None:
        await start.wait()
        began = time.perf_counter()
        try:
            answer = await client.request(method, params, timeout=REQUEST_TIMEOUT_S)
            outcomes[f"ok:{answer['placement']['state']}"] += 1
        except GatewayError as error:
            outcomes[f"{error.code}:{error.message[:90]}"] += 1
        times.append(time.perf_counter() - began)

    tasks = [asyncio.create_task(one(client)) for client in clients]
    await asyncio.sleep(0.05)
    began = time.perf_counter()
    start.set()
    await asyncio.gather(*tasks)
    return times, outcomes, time.perf_counter() - began


async def run_round(rig: Rig, operation: str, writers: int) -> dict[str, Any]:
    admin = await connected_client(rig.url, rig.token)
    clients = [await connected_client(rig.url, rig.token) for _ in range(writers)]
    problems: list[str] = []
    try:
        key = await rig.create_session(admin)
        if operation == "dispatch":
            method, params = "sessions.dispatch", {"key": key, "profileId": PROFILE_ID}
        else:
            try:
                source = await rig.dispatch(admin, key)
            except GatewayError as error:
                # The round cannot be set up (the setup's own failure is not the burst's): reported, not measured.
                return {"times": [], "outcomes": {}, "wallS": 0.0, "problems": [f"setup dispatch failed: {error}"]}
            method = "sessions.move" if operation == "move" else "sessions.reclaim"
            params = move_back_params(key, source) if operation == "move" else {"key": key}
        times, outcomes, wall = await burst(clients, method, params)
        placement = await rig.placement(admin, key)
        state = placement.get("state", "local")
        if state not in SETTLED[operation]:
            problems.append(f"the placement was left {state}: {placement.get('recoveryError')}")
        history = rig.history(key)
        problems.append(chain_problem(history))
        environments = [state for _id, state in rig.environments(key)]
        if operation == "dispatch" and state == "active":
            if environments != ["attached"]:
                problems.append(f"a dispatch burst left environments {environments}")
            await admin.request("sessions.move", move_back_params(key, placement), timeout=REQUEST_TIMEOUT_S)
            environments = [state for _id, state in rig.environments(key)]
        if environments != ["destroyed"]:
            problems.append(f"environments left {environments}")
        leftovers = rig.leftovers()
        if leftovers["stateDirs"] or leftovers["pairedLocalNodes"]:
            problems.append(f"node hosts left behind: {leftovers}")
        return {
            "times": times,
            "outcomes": dict(outcomes),
            "wallS": wall,
            "historyRows": len(history),
            "problems": [p for p in problems if p],
        }
    finally:
        for client in [admin, *clients]:
            with contextlib.suppress(Exception):
                await client.close()


def run(args: argparse.Namespace, cleanups: contextlib.ExitStack) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="openclaw-bench-moves-"))
    cleanups.callback(shutil.rmtree, scratch, True)
    workspace_root = scratch / "allowed"
    published = publish_checkout(workspace_root)
    postgres = ScratchPostgres(args.database_url, "_moves")
    postgres.create()
    cleanups.callback(postgres.drop)
    redis_prefix = ScratchRedisPrefix(args.redis_url) if args.redis_url else None
    if redis_prefix is not None:
        redis_prefix.check()
        cleanups.callback(redis_prefix.cleanup)
    launch = bench_gateway(
        database_url=postgres.url,
        redis_url=args.redis_url,
        redis_prefix=redis_prefix.prefix if redis_prefix else None,
        extra_env={
            "OPENCLAW_WORKER_PROFILES": json.dumps(PROFILES),
            "OPENCLAW_WORKSPACE_ROOTS": str(workspace_root),
            "OPENCLAW_SWEEP_INTERVAL_MS": "3600000",
            **({"OPENCLAW_DB_POOL_MAX_SIZE": str(args.pool_size)} if args.pool_size else {}),
        },
    )
    # The Celery worker starts the node hosts; they reach the gateway here.
    launch.env["OPENCLAW_WORKER_GATEWAY_URL"] = f"ws://127.0.0.1:{launch.port}"
    if not args.keep_state:
        cleanups.callback(launch.remove_state)
    progress(f"gateway state dir: {launch.state_dir}")
    progress("migrating a fresh database")
    launch.migrate()
    progress("starting the gateway" + (" and its Celery worker" if args.redis_url else ""))
    gateway = launch.start(worker=True, timeout=60)
    cleanups.callback(gateway.stop)
    rig = Rig(gateway.url, gateway.token, published, Path(launch.state_dir), postgres.url)
    report: dict[str, Any] = {
        "database": f"PostgreSQL (scratch {postgres.name})",
        "taskMode": "celery" if args.redis_url else "in-process",
        "poolSize": args.pool_size or 8,
        "bursts": [],
    }
    for operation in args.operations:
        for writers in args.writers:
            rounds = []
            for number in range(args.rounds):
                progress(f"{operation} burst of {writers}, round {number + 1}/{args.rounds}")
                rounds.append(asyncio.run(run_round(rig, operation, writers)))
            times = [t for r in rounds for t in r["times"]]
            outcomes: Counter = Counter()
            for r in rounds:
                outcomes.update(r["outcomes"])
            report["bursts"].append(
                {
                    "operation": operation,
                    "writers": writers,
                    "rounds": args.rounds,
                    "latencyMs": summarize(times),
                    "wallS": [round(r["wallS"], 3) for r in rounds],
                    "outcomes": dict(sorted(outcomes.items())),
                    "problems": [p for r in rounds for p in r["problems"]],
                }
            )
    errors = [line for line in gateway.log().splitlines() if "PoolTimeout" in line]
    report["poolTimeoutLogLines"] = len(errors)
    return report


def render(report: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"Worker placement bursts on a local profile ({report['database']}, pool {report['poolSize']}, "
        f"tasks {report['taskMode']})",
        "",
        latency_header("burst (ms per call)", 28) + "   wall s per round",
    ]
    for burst_report in report["bursts"]:
        label = f"{burst_report['operation']} x{burst_report['writers']}"
        walls = ", ".join(f"{w:.2f}" for w in burst_report["wallS"])
        lines.append(latency_row(label, burst_report["latencyMs"], 28) + f"   {walls}")
    lines.append("")
    for burst_report in report["bursts"]:
        lines.append(f"{burst_report['operation']} x{burst_report['writers']} answers:")
        lines.extend(f"  {count:>4}  {outcome}" for outcome, count in burst_report["outcomes"].items())
        lines.extend(f"  PROBLEM: {problem}" for problem in burst_report["problems"])
    lines.append(f"PoolTimeout lines in the gateway log: {report['poolTimeoutLogLines']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/postgres", help="PostgreSQL server (scratch db)"
    )
    parser.add_argument("--redis-url", help="Redis: Celery runs the dispatch stages (otherwise in-process)")
    parser.add_argument("--writers", default="16", help="connections per burst, comma separated (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="bursts per operation and size")
    parser.add_argument("--operations", default="move", help=f"comma separated, of {', '.join(OPERATIONS)}")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument(
        "--pool-size", type=int, help="OPENCLAW_DB_POOL_MAX_SIZE of the gateway (default: the setting's, 8)"
    )
    parser.add_argument("--keep-state", action="store_true", help="keep the gateway's state dir (its logs)")
    args = parser.parse_args(argv)
    args.writers = [int(w) for w in args.writers.split(",")]
    args.operations = [o for o in args.operations.split(",") if o]
    unknown = set(args.operations) - set(OPERATIONS)
    if unknown:
        parser.error(f"unknown operations: {', '.join(sorted(unknown))}")
    return args


def main() -> int:
    args = parse_args()
    failed: list[str] = []

    def run_and_judge(args: argparse.Namespace, cleanups: contextlib.ExitStack) -> dict[str, Any]:
        report = run(args, cleanups)
        failed.extend(p for b in report["bursts"] for p in b["problems"])
        return report

    run_benchmark(args, run_and_judge, render)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
