"""Usage reports benchmark: ``usage.cost`` and ``sessions.usage`` over 10,000 and 100,000 recorded turns.

    .venv/bin/python bench/usage_bench.py [--database-url postgres://...] [--sizes 10000,100000]

Runs in this process against a fresh database of its own (SQLite in a temporary state directory; with
``--database-url``, a scratch database ``openclaw_bench_<pid>_usage`` on that PostgreSQL server, dropped at the
end), migrated first. For every size it bulk-inserts that many finished turns spread evenly over the last 365 days,
over 1,000 sessions of 4 agents and 5 models (one without a price), each with a recorded ``usage``; then it times
each report (median of 5 calls, after one warm-up) through the RPC handlers, and counts their SQL statements. The
statement count must not grow with the runs (every figure is a ``GROUP BY`` in the database); the time does, with
the rows each report scans.

Exits non-zero when a report's totals differ from the inserted tokens; never for speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ScratchPostgres, is_postgres_url, progress
from bench.workers_recovery import StatementCounter, close_connections, setup_django

SESSIONS = 1000
AGENTS = ("main", "ops", "research", "support")
MODELS = (("openai", "gpt-a"), ("openai", "gpt-b"), ("openai", "gpt-c"), ("other", "gpt-d"), ("openai", "unpriced"))
PRICES = {model: {"input": 1.0 + n, "output": 4.0 + n} for n, (_, model) in enumerate(MODELS[:-1])}
BATCH = 5000
REPEATS = 5


class BenchFailure(Exception):
    """A report's figures differ from what was inserted."""


def seed(runs: int) -> dict[str, int]:
    from django.db import transaction
    from django.utils import timezone

    from sessions_app.models import Run, RunStatus, Session, SessionWindow

    now = timezone.now()
    sessions = [
        Session(key=f"agent:{AGENTS[n % len(AGENTS)]}:bench-{n}", agent_id=AGENTS[n % len(AGENTS)])
        for n in range(SESSIONS)
    ]
    with transaction.atomic():
        Session.objects.bulk_create(sessions, batch_size=BATCH)
        SessionWindow.objects.bulk_create(
            [SessionWindow(id=s.session_id, session=s, reason="initial") for s in sessions], batch_size=BATCH
        )
    # The turns' own times (the day a turn counts on), not the insert's.
    Run._meta.get_field("created_at").auto_now_add = False
    totals = {"input": 0, "output": 0}
    step = timedelta(days=365) / runs
    for start in range(0, runs, BATCH):
        rows = []
        for n in range(start, min(start + BATCH, runs)):
            session = sessions[n % SESSIONS]
            provider, model = MODELS[n % len(MODELS)]
            usage = {"input": 100 + n % 900, "output": 10 + n % 90}
            totals["input"] += usage["input"]
            totals["output"] += usage["output"]
            rows.append(
                Run(
                    run_id=str(uuid.uuid4()),
                    session=session,
                    session_key=session.key,
                    window_id=session.session_id,
                    status=RunStatus.OK,
                    message="m",
                    model=model,
                    model_provider=provider,
                    usage={**usage, "totalTokens": usage["input"] + usage["output"]},
                    created_at=now - step * n,
                    ended_at=now - step * n,
                )
            )
        Run.objects.bulk_create(rows, batch_size=BATCH)
    return totals


def timed(call) -> tuple[float, int, dict]:
    from django.db import connection

    call()  # warm-up
    samples = []
    for _ in range(REPEATS):
        counter = StatementCounter()
        started = time.perf_counter()
        with connection.execute_wrapper(counter):
            result = call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000, counter.total, result


def reports() -> dict:
    from gateway import scopes as sc
    from gateway.context import RpcContext
    from operations_app.rpc import sessions_usage_rpc, usage_cost_rpc
    from operations_app.schemas import SessionsUsageParams, UsageCostParams

    ctx = RpcContext("bench", "inmemory!bench", sc.ROLE_OPERATOR, [sc.READ], "token", "test", "test")
    return {
        "usage.cost 30 days, all agents": lambda: usage_cost_rpc(ctx, UsageCostParams(agentScope="all")),
        "usage.cost 366 days, all agents": lambda: usage_cost_rpc(ctx, UsageCostParams(agentScope="all", days=366)),
        "usage.cost 366 days, one agent": lambda: usage_cost_rpc(ctx, UsageCostParams(agentId="ops", days=366)),
        "sessions.usage 366 days, 50 sessions": lambda: sessions_usage_rpc(
            ctx, SessionsUsageParams(agentScope="all", range="1y")
        ),
        "sessions.usage 366 days, 1000 sessions": lambda: sessions_usage_rpc(
            ctx, SessionsUsageParams(agentScope="all", range="1y", limit=1000)
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--sizes", default="10000,100000")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    scratch = ScratchPostgres(args.database_url, "_usage") if is_postgres_url(args.database_url) else None
    failed = False
    with tempfile.TemporaryDirectory() as state_dir:
        try:
            if scratch is not None:
                scratch.create()
            os.environ["OPENCLAW_MODEL_PRICES"] = __import__("json").dumps(PRICES)
            setup_django(state_dir, scratch.url if scratch else None)
            from django.db import connection

            from sessions_app.models import Run, Session

            print(f"database: {connection.vendor} {scratch.server_version if scratch else ''}".rstrip())
            print(f"{'report':<42} {'runs':>8} {'median ms':>10} {'statements':>11}")
            for size in sizes:
                Run.objects.all().delete()
                Session.objects.all().delete()
                progress(f"seeding {size} runs")
                inserted = seed(size)
                for name, call in reports().items():
                    median_ms, statements, result = timed(call)
                    print(f"{name:<42} {size:>8} {median_ms:>10.1f} {statements:>11}")
                    if "366 days, all" in name and result["totals"]["input"] != inserted["input"]:
                        print(f"  wrong totals: {result['totals']['input']} != {inserted['input']}")
                        failed = True
        finally:
            close_connections()
            if scratch is not None:
                scratch.drop()
    if failed:
        raise SystemExit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
