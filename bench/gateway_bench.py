"""Gateway benchmark: handshake time, RPC round trips, throughput and memory of ``manage.py serve``.

Starts a gateway as a subprocess (embedded profile by default; PostgreSQL and Redis when their
URLs are given), drives it with :class:`openclaw_client.client.GatewayClient` and prints a table.
See ``bench/README.md`` for what each figure means.

    .venv/bin/python bench/gateway_bench.py
    .venv/bin/python bench/gateway_bench.py --database-url postgres://postgres@127.0.0.1:5432/postgres \\
        --redis-url redis://127.0.0.1:6379/0 --json bench.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
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
    client_for,
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
    summarize,
    thread_count,
)
from openclaw_client.client import ConnectionClosed, GatewayClient, GatewayError  # noqa: E402
from openclaw_client.identity import DeviceIdentity  # noqa: E402
from tests.support.processes import GatewayLaunch, GatewayServer  # noqa: E402

METHODS = ("health", "node.list")
LOAD_WARMUP_CALLS = 20


# --- client side ------------------------------------------------------------------------------


async def timed_handshakes(url: str, token: str, count: int, *, same_device: bool) -> list[float]:
    """Seconds per full handshake (open, challenge, signed connect, hello-ok); closed after each."""
    identity = DeviceIdentity.generate() if same_device else None
    if same_device:  # the first connect pairs the device; it is not measured
        first = client_for(url, token, identity)
        await first.connect()
        await first.close()
    samples = []
    for _ in range(count):
        client = client_for(url, token, identity)  # a new identity each time unless same_device
        started = time.perf_counter()
        await client.connect()
        samples.append(time.perf_counter() - started)
        await client.close()
    return samples


async def timed_calls(client: GatewayClient, method: str, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await client.request(method)
        samples.append(time.perf_counter() - started)
    return samples


@dataclass
class LoadResult:
    """One client process's share of a throughput run."""

    connections: int
    completed: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    client_cpu_s: float = 0.0
    gateway_cpu_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)


async def _call_loop(client: GatewayClient, method: str, deadline: float, result: LoadResult) -> None:
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        try:
            await client.request(method)
        except GatewayError as error:
            result.errors += 1
            if len(result.error_samples) < 5:
                result.error_samples.append(str(error))
            continue
        except ConnectionClosed as closed:
            result.errors += 1
            result.error_samples.append(str(closed))
            return
        result.latencies_s.append(time.perf_counter() - started)
        result.completed += 1


async def run_load(
    url: str,
    token: str,
    *,
    connections: int,
    method: str,
    seconds: float,
    gateway_pid: int,
    gate: Callable[[], Awaitable[None]] | None = None,
) -> LoadResult:
    """``connections`` sockets, each looping sequential ``method`` calls for ``seconds``.

    Connecting and a short warm-up happen before ``gate`` (where several client processes line
    up); only the window after it is measured.
    """
    clients = await asyncio.gather(*(connected_client(url, token) for _ in range(connections)))
    result = LoadResult(connections=connections)
    try:
        for client in clients:
            await timed_calls(client, method, LOAD_WARMUP_CALLS)
        if gate is not None:
            await gate()
        client_cpu, gateway_cpu = own_cpu_seconds(), process_cpu_seconds(gateway_pid)
        started = time.perf_counter()
        await asyncio.gather(*(_call_loop(c, method, started + seconds, result) for c in clients))
        result.elapsed_s = time.perf_counter() - started
        result.client_cpu_s = own_cpu_seconds() - client_cpu
        result.gateway_cpu_s = process_cpu_seconds(gateway_pid) - gateway_cpu
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return result


def _load_process_main(kwargs: dict[str, Any], barrier: Any, results: Any) -> None:
    """Entry point of a client process (``--client-procs``): one asyncio loop, its connections."""

    async def gate() -> None:
        await asyncio.to_thread(barrier.wait, 120)

    try:
        result = asyncio.run(run_load(**kwargs, gate=gate))
        results.put(asdict(result))
    except BaseException as exc:
        barrier.abort()
        results.put({"failure": f"{type(exc).__name__}: {exc}"})


