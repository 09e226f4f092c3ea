"""Gateway benchmark: handshake time, RPC round trips, throughput and memory of ``manage.py serve``.

Starts a gateway as a subprocess (embedded profile by default; PostgreSQL and Redis when their
URLs are given), drives it with :class:`openclaw_client.client.GatewayClient` and prints a table.
See ``bench/README.md`` for what each figure means.

    .venv/bin/python bench/gateway_bench.py
    .venv/bin/python bench/gateway_bench.py --database-url postgres://postgres@127.0.0.1:5432/postgres \\
        --redis-url redis://127.0.0.1:6379/0 --json bench.json
    .venv/bin/python bench/gateway_bench.py --metrics-compare --rounds 4 --scrape-connections 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402  (the repository root must be importable first)
    FLOOR_PATH,
    FLOOR_SETTINGS,
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

METHODS = ("health", "sessions.list", "node.list")
# Params sent with each method (None: no params member), the same for every gateway measured.
METHOD_PARAMS: dict[str, Any] = {"sessions.list": {}}
LOAD_WARMUP_CALLS = 20
# The floor answers any method alike; the name only shows in its request frames.
FLOOR_METHOD = "health"


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
    params = METHOD_PARAMS.get(method)
    for _ in range(count):
        started = time.perf_counter()
        await client.request(method, params)
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
    params = METHOD_PARAMS.get(method)
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        try:
            await client.request(method, params)
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
    gateway_pid: int | None,
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
        client_cpu, gateway_cpu = own_cpu_seconds(), _cpu(gateway_pid)
        started = time.perf_counter()
        await asyncio.gather(*(_call_loop(c, method, started + seconds, result) for c in clients))
        result.elapsed_s = time.perf_counter() - started
        result.client_cpu_s = own_cpu_seconds() - client_cpu
        result.gateway_cpu_s = _cpu(gateway_pid) - gateway_cpu
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return result


def _cpu(pid: int | None) -> float:
    """CPU seconds of the gateway's process tree; 0 for a gateway whose pid is not known (another machine's)."""
    return process_cpu_seconds(pid) if pid else 0.0


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
    url: str, token: str, *, method: str, connections: int, seconds: float, procs: int, gateway_pid: int | None
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


async def _optional(client: GatewayClient, method: str) -> dict[str, Any]:
    """A method's payload, or {} when this gateway does not serve it (another implementation)."""
    try:
        payload = await client.request(method, {} if method != "health" else None)
    except GatewayError:
        return {}
    return payload if isinstance(payload, dict) else {}


