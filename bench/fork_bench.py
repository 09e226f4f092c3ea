"""Fork latency by source size: sessions.fork over the gateway for sources with 10, 1,000 and 10,000
transcript events, both a local fork (copy the active path) and an upstream fork through the bundled
native harness (fork the native thread, import it, link, bind, readiness).

    .venv/bin/python bench/fork_bench.py [--database-url postgres://...] [--sizes 10,1000,10000]

The cost should grow linearly with the copied history (bulk writes, not a round trip per event):
the table prints milliseconds per 1,000 copied events next to the percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    STARTUP_TIMEOUT_S,
    ScratchPostgres,
    bench_gateway,
    connected_client,
    is_postgres_url,
    rss_mib,
    summarize,
)

SEED_SCRIPT = """
import json
from native_harness import services
from native_harness.harness import CATALOG_ID, HOST_ID, UPSTREAM_KIND, harness
from sessions_app.models import Session, TranscriptEvent
from sessions_app.services import links, sessions
from sessions_app.services.transcripts import append_many

out = {}
for size in SIZES:
    turns = [("user" if i % 2 == 0 else "assistant", f"message {i} " + "x" * 80) for i in range(size)]
    thread = services.thread_create(turns)
    adopted = harness.adopt_thread(thread_id=thread.thread_id, agent_id="main", key=f"agent:main:upstream-{size}")
    links.link_upsert({
        "sessionKey": adopted.key, "agentId": "main", "catalogId": CATALOG_ID, "hostId": HOST_ID,
        "threadId": thread.thread_id, "upstreamKind": UPSTREAM_KIND,
        "upstreamRef": {"connectionFingerprint": services.current_fingerprint(), "threadId": thread.thread_id},
        "marker": None,
    })
    local = sessions.session_create(spec=sessions.SessionSpec(key=f"agent:main:local-{size}", agent_id="main"))
    bodies = [{"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1} for role, text in turns]
    append_many(window_id=local.session_id, session_key=local.key, bodies=bodies)
    def last_user(session_id):
        return TranscriptEvent.objects.filter(window_id=session_id, body__role="user").order_by("-seq").first()
    up, lo = last_user(adopted.session_id), last_user(local.session_id)
    out[size] = {"upstream": [adopted.key, up.event_id, up.seq - 1], "local": [local.key, lo.event_id, lo.seq - 1]}
print("SEEDED=" + json.dumps(out))
"""


async def measure(url: str, token: str, key: str, entry: str, count: int) -> list[float]:
    client = await connected_client(url, token)
    samples = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            await client.request("sessions.fork", {"sessionKey": key, "entryId": entry}, timeout=600)
            samples.append(time.perf_counter() - started)
    finally:
        await client.close()
    return samples


def run(args: argparse.Namespace, cleanups: contextlib.ExitStack) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    database_url = args.database_url
    if is_postgres_url(database_url):
        scratch = ScratchPostgres(database_url, "_fork")
        scratch.create()
        cleanups.callback(scratch.drop)
        database_url = scratch.url
    launch = bench_gateway(database_url=database_url, redis_url=None, redis_prefix=None)
    cleanups.callback(launch.remove_state)
    launch.migrate()
    seeding = time.perf_counter()
    seeded = launch.manage("shell", "-c", SEED_SCRIPT.replace("SIZES", repr(sizes)), timeout=1800)
    seed_s = time.perf_counter() - seeding
    plan = json.loads(next(line for line in seeded.stdout.splitlines() if line.startswith("SEEDED="))[7:])
    gateway = launch.start(worker=False, timeout=STARTUP_TIMEOUT_S)
    cleanups.callback(gateway.stop)
    database = "postgresql" if is_postgres_url(args.database_url) else "sqlite3"
    print("OpenClaw fork benchmark")
    print(f"  database       {database} (harness store: sqlite3)")
    print(f"  python         {platform.python_implementation()} {platform.python_version()}")
    print(f"  seeding        {sum(sizes) * 2} transcript events and {sum(sizes)} native turns in {seed_s:.1f} s")
    print()
    header = f"{'fork':<10}{'source events':>14}{'copied':>8}{'n':>5}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}"
    print(header + f"{'ms per 1,000 copied':>21}")
    for kind in ("local", "upstream"):
        for size in sizes:
            key, entry, copied = plan[str(size)][kind]
            count = args.forks if size < 10_000 else max(3, args.forks // 4)
            samples = asyncio.run(measure(gateway.url, gateway.token, key, entry, count))
            stats = summarize(samples)
            per_thousand = stats["mean"] / max(copied, 1) * 1000
            print(
                f"{kind:<10}{size:>14,}{copied:>8,}{count:>5}{stats['p50']:>10.2f}{stats['p99']:>10.2f}"
                f"{stats['mean']:>10.2f}{per_thousand:>21.2f}"
            )
    print()
    print(f"gateway RSS at the end: {rss_mib(gateway.pid):.1f} MiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="PostgreSQL server to use (a scratch database is created and dropped)")
    parser.add_argument("--sizes", default="10,1000,10000", help="source transcript sizes, comma-separated")
    parser.add_argument("--forks", type=int, default=20, help="forks per source (a quarter for 10,000 events)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as cleanups:
        run(args, cleanups)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
