"""Calls/s and turn throughput through HAProxy, for 1 and 2 gateway processes (the topology of ``./dev cluster``).

    .venv/bin/python bench/cluster_bench.py [--seconds 10] [--connections 8] [--sessions 8] [--gateways 1,2]

Each round starts the topology with the documented command (``manage.py cluster``, what ``./dev cluster`` runs) on a
scratch PostgreSQL database and a Redis prefix of its own, with the echo model and one Celery worker, then measures
through the balancer: the framework floor's calls/s (``/bench/floor``, a consumer that does no work, in the same
gateway processes) and ``sessions.list`` calls/s over ``--connections`` sockets, and turns/s of ``--sessions``
concurrent sessions each looping ``chat.send`` → ``agent.wait``. Needs PostgreSQL, Redis and HAProxy (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import FLOOR_PATH, FLOOR_SETTINGS, ScratchPostgres, ScratchRedisPrefix, connected_client
from tests.support.processes import start_cluster


async def calls_per_second(url: str, token: str, connections: int, seconds: float) -> tuple[float, int]:
    clients = await asyncio.gather(*(connected_client(url, token) for _ in range(connections)))
    completed = errors = 0

    async def loop(client, deadline: float) -> None:
        nonlocal completed, errors
        while time.perf_counter() < deadline:
            try:
                await client.request("sessions.list", {})
                completed += 1
            except Exception:
                errors += 1

    try:
        for client in clients:
            await client.request("sessions.list", {})
        started = time.perf_counter()
        await asyncio.gather(*(loop(c, started + seconds) for c in clients))
        return completed / (time.perf_counter() - started), errors
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


async def turns_per_second(url: str, token: str, sessions: int, seconds: float) -> tuple[float, int]:
    clients = await asyncio.gather(*(connected_client(url, token) for _ in range(sessions)))
    completed = errors = 0

    async def loop(client, key: str, deadline: float) -> None:
        nonlocal completed, errors
        while time.perf_counter() < deadline:
            sent = await client.request(
                "chat.send", {"sessionKey": key, "message": "bench", "idempotencyKey": uuid.uuid4().hex}
            )
            waited = await client.request("agent.wait", {"runId": sent["runId"], "timeoutMs": 30_000}, timeout=35)
            if waited.get("status") == "ok":
                completed += 1
            else:
                errors += 1

    try:
        keys = [f"agent:main:bench-{i}" for i in range(sessions)]
        for client, key in zip(clients, keys, strict=True):
            await client.request("sessions.create", {"key": key})
        started = time.perf_counter()
        await asyncio.gather(*(loop(c, k, started + seconds) for c, k in zip(clients, keys, strict=True)))
        return completed / (time.perf_counter() - started), errors
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


def round_for(gateways: int, args: argparse.Namespace) -> dict:
    database = ScratchPostgres(args.postgres, suffix=f"_cluster{gateways}")
    redis = ScratchRedisPrefix(args.redis)
    database.create()
    redis.check()
    settings = {
        "DATABASE_URL": database.url,
        "HARNESS_DATABASE_URL": database.url,
        "REDIS_URL": args.redis,
        "OPENCLAW_REDIS_PREFIX": redis.prefix,
        "OPENCLAW_CELERY_QUEUE": redis.prefix,
        # The framework floor (bench/floor.py) behind the same balancer, in the same gateway processes.
        **FLOOR_SETTINGS,
    }
    cluster = start_cluster(
        settings, gateways=gateways, workers=1, worker_concurrency=args.worker_concurrency, clean_env=True
    )
    try:
        floor_url = cluster.url + FLOOR_PATH
        floor, _ = asyncio.run(calls_per_second(floor_url, cluster.token, args.connections, args.seconds))
        calls, call_errors = asyncio.run(calls_per_second(cluster.url, cluster.token, args.connections, args.seconds))
        turns, turn_errors = asyncio.run(turns_per_second(cluster.url, cluster.token, args.sessions, args.seconds))
    finally:
        cluster.stop()
        redis.cleanup()
        database.drop()
    return {
        "gateways": gateways,
        "floor": floor,
        "calls": calls,
        "call_errors": call_errors,
        "turns": turns,
        "turn_errors": turn_errors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--worker-concurrency", type=int, default=4)
    parser.add_argument("--gateways", default="1,2", help="Comma-separated gateway process counts.")
    parser.add_argument(
        "--postgres", default=os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    rows = [round_for(int(n), args) for n in args.gateways.split(",")]
    print(
        f"cluster through HAProxy, {os.cpu_count()} cores, {args.seconds:.0f} s per figure, echo model, 1 Celery worker"
    )
    print(
        f"{'gateways':>8}  {'floor calls/s':>14}  {'sessions.list calls/s':>22}  {'of floor':>8}  {'errors':>6}"
        f"  {'turns/s':>8}  {'errors':>6}"
    )
    for row in rows:
        print(
            f"{row['gateways']:>8}  {row['floor']:>14.0f}  {row['calls']:>22.0f}  {row['calls'] / row['floor']:>8.0%}"
            f"  {row['call_errors']:>6}  {row['turns']:>8.1f}  {row['turn_errors']:>6}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
