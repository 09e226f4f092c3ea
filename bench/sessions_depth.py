"""sessions.list page cost by table size and page depth: 10, 1,000, 10,000 and 100,000 stored sessions.

Starts a gateway like ``bench/gateway_bench.py`` (``manage.py migrate`` + ``manage.py serve``; embedded profile, or
PostgreSQL with ``--database-url``), bulk-inserts sessions through the ORM (``sessions_bench.py``'s seeding), and at
each size times ``sessions.list`` pages on one connection: the first page, and pages reached by following the
returned ``nextCursor`` chain (the keyset cursor: the middle one and the last one), and the same by the ``nextOffset``
chain for comparison. See ``bench/README.md``.

    .venv/bin/python bench/sessions_depth.py
    .venv/bin/python bench/sessions_depth.py --database-url postgres://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402  (the repository root must be importable first)
    base_environment,
    connected_client,
    environment_lines,
    fmt_ms,
    progress,
    run_benchmark,
    summarize,
)
from bench.sessions_bench import Deployment, count_sessions, gateway_facts, seed_orm  # noqa: E402
from openclaw_client.client import GatewayClient  # noqa: E402

PAGE = 100
# The page query of sessions_app.selectors.sessions_page for sessions.list's defaults (not archived), as text for
# EXPLAIN; {offset} is the page's offset.
PAGE_SQL = (
    "SELECT * FROM sessions_app_session WHERE archived_at IS NULL "
    "ORDER BY updated_at DESC, id DESC LIMIT {limit} OFFSET {offset}"
)


async def walk_chain(client: GatewayClient, mode: str) -> tuple[list[dict[str, Any]], float]:
    """Every page's params, following ``nextCursor`` (``mode="cursor"``) or ``nextOffset`` (``"offset"``) from the
    first page, and the seconds the walk took."""
    chain: list[dict[str, Any]] = [{"limit": PAGE}]
    started = time.perf_counter()
    while True:
        page = await client.request("sessions.list", chain[-1])
        if not page.get("hasMore"):
            return chain, time.perf_counter() - started
        follow = {"cursor": page["nextCursor"]} if mode == "cursor" else {"offset": int(page["nextOffset"])}
        chain.append({"limit": PAGE, **follow})


async def timed_page(client: GatewayClient, params: dict[str, Any], depth: int, calls: int, warmup: int) -> dict:
    for _ in range(warmup):
        await client.request("sessions.list", params)
    samples, rows = [], 0
    for _ in range(calls):
        started = time.perf_counter()
        page = await client.request("sessions.list", params)
        samples.append(time.perf_counter() - started)
        rows = int(page["count"])
    return {**summarize(samples), "offset": depth * PAGE, "rows": rows}


async def pages_at(url: str, token: str, calls: int, warmup: int) -> dict[str, Any]:
    """Per mode (keyset cursor, offset): the first, middle and last page of the chain."""
    client = await connected_client(url, token)
    try:
        result: dict[str, Any] = {}
        for mode in ("cursor", "offset"):
            chain, walk_s = await walk_chain(client, mode)
            pages: dict[str, Any] = {"pages": len(chain), "walkSeconds": walk_s}
            depths = {"first": 0, "middle": len(chain) // 2 if len(chain) > 2 else None, "last": len(chain) - 1}
            for name, depth in depths.items():
                if depth is not None and (name == "first" or depth > 0):
                    pages[name] = await timed_page(client, chain[depth], depth, calls, warmup)
            result[mode] = pages
        return result
    finally:
        await client.close()


def explain(deployment: Deployment, offset: int) -> str:
    """The database's plan of the page query at ``offset`` (PostgreSQL: with ANALYZE, so with actual rows)."""
    sql = PAGE_SQL.format(limit=PAGE + 1, offset=offset)
    if deployment.postgres is not None:
        import psycopg

        with psycopg.connect(deployment.postgres.url, autocommit=True) as conn:
            rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}").fetchall()
        return "\n".join(str(row[0]) for row in rows)
    assert deployment.launch is not None
    path = Path(deployment.launch.state_dir) / "gateway.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall()
    return "\n".join(str(row[-1]) for row in rows)


