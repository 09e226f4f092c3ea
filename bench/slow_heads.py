"""Slow request heads against a live gateway: N connections send ``GET /api/gateway/health HTTP/1.1``, ``Host`` and
the start of a header, then one byte every ``--interval`` seconds (each byte restarts Twisted's 10 s idle timeout),
from ``--addresses`` loopback addresses (127.0.0.1, 127.0.0.2, …). Meanwhile a client at another address
(127.0.0.250) asks ``GET /api/gateway/health`` on a fresh connection every ``--probe-interval`` seconds.

Reported: how each slow connection ended (408 at the head deadline, 429 for an address over its bound of slow heads,
closed without an answer, or still open when the benchmark gave up) and after how long; the health probe's latency
before and during the attack; the gateway's CPU and memory. The gateway is started as ``./dev run`` starts it
(``bootstrap``, ``manage.py serve``) on the embedded profile, in a scratch state directory, with the head settings
given here (``--head-timeout-ms 600000 --per-address 100000`` shows what it was like without them).

    .venv/bin/python bench/slow_heads.py
    .venv/bin/python bench/slow_heads.py --addresses 10
    .venv/bin/python bench/slow_heads.py --head-timeout-ms 600000 --per-address 100000 --give-up 40
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    bench_gateway,
    latency_header,
    latency_row,
    process_cpu_seconds,
    progress,
    rss_mib,
    summarize,
)

PARTIAL_HEAD = b"GET /api/gateway/health HTTP/1.1\r\nHost: gateway\r\nX-a: "
HEALTH = b"GET /api/gateway/health HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n"
PROBE_ADDRESS = "127.0.0.250"


def status_of(answer: bytes) -> str:
    if not answer:
        return "closed, no answer"
    line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    return line.split(" ", 1)[1] if " " in line else line


async def dribble(port: int, source: str, interval: float, give_up: float) -> tuple[str, float]:
    """(how the connection ended, seconds from connect to that end)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    connected = time.monotonic()
    writer.write(PARTIAL_HEAD)
    answer = b""
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), interval)
            except TimeoutError:
                if time.monotonic() - connected > give_up:
                    return "still open", time.monotonic() - connected
                writer.write(b"a")
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return status_of(answer), time.monotonic() - connected
            answer += chunk
    finally:
        writer.close()


async def health_once(port: int) -> tuple[float, str]:
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(PROBE_ADDRESS, 0))
    writer.write(HEALTH)
    answer = await reader.read()
    writer.close()
    return time.perf_counter() - started, status_of(answer)


async def probe(port: int, interval: float, stop: asyncio.Event) -> tuple[list[float], Counter]:
    samples: list[float] = []
    statuses: Counter = Counter()
    while not stop.is_set():
        seconds, status = await health_once(port)
        samples.append(seconds)
        statuses[status] += 1
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except TimeoutError:
            pass
    return samples, statuses


async def attack(args: argparse.Namespace, port: int, pid: int) -> dict:
    stop = asyncio.Event()
    baseline_task = asyncio.create_task(probe(port, args.probe_interval, stop))
    await asyncio.sleep(args.baseline)
    stop.set()
    baseline, baseline_statuses = await baseline_task

    stop = asyncio.Event()
    during_task = asyncio.create_task(probe(port, args.probe_interval, stop))
    cpu_before = process_cpu_seconds(pid)
    started = time.monotonic()
    sources = [f"127.0.0.{1 + i % args.addresses}" for i in range(args.connections)]
    ends = await asyncio.gather(*(dribble(port, source, args.interval, args.give_up) for source in sources))
    elapsed = time.monotonic() - started
    cpu = process_cpu_seconds(pid) - cpu_before
    rss = rss_mib(pid)
    stop.set()
    during, during_statuses = await during_task
    by_status: dict[str, list[float]] = {}
    for status, seconds in ends:
        by_status.setdefault(status, []).append(seconds)
    return {
        "baseline": summarize(baseline),
        "baselineStatuses": dict(baseline_statuses),
        "during": summarize(during),
        "duringStatuses": dict(during_statuses),
        "ends": {status: summarize(seconds) for status, seconds in by_status.items()},
        "attackSeconds": elapsed,
        "gatewayCpuSeconds": cpu,
        "gatewayRssMiB": rss,
    }


def render(report: dict, args: argparse.Namespace) -> str:
    lines = [
        f"slow request heads: {args.connections} connections from {args.addresses} address(es), a byte every "
        f"{args.interval:g} s; head deadline {args.head_timeout_ms} ms, {args.per_address} slow heads per address",
        "",
        latency_header("how the slow connections ended (ms after connect)"),
    ]
    for status, stats in sorted(report["ends"].items()):
        lines.append(latency_row(status, stats))
    lines += [
        "",
        latency_header(f"GET /api/gateway/health from {PROBE_ADDRESS} (ms)"),
        latency_row("before the attack", report["baseline"]),
        latency_row("during the attack", report["during"]),
        f"  answers before: {report['baselineStatuses']}, during: {report['duringStatuses']}",
        "",
        f"attack lasted {report['attackSeconds']:.1f} s; gateway CPU meanwhile {report['gatewayCpuSeconds']:.2f} s, "
        f"RSS after {report['gatewayRssMiB']:.1f} MiB",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--addresses", type=int, default=1, help="loopback addresses the connections come from")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between two dribbled bytes")
    parser.add_argument("--head-timeout-ms", type=int, default=10_000, help="OPENCLAW_HTTP_HEAD_TIMEOUT_MS")
    parser.add_argument("--per-address", type=int, default=32, help="OPENCLAW_HTTP_SLOW_HEADS_PER_ADDRESS")
    parser.add_argument("--give-up", type=float, default=30.0, help="seconds after which a dribbler stops")
    parser.add_argument("--baseline", type=float, default=5.0, help="seconds of health probes before the attack")
    parser.add_argument("--probe-interval", type=float, default=0.1)
    args = parser.parse_args()
    if not 1 <= args.addresses <= 249:
        parser.error("--addresses must be between 1 and 249 (127.0.0.250 is the probe's)")

    launch = bench_gateway(
        database_url=None,
        redis_url=None,
        redis_prefix=None,
        extra_env={
            "OPENCLAW_HTTP_HEAD_TIMEOUT_MS": str(args.head_timeout_ms),
            "OPENCLAW_HTTP_SLOW_HEADS_PER_ADDRESS": str(args.per_address),
        },
    )
    try:
        progress("bootstrap")
        launch.manage("bootstrap", timeout=300)
        server = launch.start(worker=False)
        try:
            progress(f"{args.baseline:g} s of health probes, then the attack")
            report = asyncio.run(attack(args, server.port, server.pid))
        finally:
            server.stop()
    finally:
        launch.remove_state()
    print(render(report, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