def split_evenly(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_throughput(
    url: str, token: str, *, method: str, connections: int, seconds: float, procs: int, gateway_pid: int
) -> LoadResult:
    """The summed result of ``procs`` client processes (or this process alone when procs is 1)."""
    kwargs: dict[str, Any] = {"method": method, "seconds": seconds, "gateway_pid": gateway_pid}
    if procs <= 1:
        return asyncio.run(run_load(url, token, connections=connections, **kwargs))
    shares = [n for n in split_evenly(connections, procs) if n > 0]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(shares))
    queue = context.Queue()
    workers = [
        context.Process(
            target=_load_process_main,
            args=({"url": url, "token": token, "connections": share, **kwargs}, barrier, queue),
            daemon=True,
        )
        for share in shares
    ]
    for worker in workers:
        worker.start()
    try:
        parts = [queue.get(timeout=seconds + 180) for _ in workers]
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
    failures = [p["failure"] for p in parts if "failure" in p]
    if failures:
        raise RuntimeError(f"client process failed: {failures[0]}")
    total = LoadResult(connections=connections)
    for part in parts:
        total.completed += part["completed"]
        total.errors += part["errors"]
        total.elapsed_s = max(total.elapsed_s, part["elapsed_s"])
        total.client_cpu_s += part["client_cpu_s"]
        total.latencies_s.extend(part["latencies_s"])
        total.error_samples.extend(part["error_samples"])
    # Every process measured the gateway over (nearly) the same window; take the widest reading.
    total.gateway_cpu_s = max(part["gateway_cpu_s"] for part in parts)
    return total


async def latency_and_facts(url: str, token: str, calls: int, warmup: int) -> tuple[dict, dict]:
    """Sequential round trips of each method on one connection, plus facts about the gateway."""
    client = await connected_client(url, token)
    try:
        hello = client.hello or {}
        health = await client.request("health")
        pairs = await client.request("device.pair.list")
        nodes = await client.request("node.list")
        facts = {
            "gatewayVersion": (hello.get("server") or {}).get("version"),
            "protocol": hello.get("protocol"),
            "databaseVendor": (health.get("database") or {}).get("vendor"),
            "pairedDevices": len(pairs.get("paired") or []),
            "nodes": len(nodes.get("nodes") or []),
        }
        latency = {}
        for method in METHODS:
            await timed_calls(client, method, warmup)
            latency[method] = summarize(await timed_calls(client, method, calls))
        return latency, facts
    finally:
        await client.close()


# --- the run ----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    postgres: ScratchPostgres | None = None
    redis_prefix: ScratchRedisPrefix | None = None
    database_url = args.database_url
    if is_postgres_url(database_url):
        postgres = ScratchPostgres(database_url)
    if args.redis_url:
        redis_prefix = ScratchRedisPrefix(args.redis_url)
    launch: GatewayLaunch | None = None
    gateway: GatewayServer | None = None
    report: dict[str, Any] = {}
    try:
        if postgres is not None:
            postgres.create()
            database_url = postgres.url
        if redis_prefix is not None:
            redis_prefix.check()
        launch = bench_gateway(
            database_url=database_url,
            redis_url=args.redis_url,
            redis_prefix=redis_prefix.prefix if redis_prefix else None,
        )
        progress("migrating a fresh database")
        launch.migrate()
        progress("starting the gateway")
        # No Celery worker, whatever the task mode: nothing here runs a turn.
        gateway = launch.start(worker=False, timeout=STARTUP_TIMEOUT_S)
        announced = gateway.announced()
        time.sleep(0.5)  # let the process settle before the idle reading
        idle_rss = rss_mib(gateway.pid)

        progress(f"{args.handshakes} handshakes with new devices, then {args.handshakes} with one known device")
        new_device = asyncio.run(timed_handshakes(gateway.url, gateway.token, args.handshakes, same_device=False))
        known_device = asyncio.run(timed_handshakes(gateway.url, gateway.token, args.handshakes, same_device=True))

        progress(f"{args.calls} sequential calls of each method on one connection")
        latency, facts = asyncio.run(latency_and_facts(gateway.url, gateway.token, args.calls, args.warmup))

        throughput = {}
        for method in METHODS:
            progress(f"{method}: {args.connections} connections for {args.seconds:g} s")
            load = run_throughput(
                gateway.url,
                gateway.token,
                method=method,
                connections=args.connections,
                seconds=args.seconds,
                procs=args.client_procs,
                gateway_pid=gateway.pid,
            )
            throughput[method] = {
                "connections": args.connections,
                "clientProcesses": max(1, min(args.client_procs, args.connections)),
                "seconds": load.elapsed_s,
                "completed": load.completed,
                "errors": load.errors,
                "errorSamples": load.error_samples[:5],
                "callsPerSecond": load.completed / load.elapsed_s if load.elapsed_s else 0.0,
                "latencyUnderLoad": summarize(load.latencies_s),
                "clientCpuPercentOfCore": 100 * load.client_cpu_s / load.elapsed_s if load.elapsed_s else 0.0,
                "gatewayCpuPercentOfCore": 100 * load.gateway_cpu_s / load.elapsed_s if load.elapsed_s else 0.0,
            }

        report = {
            "environment": {
                **base_environment(
                    announced=announced,
                    facts=facts,
                    postgres=postgres,
                    redis_prefix=redis_prefix,
                    redis_url=args.redis_url,
                ),
                "gatewayPid": gateway.pid,
                "gatewayThreadsAfterLoad": thread_count(gateway.pid),
                "pairedDevicesDuringLatencyRun": facts["pairedDevices"],
                "nodes": facts["nodes"],
            },
            "handshake": {"newDevice": summarize(new_device), "knownDevice": summarize(known_device)},
            "latency": latency,
            "throughput": throughput,
            "memory": {
                "idleRssMiB": idle_rss,
                "afterLoadRssMiB": rss_mib(gateway.pid),
                "peakRssMiB": peak_rss_mib(gateway.pid),
            },
        }
    finally:
        if gateway is not None:
            progress("stopping the gateway")
            gateway.stop()
            errors = count_errors(gateway.log())
            if not report:  # the run failed: show what the gateway said
                tail = gateway.log().splitlines()[-30:]
                print("--- last lines of the gateway log ---", *tail, sep="\n", file=sys.stderr)
            else:
                report["gatewayLog"] = {
                    "stopSeconds": gateway.stop_seconds,
                    "exitCode": gateway.process.returncode,
                    "errorRecords": sum(errors.values()),
                    "errorsByMessage": errors,
                }
        if launch is not None:
            if args.keep_state:
                progress(f"state and log kept in {launch.state_dir}")
            else:
                launch.remove_state()
        if postgres is not None:
            postgres.drop()
        if redis_prefix is not None:
            redis_prefix.cleanup()
    return report