def run(args: argparse.Namespace, cleanups: contextlib.ExitStack) -> dict[str, Any]:
    report: dict[str, Any] = {}
    args.redis_url = None  # reads only: no channel layer, cache or worker beyond the embedded ones
    deployment = Deployment(args, name="gateway", suffix="")
    cleanups.callback(lambda: deployment.close(failed=not report.get("complete")))
    deployment.start()
    facts = asyncio.run(gateway_facts(deployment.url, deployment.token))
    stored = facts["storedSessions"]
    sizes: list[dict[str, Any]] = []
    for size in args.sizes:
        if size > stored:
            progress(f"bulk-inserting {size - stored} sessions (to {size})")
            _keys, seconds = seed_orm(deployment, count=size - stored, first=stored)
            progress(f"  {seconds:.1f} s")
        client_count = asyncio.run(_count(deployment))
        if client_count < size:
            raise RuntimeError(f"expected at least {size} stored sessions, the gateway lists {client_count}")
        stored = client_count
        analyzed = deployment.analyze()  # PostgreSQL: current planner statistics, as autovacuum would give
        progress(f"{stored} sessions: walking the nextCursor and nextOffset chains, then {args.calls} calls of pages")
        pages = asyncio.run(pages_at(deployment.url, deployment.token, args.calls, args.warmup))
        entry = {"storedSessions": stored, "analyzed": analyzed, **pages}
        if args.explain and "last" in pages["offset"]:
            entry["lastPagePlan"] = explain(deployment, pages["offset"]["last"]["offset"])
        sizes.append(entry)
    report["environment"] = {
        **base_environment(
            announced=deployment.announced,
            facts=facts,
            postgres=deployment.postgres,
            redis_prefix=None,
            redis_url=None,
        ),
        "gatewayPid": deployment.gateway_pid,
    }
    report["sizes"] = sizes
    deployment.stop()
    deployment.close(failed=False)
    report["logs"] = deployment.logs
    report["complete"] = True
    return report


async def _count(deployment: Deployment) -> int:
    client = await connected_client(deployment.url, deployment.token)
    try:
        return await count_sessions(client)
    finally:
        await client.close()


def render(report: dict[str, Any], args: argparse.Namespace) -> str:
    lines = ["sessions.list page cost by table size and depth (limit 100, one connection)"]
    lines += environment_lines(report["environment"])

    def cell(stats: dict[str, Any] | None) -> str:
        if not stats:
            return "-"
        return f"{fmt_ms(stats['p50']).strip()} / {fmt_ms(stats['p99']).strip()}"

    for mode, title in (("cursor", "keyset cursor (nextCursor)"), ("offset", "offset (OpenClaw's nextOffset)")):
        lines += [
            "",
            f"pages by {title}",
            f"{'sessions':>9}{'pages':>7}{'walk s':>8}   {'first p50/p99 ms':>17}   {'middle p50/p99 ms':>18}"
            f"   {'last p50/p99 ms':>16}{'last offset':>13}{'last/first':>12}",
        ]
        for entry in report["sizes"]:
            pages = entry[mode]
            first, middle, last = pages["first"], pages.get("middle"), pages.get("last")
            ratio = f"{last['p50'] / first['p50']:.2f}x" if last else "-"
            lines.append(
                f"{entry['storedSessions']:>9}{pages['pages']:>7}{pages['walkSeconds']:>8.2f}   {cell(first):>17}   "
                f"{cell(middle):>18}   {cell(last):>16}{(last or {}).get('offset', '-'):>13}{ratio:>12}"
            )
    # A first page of 10 sessions holds 10 rows: compare full pages (at least PAGE sessions) only.
    full = [entry for entry in report["sizes"] if entry["storedSessions"] >= PAGE] or report["sizes"]
    deepest = full[-1]["cursor"].get("last") or full[-1]["cursor"]["first"]
    lines += [
        "",
        f"first page (full) at {full[-1]['storedSessions']} vs {full[0]['storedSessions']} sessions: "
        f"{full[-1]['cursor']['first']['p50'] / full[0]['cursor']['first']['p50']:.2f}x (p50)",
        f"cursor: last page at {full[-1]['storedSessions']} sessions vs the first page at {full[0]['storedSessions']}: "
        f"{deepest['p50'] / full[0]['cursor']['first']['p50']:.2f}x (p50)",
    ]
    for entry in report["sizes"]:
        if entry.get("lastPagePlan"):
            lines += ["", f"plan of the last page at {entry['storedSessions']} sessions:", entry["lastPagePlan"]]
    log = report.get("logs") or {}
    if "gatewayExitCode" in log:
        lines.append(
            f"gateway stop: exit code {log['gatewayExitCode']}; ERROR records in its log: {log['gatewayErrorRecords']}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--database-url", help="PostgreSQL server to use (a scratch database is created and dropped)")
    parser.add_argument(
        "--sizes",
        type=lambda text: sorted(int(part) for part in text.split(",")),
        default=[10, 1_000, 10_000, 100_000],
        help="stored sessions to measure at, comma-separated (default 10,1000,10000,100000)",
    )
    parser.add_argument("--calls", type=int, default=200, help="sequential calls per page and size")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured calls before each series")
    parser.add_argument("--explain", action="store_true", help="also print the database's plan of each last page")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--keep-state", action="store_true", help="keep the gateway state dir and log")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.warmup < 0 or not args.sizes or args.sizes[0] < 1:
        parser.error("--calls and --sizes must be at least 1, --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