async def latency_and_facts(url: str, token: str, calls: int, warmup: int) -> tuple[dict, dict]:
    """Sequential round trips of each method on one connection, plus facts about the gateway."""
    client = await connected_client(url, token)
    try:
        hello = client.hello or {}
        health = await _optional(client, "health")
        pairs = await _optional(client, "device.pair.list")
        nodes = await _optional(client, "node.list")
        facts = {
            "gatewayVersion": (hello.get("server") or {}).get("version"),
            "protocol": hello.get("protocol"),
            "databaseVendor": (health.get("database") or {}).get("vendor") or "-",
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


async def floor_latency(url: str, token: str, calls: int, warmup: int) -> dict[str, float]:
    client = await connected_client(url, token)
    try:
        await timed_calls(client, FLOOR_METHOD, warmup)
        return summarize(await timed_calls(client, FLOOR_METHOD, calls))
    finally:
        await client.close()


# --- one measurement of one gateway -------------------------------------------------------------


@dataclass
class Target:
    """A gateway to measure: ours (started here, with its floor) or any OpenClaw-protocol gateway URL."""

    name: str
    url: str
    token: str
    pid: int | None = None  # known: its CPU and memory are read from /proc
    floor_url: str | None = None


def throughput_figures(load: LoadResult, connections: int, procs: int) -> dict[str, Any]:
    elapsed = load.elapsed_s
    return {
        "connections": connections,
        "clientProcesses": max(1, min(procs, connections)),
        "seconds": elapsed,
        "completed": load.completed,
        "errors": load.errors,
        "errorSamples": load.error_samples[:5],
        "callsPerSecond": load.completed / elapsed if elapsed else 0.0,
        "latencyUnderLoad": summarize(load.latencies_s),
        "clientCpuPercentOfCore": 100 * load.client_cpu_s / elapsed if elapsed else 0.0,
        "gatewayCpuPercentOfCore": 100 * load.gateway_cpu_s / elapsed if elapsed and load.gateway_cpu_s else None,
    }


def measure(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one gateway: handshakes, round trips, throughput, and its floor's when it has one."""
    url, token = target.url, target.token
    progress(f"{target.name}: {args.handshakes} handshakes with new devices, then {args.handshakes} with one known")
    new_device = asyncio.run(timed_handshakes(url, token, args.handshakes, same_device=False))
    known_device = asyncio.run(timed_handshakes(url, token, args.handshakes, same_device=True))
    progress(f"{target.name}: {args.calls} sequential calls of each method on one connection")
    latency, facts = asyncio.run(latency_and_facts(url, token, args.calls, args.warmup))
    throughput = {}
    for method in METHODS:
        progress(f"{target.name}: {method}, {args.connections} connections for {args.seconds:g} s")
        load = run_throughput(
            url,
            token,
            method=method,
            connections=args.connections,
            seconds=args.seconds,
            procs=args.client_procs,
            gateway_pid=target.pid,
        )
        throughput[method] = throughput_figures(load, args.connections, args.client_procs)
    result: dict[str, Any] = {
        "target": target.name,
        "url": url,
        "facts": facts,
        "handshake": {"newDevice": summarize(new_device), "knownDevice": summarize(known_device)},
        "latency": latency,
        "throughput": throughput,
    }
    if target.floor_url:
        floor_url = target.floor_url
        progress(f"{target.name}: the floor ({FLOOR_PATH}), handshakes, calls and {args.connections} connections")
        floor_load = run_throughput(
            floor_url,
            token,
            method=FLOOR_METHOD,
            connections=args.connections,
            seconds=args.seconds,
            procs=args.client_procs,
            gateway_pid=target.pid,
        )
        result["floor"] = {
            "handshake": summarize(asyncio.run(timed_handshakes(floor_url, token, args.handshakes, same_device=False))),
            "latency": asyncio.run(floor_latency(floor_url, token, args.calls, args.warmup)),
            "throughput": throughput_figures(floor_load, args.connections, args.client_procs),
        }
    if target.pid:
        result["memory"] = {"rssMiB": rss_mib(target.pid), "peakRssMiB": peak_rss_mib(target.pid)}
        result["threads"] = thread_count(target.pid)
    return result


# --- the run ----------------------------------------------------------------------------------


class OurGateway:
    """The project's gateway, started as the README does (``manage.py migrate`` + ``manage.py serve``) on scratch
    services, with the floor socket in the same process (``bench.settings``); :meth:`close` removes everything."""

    def __init__(
        self,
        args: argparse.Namespace,
        *,
        name: str = "project",
        extra_env: dict[str, str] | None = None,
        suffix: str = "",
    ):
        self.args = args
        self.name = name
        self.extra_env = extra_env or {}
        self.postgres = ScratchPostgres(args.database_url, suffix) if is_postgres_url(args.database_url) else None
        self.redis_prefix = ScratchRedisPrefix(args.redis_url) if args.redis_url else None
        self.launch: GatewayLaunch | None = None
        self.gateway: GatewayServer | None = None
        self.announced: tuple[str, str] | None = None
        self.idle_rss = 0.0
        self.log_summary: dict[str, Any] | None = None

    def start(self) -> Target:
        database_url = self.args.database_url
        if self.postgres is not None:
            self.postgres.create()
            database_url = self.postgres.url
        if self.redis_prefix is not None:
            self.redis_prefix.check()
        self.launch = bench_gateway(
            database_url=database_url,
            redis_url=self.args.redis_url,
            redis_prefix=self.redis_prefix.prefix if self.redis_prefix else None,
            extra_env={**FLOOR_SETTINGS, **self.extra_env},
        )
        progress(f"{self.name}: migrating a fresh database")
        self.launch.migrate()
        progress(f"{self.name}: starting the gateway")
        # No Celery worker, whatever the task mode: nothing here runs a turn.
        self.gateway = self.launch.start(worker=False, timeout=STARTUP_TIMEOUT_S)
        self.announced = self.gateway.announced()
        time.sleep(0.5)  # let the process settle before the idle reading
        self.idle_rss = rss_mib(self.gateway.pid)
        return Target(
            name=self.name,
            url=self.gateway.url,
            token=self.gateway.token,
            pid=self.gateway.pid,
            floor_url=self.gateway.url + FLOOR_PATH,
        )

    def close(self, *, failed: bool) -> None:
        if self.gateway is not None and self.log_summary is None:
            progress(f"{self.name}: stopping the gateway")
            self.gateway.stop()
            errors = count_errors(self.gateway.log())
            if failed:
                tail = self.gateway.log().splitlines()[-30:]
                print("--- last lines of the gateway log ---", *tail, sep="\n", file=sys.stderr)
            self.log_summary = {
                "stopSeconds": self.gateway.stop_seconds,
                "exitCode": self.gateway.process.returncode,
                "errorRecords": sum(errors.values()),
                "errorsByMessage": errors,
            }
        if self.launch is not None:
            if self.args.keep_state:
                progress(f"state and log kept in {self.launch.state_dir}")
            else:
                self.launch.remove_state()
            self.launch = None
        if self.postgres is not None:
            self.postgres.drop()
        if self.redis_prefix is not None:
            self.redis_prefix.cleanup()

    def environment(self, facts: dict[str, Any]) -> dict[str, Any]:
        assert self.gateway is not None
        return {
            **base_environment(
                announced=self.announced,
                facts=facts,
                postgres=self.postgres,
                redis_prefix=self.redis_prefix,
                redis_url=self.args.redis_url,
            ),
            "gatewayPid": self.gateway.pid,
            "idleRssMiB": self.idle_rss,
        }


def other_targets(args: argparse.Namespace) -> list[Target]:
    """The ``--against`` gateways, in the order given, each with its own token, pid and label."""
    labels = args.against_label or default_labels(len(args.against))
    pids = args.against_pid or [0] * len(args.against)
    return [
        Target(name=label, url=url, token=token, pid=pid or None)
        for url, token, pid, label in zip(args.against, args.against_token, pids, labels, strict=True)
    ]


def default_labels(count: int) -> list[str]:
    return ["other"] if count == 1 else [f"other-{n}" for n in range(1, count + 1)]


def alternating(targets: list[Target], rounds: int) -> list[Target]:
    """Every target once per round, in the same order each round: each is measured in the same minutes as the rest."""
    return [target for _ in range(rounds) for target in targets]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One of three modes: ours alone (with its floor), another gateway alone (``--url``), or ours and the others
    alternately, ``--rounds`` times each (``--against``, repeatable)."""
    if args.url:
        other = Target(name="other", url=args.url, token=args.token, pid=args.pid)
        return {"mode": "url", "runs": [measure(other, args)]}
    if args.metrics_compare:
        return run_metrics_compare(args)
    ours = OurGateway(args)
    report: dict[str, Any] = {}
    try:
        project = ours.start()
        if args.against:
            targets = [project, *other_targets(args)]
            runs = []
            for index, target in enumerate(alternating(targets, args.rounds)):
                if index % len(targets) == 0:
                    progress(f"round {index // len(targets) + 1} of {args.rounds}")
                runs.append(measure(target, args))
            report = {"mode": "side-by-side", "labels": [t.name for t in targets[1:]], "runs": runs}
        else:
            report = {"mode": "project", "runs": [measure(project, args)]}
        report["environment"] = ours.environment(report["runs"][0]["facts"])
    finally:
        ours.close(failed=not report)
    report["gatewayLog"] = ours.log_summary
    return report


# --- metrics on vs off (docs/operations.md, Metrics) ------------------------------------------

METRICS_METHODS = ("sessions.list", "health")
METRICS_SWITCH = "OPENCLAW_METRICS_ENABLED"
# Connections opened at once while the scrape benchmark fills the gateway up.
CONNECT_BATCH = 50


def run_metrics_compare(args: argparse.Namespace) -> dict[str, Any]:
    """Two gateways of the same profile, one with metrics on and one with them off, measured in the same minutes:
    each round runs every method on both, the order swapped every round (on, off / off, on) so that a drift of
    the machine weighs on both alike. Then, optionally, the scrape time of /metrics with N connections open."""
    gateways = {
        "on": OurGateway(args, name="metrics on", extra_env={METRICS_SWITCH: "1"}, suffix="_on"),
        "off": OurGateway(args, name="metrics off", extra_env={METRICS_SWITCH: "0"}, suffix="_off"),
    }
    # Which one starts first is not neutral on a busy machine (the first was the slower one in A/A runs, where both
    # had metrics on): --metrics-start-first swaps it, so that runs in both orders can be set side by side.
    start_order = ("on", "off") if args.metrics_start_first == "on" else ("off", "on")
    report: dict[str, Any] = {}
    try:
        targets = {key: gateways[key].start() for key in start_order}
        rounds = []
        for index in range(args.rounds):
            progress(f"round {index + 1} of {args.rounds}")
            order = ("on", "off") if index % 2 == 0 else ("off", "on")
            figures: dict[str, dict[str, Any]] = {"on": {}, "off": {}}
            for method in METRICS_METHODS:
                for key in order:
                    target = targets[key]
                    progress(f"{target.name}: {method}, {args.connections} connections for {args.seconds:g} s")
                    load = run_throughput(
                        target.url,
                        target.token,
                        method=method,
                        connections=args.connections,
                        seconds=args.seconds,
                        procs=args.client_procs,
                        gateway_pid=target.pid,
                    )
                    figures[key][method] = throughput_figures(load, args.connections, args.client_procs)
            rounds.append(figures)
        report = {"mode": "metrics", "startedFirst": start_order[0], "rounds": rounds}
        if args.scrape_connections:
            report["scrape"] = asyncio.run(scrape_times(targets["on"], args.scrape_connections, args.scrapes))
        report["environment"] = gateways["on"].environment(asyncio.run(hello_facts(targets["on"])))
    finally:
        for gateway in gateways.values():
            gateway.close(failed=not report)
    report["gatewayLog"] = gateways["on"].log_summary
    return report


async def hello_facts(target: Target) -> dict[str, Any]:
    client = await connected_client(target.url, target.token)
    try:
        return {
            "gatewayVersion": client.hello["server"].get("version"),
            "protocol": client.hello.get("protocol"),
            "databaseVendor": None,
        }
    finally:
        await client.close()


async def _timed_scrapes(url: str, count: int) -> tuple[list[float], str]:
    samples, text = [], ""
    async with httpx.AsyncClient(timeout=60) as http:
        for _ in range(count):
            started = time.perf_counter()
            response = await http.get(url)
            samples.append(time.perf_counter() - started)
            response.raise_for_status()
            text = response.text
    return samples, text


def _scraped_connections(text: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "openclaw_gateway_connections" and sample.labels == {"role": "operator"}:
                return sample.value
    return None


async def scrape_times(target: Target, connections: int, scrapes: int) -> dict[str, Any]:
    """/metrics scraped ``scrapes`` times from loopback with no client connected, then with ``connections`` open."""
    url = target.url.replace("ws://", "http://", 1) + "/metrics"
    progress(f"{target.name}: {scrapes} scrapes of /metrics with no connection open")
    idle, _ = await _timed_scrapes(url, scrapes)
    clients: list[GatewayClient] = []
    try:
        progress(f"{target.name}: opening {connections} connections")
        while len(clients) < connections:
            batch = min(CONNECT_BATCH, connections - len(clients))
            clients += await asyncio.gather(*(connected_client(target.url, target.token) for _ in range(batch)))
        progress(f"{target.name}: {scrapes} scrapes of /metrics with {connections} connections open")
        loaded, text = await _timed_scrapes(url, scrapes)
    finally:
        await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)
    return {
        "connections": connections,
        "scrapes": scrapes,
        "idle": summarize(idle),
        "loaded": summarize(loaded),
        "bytes": len(text.encode("utf-8")),
        "connectionsReported": _scraped_connections(text),
    }


def _cpu_per_call_us(load: dict[str, Any]) -> float | None:
    """The gateway's CPU time per completed call: steadier than calls/s on a shared machine, since time other
    processes take from the gateway does not count."""
    cpu = load["gatewayCpuPercentOfCore"]
    if cpu is None or not load["completed"]:
        return None
    return cpu / 100 * load["seconds"] / load["completed"] * 1e6


def _spread(values: list[float]) -> str:
    return f"{min(values):.0f}–{max(values):.0f}" if values else "-"


def render_metrics_compare(report: dict[str, Any]) -> list[str]:
    rounds = report["rounds"]
    first = rounds[0]["on"][METRICS_METHODS[0]]
    lines = [
        f"metrics on vs off: calls/s, {first['connections']} connections, {len(rounds)} alternating round(s), "
        f"metrics {report['startedFirst']} started first; difference = on/off - 1 per round (paired), its median "
        "and range",
        f"{'method':<15}{'on median':>11}{'off median':>12}{'on range':>15}{'off range':>15}"
        f"{'diff median':>13}{'diff range':>18}{'errors':>8}",
    ]
    for method in METRICS_METHODS:
        on = [r["on"][method]["callsPerSecond"] for r in rounds]
        off = [r["off"][method]["callsPerSecond"] for r in rounds]
        diffs = [100 * (a / b - 1) for a, b in zip(on, off, strict=True) if b]
        errors = sum(r[k][method]["errors"] for r in rounds for k in ("on", "off"))
        lines.append(
            f"{method:<15}{statistics.median(on):>11.0f}{statistics.median(off):>12.0f}{_spread(on):>15}"
            f"{_spread(off):>15}{statistics.median(diffs):>+12.1f}%"
            f"{f'{min(diffs):+.1f} … {max(diffs):+.1f} %':>18}{errors:>8}"
        )
        lines.append(
            f"{'':<15}per round on:  "
            + ", ".join(f"{v:.0f}" for v in on)
            + "   off: "
            + ", ".join(f"{v:.0f}" for v in off)
        )
        cpu_on = [_cpu_per_call_us(r["on"][method]) for r in rounds]
        cpu_off = [_cpu_per_call_us(r["off"][method]) for r in rounds]
        if None not in cpu_on and None not in cpu_off:
            cpu_diffs = [100 * (a / b - 1) for a, b in zip(cpu_on, cpu_off, strict=True) if b]
            lines.append(
                f"{'':<15}gateway CPU per call (µs): on {statistics.median(cpu_on):.1f}, off "
                f"{statistics.median(cpu_off):.1f}; paired difference median {statistics.median(cpu_diffs):+.1f} % "
                f"(range {min(cpu_diffs):+.1f} … {max(cpu_diffs):+.1f} %)"
            )
    scrape = report.get("scrape")
    if scrape:
        lines += [
            "",
            f"/metrics scrape time (ms), {scrape['scrapes']} scrapes each, from loopback:",
            latency_header("", 36),
            latency_row("no connection open", scrape["idle"], 36),
            latency_row(f"{scrape['connections']} connections open", scrape["loaded"], 36),
            f"scrape size {scrape['bytes']} bytes; connections reported by the scrape: {scrape['connectionsReported']}",
        ]
    return lines


# --- output -----------------------------------------------------------------------------------


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value is not None and base else "-"


def _pct(value: float | None, base: float | None) -> str:
    return f"{100 * value / base:.0f} %" if value is not None and base else "-"


def render_run(result: dict[str, Any]) -> list[str]:
    """One gateway's tables; figures as ratios to the floor when it has one."""
    floor = result.get("floor")
    floor_hs = floor["handshake"]["p50"] if floor else None
    floor_rt = (floor["latency"]["p50"], floor["latency"]["p99"]) if floor else (None, None)
    floor_cps = floor["throughput"]["callsPerSecond"] if floor else None
    width = 36
    lines = [
        f"{result['target']} ({result['url']}, version {result['facts']['gatewayVersion'] or '-'})",
        latency_header("round trips (ms)", width) + f"{'p50/floor':>11}{'p99/floor':>11}",
    ]
    rows: list[tuple[str, dict, tuple]] = [
        ("connect+handshake, new device", result["handshake"]["newDevice"], (floor_hs, None)),
        ("connect+handshake, known device", result["handshake"]["knownDevice"], (floor_hs, None)),
        *((f"{method}, one connection", stats, floor_rt) for method, stats in result["latency"].items()),
    ]
    if floor:
        rows += [
            ("floor: connect+handshake", floor["handshake"], (None, None)),
            ("floor: request, one connection", floor["latency"], (None, None)),
        ]
    for label, stats, (base50, base99) in rows:
        lines.append(
            latency_row(label, stats, width)
            + f"{_ratio(stats.get('p50'), base50):>11}{_ratio(stats.get('p99'), base99):>11}"
        )
    loads = dict(result["throughput"])
    if floor:
        loads["floor"] = floor["throughput"]
    first = next(iter(loads.values()))
    lines += [
        "",
        f"throughput: {first['connections']} connections, {first['clientProcesses']} client process(es); "
        "CPU in % of one core",
        f"{'method':<15}{'calls/s':>9}{'of floor':>10}{'calls':>8}{'errors':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'p50/floor':>11}{'client CPU':>12}{'gateway CPU':>13}",
    ]
    for method, load in loads.items():
        stats = load["latencyUnderLoad"]
        base = floor["throughput"] if floor and method != "floor" else None
        base_p50 = base["latencyUnderLoad"].get("p50") if base else None
        gateway_cpu = load["gatewayCpuPercentOfCore"]
        lines.append(
            f"{method:<15}{load['callsPerSecond']:>9.0f}{_pct(load['callsPerSecond'], floor_cps if base else None):>10}"
            f"{load['completed']:>8}{load['errors']:>8}{fmt_ms(stats.get('p50')):>9}{fmt_ms(stats.get('p99')):>9}"
            f"{_ratio(stats.get('p50'), base_p50):>11}{load['clientCpuPercentOfCore']:>11.0f}%"
            + (f"{gateway_cpu:>12.0f}%" if gateway_cpu is not None else f"{'-':>13}")
        )
        for sample in load["errorSamples"]:
            lines.append(f"    error: {sample}")
    if "memory" in result:
        lines.append(
            f"memory after the run: RSS {result['memory']['rssMiB']:.1f} MiB "
            f"(peak {result['memory']['peakRssMiB']:.1f}), {result['threads']} threads"
        )
    return lines


def headline(result: dict[str, Any]) -> dict[str, float | None]:
    """The figures compared side by side."""
    figures: dict[str, float | None] = {
        "handshake p50, new device (ms)": result["handshake"]["newDevice"].get("p50"),
        "handshake p50, known device (ms)": result["handshake"]["knownDevice"].get("p50"),
    }
    for method, stats in result["latency"].items():
        figures[f"{method} p50, one connection (ms)"] = stats.get("p50")
        figures[f"{method} p99, one connection (ms)"] = stats.get("p99")
    for method, load in result["throughput"].items():
        figures[f"{method} calls/s, {load['connections']} connections"] = load["callsPerSecond"]
    return figures


def _median(values: list[float | None]) -> float | None:
    present = sorted(v for v in values if v is not None)
    if not present:
        return None
    middle = len(present) // 2
    return present[middle] if len(present) % 2 else (present[middle - 1] + present[middle]) / 2


def render_side_by_side(runs: list[dict[str, Any]], labels: list[str]) -> list[str]:
    """Medians over the rounds: the project, each other gateway, the project's ratio to each, and to its floor."""
    ours = [headline(r) for r in runs if r["target"] == "project"]
    others = {label: [headline(r) for r in runs if r["target"] == label] for label in labels}
    floors = [r["floor"] for r in runs if r.get("floor")]
    column = max(12, *(len(label) + 2 for label in labels))
    lines = [
        f"side by side: medians of {len(ours)} alternating round(s); project/X > 1 means the project is slower "
        "(round trips) or faster (calls/s)",
        f"{'figure':<44}{'project':>10}"
        + "".join(f"{label:>{column}}" for label in labels)
        + "".join(f"{'project/' + label:>{column + 8}}" for label in labels)
        + f"{'project/floor':>15}",
    ]
    floor_hs = _median([f["handshake"].get("p50") for f in floors])
    floor_rt = _median([f["latency"].get("p50") for f in floors])
    floor_rt99 = _median([f["latency"].get("p99") for f in floors])
    floor_cps = _median([f["throughput"]["callsPerSecond"] for f in floors])
    for name in ours[0]:
        mine = _median([h[name] for h in ours])
        theirs = [_median([h.get(name) for h in others[label]]) for label in labels]
        if "handshake" in name:
            base = floor_hs
        elif "calls/s" in name:
            base = floor_cps
        else:
            base = floor_rt99 if " p99" in name else floor_rt
        to_floor = _pct(mine, base) if "calls/s" in name else _ratio(mine, base)
        lines.append(
            f"{name:<44}{_figure(mine):>10}"
            + "".join(f"{_figure(value):>{column}}" for value in theirs)
            + "".join(f"{_ratio(mine, value):>{column + 8}}" for value in theirs)
            + f"{to_floor:>15}"
        )
    lines.append(
        f"{'floor (project): handshake / request p50 (ms), calls/s':<44}"
        f"{fmt_ms(floor_hs)} / {fmt_ms(floor_rt)} / {floor_cps or 0:.0f}"
    )
    return lines


def _figure(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def render(report: dict[str, Any], args: argparse.Namespace) -> str:
    lines = ["OpenClaw gateway benchmark" + (f" (mode: {report['mode']})" if report["mode"] != "project" else "")]
    env = report.get("environment")
    if env:
        lines += environment_lines(env)
        lines.append(f"  idle RSS       {env['idleRssMiB']:.1f} MiB (project gateway, right after startup)")
    if report["mode"] == "metrics":
        return "\n".join([*lines, "", *render_metrics_compare(report)])
    for result in report["runs"]:
        lines += ["", *render_run(result)]
    if report["mode"] == "side-by-side":
        lines += ["", *render_side_by_side(report["runs"], report["labels"])]
    facts = report["runs"][0]["facts"]
    lines += [
        "",
        f"paired devices during the first round-trip run: {facts['pairedDevices']}; nodes: {facts['nodes']}",
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
    parser.add_argument("--url", help="measure this OpenClaw-protocol gateway instead of starting ours (no floor)")
    parser.add_argument("--token", help="the shared token of --url")
    parser.add_argument("--pid", type=int, help="the process id of --url's gateway, for its CPU and memory")
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="URL",
        help="start ours and measure it and this gateway URL alternately (repeatable: one more gateway each time)",
    )
    parser.add_argument(
        "--against-token", action="append", default=[], metavar="T", help="the shared token of each --against, in order"
    )
    parser.add_argument(
        "--against-pid",
        action="append",
        default=[],
        type=int,
        metavar="P",
        help="the process id of each --against's gateway, in order (0: not known); all or none",
    )
    parser.add_argument(
        "--against-label",
        action="append",
        default=[],
        metavar="NAME",
        help="the name of each --against in the tables, in order; all or none (default: other, or other-1, other-2…)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of --against or --metrics-compare")
    parser.add_argument(
        "--metrics-compare",
        action="store_true",
        help="start two gateways, metrics on and off, and compare sessions.list and health calls/s (--rounds)",
    )
    parser.add_argument(
        "--scrape-connections",
        type=int,
        default=0,
        metavar="N",
        help="with --metrics-compare: also time /metrics scrapes with N connections open (e.g. 1000)",
    )
    parser.add_argument("--scrapes", type=int, default=20, help="scrapes timed per reading of --scrape-connections")
    parser.add_argument(
        "--metrics-start-first",
        choices=("on", "off"),
        default="on",
        help="with --metrics-compare: which gateway starts first (default on)",
    )
    parser.add_argument("--connections", type=int, default=8, help="concurrent connections of the throughput runs")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each throughput run")
    parser.add_argument("--calls", type=int, default=1000, help="sequential calls per method on one connection")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured calls before the sequential ones")
    parser.add_argument("--handshakes", type=int, default=50, help="sequential handshakes per kind")
    parser.add_argument("--client-procs", type=int, default=1, help="spread the throughput load over N processes")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--keep-state", action="store_true", help="keep the gateway state dir and log")
    args = parser.parse_args(argv)
    for name in ("connections", "calls", "handshakes", "client_procs", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.seconds <= 0 or args.warmup < 0:
        parser.error("--seconds must be positive and --warmup not negative")
    if args.metrics_compare and (args.url or args.against):
        parser.error("--metrics-compare starts its own two gateways: not with --url or --against")
    if args.scrape_connections and not args.metrics_compare:
        parser.error("--scrape-connections is part of --metrics-compare")
    if args.scrape_connections < 0 or args.scrapes < 1:
        parser.error("--scrape-connections must not be negative and --scrapes at least 1")
    if args.url and args.against:
        parser.error("--url measures another gateway alone, --against beside ours: one or the other")
    if args.url and not args.token:
        parser.error("--url needs --token")
    if len(args.against_token) != len(args.against):
        parser.error("each --against needs its --against-token, in the same order")
    for option, given in (("--against-pid", args.against_pid), ("--against-label", args.against_label)):
        if given and len(given) != len(args.against):
            parser.error(f"{option} is given for every --against, in the same order, or not at all")
    labels = args.against_label or default_labels(len(args.against))
    if "project" in labels or len(set(labels)) != len(labels):
        parser.error("--against-label names must differ from each other and from 'project'")
    if args.url and (args.database_url or args.redis_url):
        parser.error("--database-url and --redis-url are for our gateway, which --url does not start")
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