# --- output -----------------------------------------------------------------------------------


def render(report: dict[str, Any], args: argparse.Namespace) -> str:
    env = report["environment"]
    lines = [
        "OpenClaw gateway benchmark",
        *environment_lines(env),
        "",
        latency_header("round trips (ms)"),
    ]
    rows = [
        ("connect+handshake, new device", report["handshake"]["newDevice"]),
        ("connect+handshake, known device", report["handshake"]["knownDevice"]),
        *((f"{method}, one connection", stats) for method, stats in report["latency"].items()),
    ]
    for label, stats in rows:
        lines.append(latency_row(label, stats))
    first = next(iter(report["throughput"].values()))
    lines += [
        "",
        f"throughput: {first['connections']} connections, {args.seconds:g} s, "
        f"{first['clientProcesses']} client process(es); CPU in % of one core",
        f"{'method':<12}{'calls/s':>10}{'calls':>9}{'errors':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'client CPU':>12}{'gateway CPU':>13}",
    ]
    for method, load in report["throughput"].items():
        stats = load["latencyUnderLoad"]
        lines.append(
            f"{method:<12}{load['callsPerSecond']:>10.0f}{load['completed']:>9}{load['errors']:>8}"
            f"{fmt_ms(stats.get('p50')):>9}{fmt_ms(stats.get('p99')):>9}"
            f"{load['clientCpuPercentOfCore']:>11.0f}%{load['gatewayCpuPercentOfCore']:>12.0f}%"
        )
        for sample in load["errorSamples"]:
            lines.append(f"    error: {sample}")
    memory = report["memory"]
    lines += [
        "",
        "gateway memory (RSS of the process and its children, MiB)",
        f"  idle after startup   {memory['idleRssMiB']:8.1f}",
        f"  after the load       {memory['afterLoadRssMiB']:8.1f}",
        f"  peak (VmHWM)         {memory['peakRssMiB']:8.1f}",
        "",
        f"gateway threads after the load: {env['gatewayThreadsAfterLoad']}; "
        f"paired devices during the round-trip run: {env['pairedDevicesDuringLatencyRun']}; nodes: {env['nodes']}",
    ]
    log = report.get("gatewayLog")
    if log:
        stop = f"{log['stopSeconds']:.2f} s" if log["stopSeconds"] is not None else "-"
        lines.append(
            f"gateway stop: exit code {log['exitCode']} after {stop}; ERROR records in its log: {log['errorRecords']}"
        )
        lines += [f"  {count:>5} x {message}" for message, count in list(log["errorsByMessage"].items())[:10]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--database-url", help="PostgreSQL server to use (a scratch database is created and dropped)")
    parser.add_argument("--redis-url", help="Redis for the channel layer and cache (a unique key prefix per run)")
    parser.add_argument("--connections", type=int, default=8, help="concurrent connections of the throughput runs")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each throughput run")
    parser.add_argument("--calls", type=int, default=1000, help="sequential calls per method on one connection")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured calls before the sequential ones")
    parser.add_argument("--handshakes", type=int, default=50, help="sequential handshakes per kind")
    parser.add_argument("--client-procs", type=int, default=1, help="spread the throughput load over N processes")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--keep-state", action="store_true", help="keep the gateway state dir and log")
    args = parser.parse_args(argv)
    for name in ("connections", "calls", "handshakes", "client_procs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.seconds <= 0 or args.warmup < 0:
        parser.error("--seconds must be positive and --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(render(report, args))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        progress(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
