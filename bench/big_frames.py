"""Huge frames: ``health`` latency over the wire while other connections send 1 MB ``chat.send`` frames (issue 27).

Starts a gateway the way ``bench/gateway_bench.py`` does (``manage.py migrate`` + ``manage.py serve``, embedded
profile unless URLs are given, with the benchmarks' framework floor in the same process), then measures ``health``
round trips, alternating with calls to the floor, from a process of their own: first with nothing else going on,
then while ``--connections`` connections (in ``--client-procs`` other processes) each send ``chat.send`` frames of
``--message-bytes`` of text back to back, every connection to a main session of its own. See ``bench/README.md``
("Huge frames").

    .venv/bin/python bench/big_frames.py
    .venv/bin/python bench/big_frames.py --database-url postgres://postgres@127.0.0.1:5432/postgres \\
        --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402  (the repository root must be importable first)
    connected_client,
    environment_lines,
    latency_header,
    latency_row,
    peak_rss_mib,
    process_cpu_seconds,
    progress,
    run_benchmark,
    summarize,
)
from bench.gateway_bench import OurGateway, Target, hello_facts, split_evenly  # noqa: E402
from openclaw_client.client import ConnectionClosed, GatewayError  # noqa: E402

# Text a model might be sent (words, spaces, line breaks), not one repeated character that compresses to nothing.
_PARAGRAPH = (
    "The gateway keeps the transcript and every placement record; workers come and go, and the gateway must "
    "recover cleanly when they vanish. Frames are JSON text, one object each.\n"
)
# Between two health calls: the prober measures the gateway, it does not load it.
HEALTH_PAUSE_S = 0.005
HEALTH_TIMEOUT_S = 10.0
# Time for the senders to connect before the measured window opens.
SENDERS_READY_TIMEOUT_S = 120.0


def message_text(size: int) -> str:
    return (_PARAGRAPH * (size // len(_PARAGRAPH) + 1))[:size]


@dataclass
class _Calls:
    """Round trips of one connection. A call that times out counts as a sample of its timeout, one whose
    connection closed as a sample of the time it waited (and the connection is not used again)."""

    samples: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    timeouts: int = 0

    async def time(self, client: Any) -> bool:
        """One call; False when the connection is gone."""
        started = time.perf_counter()
        try:
            await client.request("health", timeout=HEALTH_TIMEOUT_S)
        except TimeoutError:
            self.timeouts += 1
        except GatewayError as error:
            self.errors.append(str(error))
            return True
        except ConnectionClosed as closed:
            self.samples.append(time.perf_counter() - started)
            self.errors.append(f"connection closed: {closed}")
            return False
        self.samples.append(time.perf_counter() - started)
        return True


async def _probe(url: str, floor_url: str, token: str, seconds: float) -> dict[str, _Calls]:
    """``health`` on the gateway and the same call on the floor (bench/floor.py), one after the other, for
    ``seconds``. The floor does no work of its own in the same process: its round trip is what the machine,
    Daphne and the process's event loop add at that moment; what ``health`` takes beyond it is the gateway's
    own path for the call."""
    calls = {"health": _Calls(), "floor": _Calls()}
    clients: dict[str, Any] = {}
    try:
        for name, target in (("health", url), ("floor", floor_url)):
            try:
                clients[name] = await connected_client(target, token)
            except Exception as exc:  # a gateway that takes no connection: that is the figure
                calls[name].errors.append(f"could not connect: {type(exc).__name__}: {exc}")
                return calls
        for _ in range(20):  # warm-up, not measured
            for client in clients.values():
                with contextlib.suppress(GatewayError, TimeoutError, ConnectionClosed):
                    await client.request("health", timeout=HEALTH_TIMEOUT_S)
        deadline = time.perf_counter() + seconds
        live = dict(clients)
        while live and time.perf_counter() < deadline:
            for name, client in list(live.items()):
                if not await calls[name].time(client):
                    del live[name]
                await asyncio.sleep(HEALTH_PAUSE_S)
    finally:
        await asyncio.gather(*(client.close() for client in clients.values()), return_exceptions=True)
    return calls


async def _send_loop(client: Any, session_key: str, text: str, deadline: float, tally: dict[str, Any]) -> None:
    params = {"sessionKey": session_key, "message": text}
    while time.perf_counter() < deadline:
        try:
            await client.request("chat.send", {**params, "idempotencyKey": uuid.uuid4().hex}, timeout=120)
        except GatewayError as error:
            tally["errors"][str(error)] = tally["errors"].get(str(error), 0) + 1
        except (ConnectionClosed, TimeoutError) as error:
            tally["errors"][repr(error)] = tally["errors"].get(repr(error), 0) + 1
            return
        else:
            tally["ok"] += 1
        tally["frames"] += 1


async def _senders(url: str, token: str, keys: list[str], message_bytes: int, ready: Any, go: Any) -> dict:
    clients = await asyncio.gather(*(connected_client(url, token) for _ in keys))
    text = message_text(message_bytes)
    tally: dict[str, Any] = {"ok": 0, "frames": 0, "errors": {}}
    try:
        ready.set()
        seconds = await asyncio.to_thread(go.get, True, SENDERS_READY_TIMEOUT_S)
        deadline = time.perf_counter() + seconds
        await asyncio.gather(*(_send_loop(c, k, text, deadline, tally) for c, k in zip(clients, keys, strict=True)))
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return tally


def _sender_process(url: str, token: str, keys: list[str], message_bytes: int, ready: Any, go: Any, out: Any) -> None:
    try:
        out.put(asyncio.run(_senders(url, token, keys, message_bytes, ready, go)))
    except BaseException as exc:
        ready.set()
        out.put({"failure": f"{type(exc).__name__}: {exc}"})


def _prober_process(url: str, floor_url: str, token: str, seconds: float, out: Any) -> None:
    try:
        out.put({name: asdict(part) for name, part in asyncio.run(_probe(url, floor_url, token, seconds)).items()})
    except BaseException as exc:
        out.put({"failure": f"{type(exc).__name__}: {exc}"})


def _collect(queue: Any, timeout: float) -> dict:
    result = queue.get(timeout=timeout)
    if "failure" in result:
        raise RuntimeError(f"client process failed: {result['failure']}")
    return result


def measure_health(target: Target, seconds: float) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    prober = context.Process(
        target=_prober_process, args=(target.url, target.floor_url, target.token, seconds, out), daemon=True
    )
    prober.start()
    try:
        result = _collect(out, seconds + 300)
    finally:
        prober.join(10)
    report: dict[str, Any] = {}
    for name in ("health", "floor"):
        part = result[name]
        report[name] = {**summarize(part["samples"]), "timeouts": part["timeouts"], "errors": part["errors"][:5]}
    return report


def measure_under_load(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    url, token = target.url, target.token
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    shares = [n for n in split_evenly(args.connections, args.client_procs) if n > 0]
    # A main session is created by its first chat.send; any other key that was never created is refused.
    rest = "absent" if args.missing_sessions else "main"
    session_keys = [f"agent:bench-{n}:{rest}" for n in range(args.connections)]
    senders, readies, gos = [], [], []
    for index, share in enumerate(shares):
        first = sum(shares[:index])
        ready, go = context.Event(), context.Queue()
        process = context.Process(
            target=_sender_process,
            args=(url, token, session_keys[first : first + share], args.message_bytes, ready, go, out),
            daemon=True,
        )
        process.start()
        senders.append(process)
        readies.append(ready)
        gos.append(go)
    try:
        for ready in readies:
            ready.wait(SENDERS_READY_TIMEOUT_S)
        cpu_before = process_cpu_seconds(target.pid)
        for go in gos:
            go.put(args.seconds)
        time.sleep(1.0)  # the senders' first frames are in flight before the prober starts
        health = measure_health(target, args.seconds - 2.0)
        parts = [_collect(out, args.seconds + 180) for _ in senders]
        cpu = process_cpu_seconds(target.pid) - cpu_before
    finally:
        for process in senders:
            process.join(10)
            if process.is_alive():
                process.kill()
    errors: dict[str, int] = {}
    for part in parts:
        for message, count in part["errors"].items():
            errors[message] = errors.get(message, 0) + count
    frames = sum(part["frames"] for part in parts)
    return {
        **health,
        "chatSendFrames": frames,
        "chatSendOk": sum(part["ok"] for part in parts),
        "chatSendErrors": errors,
        "framesPerSecond": frames / args.seconds,
        "megabytesPerSecond": frames * args.message_bytes / args.seconds / 1e6,
        "gatewayCpuSeconds": cpu,
    }


def run(args: argparse.Namespace, cleanups: contextlib.ExitStack) -> dict[str, Any]:
    gateway = OurGateway(args)
    failed = True
    cleanups.callback(lambda: gateway.close(failed=failed))
    target = gateway.start()
    facts = asyncio.run(hello_facts(target))
    progress(f"health alone for {args.idle_seconds:g} s")
    idle = measure_health(target, args.idle_seconds)
    progress(
        f"health while {args.connections} connections send {args.message_bytes:,}-byte chat.send frames"
        f" for {args.seconds:g} s"
    )
    load_before = os.getloadavg()[0]
    loaded = measure_under_load(target, args)
    # The machine may be shared: its load says how much the figures owe to other work.
    loaded["machineLoadAverage"] = [load_before, os.getloadavg()[0]]
    report = {
        "environment": gateway.environment(facts),
        "settings": {
            "connections": args.connections,
            "clientProcs": args.client_procs,
            "messageBytes": args.message_bytes,
            "seconds": args.seconds,
            "idleSeconds": args.idle_seconds,
            "missingSessions": args.missing_sessions,
        },
        "idle": idle,
        "load": loaded,
        "peakRssMiB": peak_rss_mib(target.pid),
    }
    failed = False
    gateway.close(failed=False)
    report["gatewayLog"] = gateway.log_summary
    return report


def render(report: dict[str, Any], args: argparse.Namespace) -> str:
    settings, idle, load = report["settings"], report["idle"], report["load"]
    target = "sessions that do not exist (no turn runs)" if settings["missingSessions"] else "main sessions (turns run)"
    lines = [
        "OpenClaw gateway under huge frames",
        *environment_lines(report["environment"]),
        f"  load           {settings['connections']} connections ({settings['clientProcs']} client processes) sending"
        f" chat.send with {settings['messageBytes']:,} bytes of text back to back, {settings['seconds']:g} s,"
        f" to {target}",
        "",
        latency_header("round trip (ms)", width=44),
        latency_row("health, alone", idle["health"], width=44),
        latency_row("floor, alone", idle["floor"], width=44),
        latency_row("health, under the chat.send load", load["health"], width=44),
        latency_row("floor, under the chat.send load", load["floor"], width=44),
        "",
        f"chat.send frames answered   {load['chatSendFrames']:>8} ({load['framesPerSecond']:.1f}/s,"
        f" {load['megabytesPerSecond']:.1f} MB/s of text), ok {load['chatSendOk']}",
        f"gateway CPU under load      {load['gatewayCpuSeconds']:>8.1f} s; peak RSS {report['peakRssMiB']:.0f} MiB",
        "machine load average (1 min) {:.1f} before the load, {:.1f} after".format(*load["machineLoadAverage"]),
    ]
    errors = sorted(load["chatSendErrors"].items(), key=lambda item: -item[1])
    for message, count in errors[:3]:
        lines.append(f"  chat.send error x{count}: {message[:160]}")
    if len(errors) > 3:
        rest = sum(count for _message, count in errors[3:])
        lines.append(f"  ... and {rest} more, of {len(errors) - 3} other messages")
    for phase, figures in (("alone", idle), ("under load", load)):
        for name in ("health", "floor"):
            if figures[name]["timeouts"]:
                lines.append(
                    f"  {name} {phase}: {figures[name]['timeouts']} calls timed out"
                    f" ({HEALTH_TIMEOUT_S:g} s, counted at that)"
                )
            lines.extend(f"  {name} {phase} error: {message[:160]}" for message in figures[name]["errors"])
    log = report.get("gatewayLog") or {}
    lines.append(f"gateway log: {log.get('errorRecords', '-')} ERROR records, exit code {log.get('exitCode', '-')}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="PostgreSQL server to use (a scratch database is created and dropped)")
    parser.add_argument("--redis-url", help="Redis for the channel layer and cache (a unique key prefix per run)")
    parser.add_argument("--connections", type=int, default=8, help="connections sending chat.send frames")
    parser.add_argument("--client-procs", type=int, default=2, help="processes the sending connections are spread over")
    parser.add_argument("--message-bytes", type=int, default=1_000_000, help="text of each chat.send message")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the run under load")
    parser.add_argument(
        "--missing-sessions",
        action="store_true",
        help="send to sessions that do not exist: each frame is parsed and validated, then refused (no turn runs)",
    )
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="length of the health run alone")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--keep-state", action="store_true", help="keep the gateway state dir and log")
    args = parser.parse_args(argv)
    if args.connections < 1 or args.client_procs < 1 or args.message_bytes < 1:
        parser.error("--connections, --client-procs and --message-bytes must be at least 1")
    if args.seconds < 5 or args.idle_seconds <= 0:
        parser.error("--seconds must be at least 5 and --idle-seconds positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
