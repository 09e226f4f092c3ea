"""Tool-loop benchmark (issue 22): what a tool step adds to an agent turn, locally and on a node; the exec approval
round trip; an ``exec`` of ``true`` on a node.

Starts a gateway as the README does (``manage.py bootstrap``, then ``manage.py serve`` in a subprocess; the embedded
profile by default, PostgreSQL + Redis + a Celery worker that runs the turns when their URLs are given), the project's
mock OpenAI server as the model (it answers ``TOOL_PLAN:`` messages with the plan's tool calls, step by step, decided
from the transcript it is sent, and at once) and the project's node host (``python -m openclaw_client.node``), paired,
with a worktree session dispatched to it. Measures, over one operator connection (``chat.send`` → ``agent.wait``):

1. the overhead of a tool step on a local session: turns of N ∈ {1, 4, 16} steps of one no-op call each (``read`` of
   a 3-byte file) alternating with plain turns (no tool call), ``(N-step turn − plain turn) / N``, and how much of
   that is the model's extra HTTP round trips (the recorded requests replayed against the mock);
2. the same on the node session;
3. the approval round trip of an ``exec`` the default policy asks about, resolved ``allow-once`` at once from a
   second connection holding ``operator.approvals``, locally and on the node;
4. an ``exec`` of ``true`` (policy ``full``/``off`` for the agent and on the node): the step, and the tool's own
   ``durationMs``.

See ``bench/README.md`` ("Tool-loop benchmark") for what each figure means.

    .venv/bin/python bench/agent_tools.py
    .venv/bin/python bench/agent_tools.py --database-url postgres://postgres@127.0.0.1:5432/postgres \\
        --redis-url redis://127.0.0.1:6379/0 --json agent-tools.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402  (the repository root must be importable first)
    base_environment,
    environment_lines,
    fmt_ms,
    progress,
    run_benchmark,
    summarize,
)
from bench.node_workers import (  # noqa: E402
    GIT,
    NODE_CAPACITY,
    NODE_CAPACITY_WAIT_MS,
    gateway_facts,
    model_env,
    start_paired_node_host,
)
from bench.sessions_bench import Deployment, machine_cpu_seconds  # noqa: E402
from openclaw_client.client import ClientOptions, GatewayClient  # noqa: E402
from openclaw_client.identity import DeviceIdentity  # noqa: E402
from tests.support.clients import ALL_SCOPES  # noqa: E402
from tests.support.processes import MockOpenAIProcess, NodeHostProcess, start_mock_openai  # noqa: E402

AGENT_ID = "bench"
SESSION_PREFIX = f"agent:{AGENT_ID}:tools"
APPROVER_SCOPES = ["operator.read", "operator.approvals"]
TINY_FILE = "tiny.txt"
TINY_CONTENT = "ok\n"
NO_OP_CALL = {"name": "read", "arguments": {"path": TINY_FILE}}
EXEC_TRUE_CALL = {"name": "exec", "arguments": {"command": "true"}}
# Prints the wall clock (ns) as the command runs; the default policy asks about it (no allowlist entry matches).
STAMP_COMMAND = "date +%s%N"
FINAL = "done"
PLACES = ("local", "node")
PARTS = ("steps", "approvals", "exec")
# Issue 22's goals: what a tool step may add over the model call.
GOALS_MS = {"local": 5.0, "node": 15.0}
WAIT_TIMEOUT_MS = 60_000
REQUEST_TIMEOUT_S = 90.0
DISPATCH_TIMEOUT_S = 300.0
EVENT_TIMEOUT_S = 60.0
STAMP = re.compile(r"\b(\d{18,20})\b")


# --- the model's messages ---------------------------------------------------------------------


def plan_message(call: dict[str, Any] | None, steps: int, final: str = FINAL) -> str:
    """A user message the mock answers with ``steps`` steps of one ``call`` each, then ``final``."""
    plan = {"steps": [{"calls": [call]} for _ in range(steps)], "final": final}
    return "TOOL_PLAN: " + json.dumps(plan, separators=(",", ":"))


# --- the checkout the sessions' worktrees come from -------------------------------------------------


def publish_tiny_checkout(root: Path) -> Path:
    """A git checkout on ``main`` holding the no-op call's file."""
    source = root / "tools"
    source.mkdir(parents=True)
    (source / TINY_FILE).write_text(TINY_CONTENT)
    (source / "README.md").write_text("tool-loop benchmark checkout\n")
    git = [*GIT, "-C", str(source)]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "tiny"], check=True)
    return source


# --- operator side ----------------------------------------------------------------------------


@dataclass
class TurnSample:
    seconds: float
    run_id: str
    # The run's tool events as this connection received them: (seconds since chat.send was called, phase).
    marks: list[tuple[float, str]] = field(default_factory=list)


class Wire:
    """One operator connection that sends turns and notes when each of their tool events arrives."""

    def __init__(self, url: str, token: str, *, scopes: list[str] | None = None):
        options = ClientOptions(
            url=url, token=token, scopes=list(scopes or ALL_SCOPES), identity=DeviceIdentity.generate()
        )
        self.client = GatewayClient(options, on_event=self.on_event)
        self.tool_marks: dict[str, list[tuple[float, str]]] = {}
        # exec.approval.requested by run id: (perf_counter at arrival, payload); set by on_event.
        self.requested: dict[str, tuple[float, dict[str, Any]]] = {}
        self.arrived = asyncio.Event()

    def on_event(self, frame: dict[str, Any]) -> None:
        now = time.perf_counter()
        payload = frame.get("payload") or {}
        event = frame.get("event")
        if event == "agent" and payload.get("stream") == "tool":
            phase = str((payload.get("data") or {}).get("phase"))
            self.tool_marks.setdefault(str(payload.get("runId")), []).append((now, phase))
        elif event == "exec.approval.requested":
            run_id = str((payload.get("request") or {}).get("runId"))
            self.requested[run_id] = (now, payload)
            self.arrived.set()

    async def connect(self) -> Wire:
        await self.client.connect()
        return self

    async def close(self) -> None:
        await self.client.close()

    def drain(self) -> None:
        self.client.drain_events()

    async def request(self, method: str, params: Any = None, *, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        return await self.client.request(method, params, timeout=timeout)

    async def create_session(self, checkout: Path, name: str) -> str:
        created = await self.request(
            "sessions.create",
            {
                "key": f"{SESSION_PREFIX}:{name}",
                "agentId": AGENT_ID,
                "worktree": True,
                "worktreeName": f"bench-tools-{name}",
                "worktreeBaseRef": "main",
                "cwd": str(checkout),
            },
        )
        return str(created["key"])

    async def dispatch(self, key: str, node_id: str) -> None:
        result = await self.request("sessions.dispatch", {"key": key, "deviceId": node_id}, timeout=DISPATCH_TIMEOUT_S)
        if result["placement"]["state"] != "active":
            raise RuntimeError(f"dispatch of {key} ended {result['placement']['state']}: {result['placement']}")

    async def send(self, key: str, message: str, tag: str) -> tuple[float, str]:
        """``chat.send``; (perf_counter when it was called, the run id)."""
        started = time.perf_counter()
        sent = await self.request(
            "chat.send", {"sessionKey": key, "message": message, "idempotencyKey": f"{tag}-{time.time_ns()}"}
        )
        return started, str(sent["runId"])

    async def wait(self, run_id: str) -> dict[str, Any]:
        return await self.request(
            "agent.wait", {"runId": run_id, "timeoutMs": WAIT_TIMEOUT_MS}, timeout=WAIT_TIMEOUT_MS / 1000 + 10
        )

    async def turn(self, key: str, message: str, tag: str, *, expected: str = FINAL) -> TurnSample:
        """``chat.send`` then ``agent.wait`` on its run; seconds from sending to the wait's answer."""
        started, run_id = await self.send(key, message, tag)
        waited = await self.wait(run_id)
        seconds = time.perf_counter() - started
        self.drain()
        if waited.get("status") != "ok" or waited.get("outputText") != expected:
            raise RuntimeError(f"turn {tag} on {key}: {json.dumps(waited)[:400]}")
        marks = [(at - started, phase) for at, phase in self.tool_marks.pop(run_id, [])]
        return TurnSample(seconds, run_id, marks)

    async def last_tool_result(self, key: str) -> dict[str, Any]:
        messages = (await self.request("chat.history", {"sessionKey": key, "limit": 200}))["messages"]
        results = [m for m in messages if m.get("role") == "toolResult"]
        if not results:
            raise RuntimeError(f"no tool result in the transcript of {key}")
        return results[-1]

    async def set_policies(self, node_id: str | None, agent: dict[str, Any]) -> None:
        """The agent's policy in the gateway's document and in the node's."""
        file = {"version": 1, "agents": {AGENT_ID: agent}}
        current = await self.request("exec.approvals.get", {})
        params: dict[str, Any] = {"file": file}
        if current["exists"]:
            params["baseHash"] = current["hash"]
        await self.request("exec.approvals.set", params)
        if node_id is None:
            return
        current = await self.request("exec.approvals.node.get", {"nodeId": node_id})
        params = {"nodeId": node_id, "file": file}
        if current["exists"]:
            params["baseHash"] = current["hash"]
        await self.request("exec.approvals.node.set", params)


def result_text(message: dict[str, Any]) -> str:
    return "".join(part.get("text", "") for part in message.get("content") or [] if isinstance(part, dict))


# --- 1, 2 and 4: tool steps against plain turns --------------------------------------------------------


@dataclass
class Series:
    """One step count of a series: pairs of (N-step turn, plain turn) from the same round, and the N-step
    turns' timelines (from their tool events)."""

    steps: int
    plain: list[float] = field(default_factory=list)
    turn: list[float] = field(default_factory=list)
    per_step: list[float] = field(default_factory=list)
    head: list[float] = field(default_factory=list)  # chat.send → first tool start event
    tool: list[float] = field(default_factory=list)  # tool start → its result event, mean over the turn
    gap: list[float] = field(default_factory=list)  # a result event → the next tool start, mean over the turn
    tail: list[float] = field(default_factory=list)  # last result event → agent.wait answered
    duration_ms: list[float] = field(default_factory=list)  # the exec tool's own durationMs (last step)

    def add(self, plain: TurnSample, turn: TurnSample) -> None:
        self.plain.append(plain.seconds)
        self.turn.append(turn.seconds)
        self.per_step.append((turn.seconds - plain.seconds) / self.steps)
        starts = [at for at, phase in turn.marks if phase == "start"]
        results = [at for at, phase in turn.marks if phase == "result"]
        if len(starts) == len(results) == self.steps:
            self.head.append(starts[0])
            self.tool.append(statistics.fmean(r - s for s, r in zip(starts, results, strict=True)))
            if self.steps > 1:
                self.gap.append(statistics.fmean(s - r for r, s in zip(results, starts[1:], strict=False)))
            self.tail.append(turn.seconds - results[-1])

    def summary(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "steps": self.steps,
            "pairs": len(self.per_step),
            "plain": summarize(self.plain),
            "turn": summarize(self.turn),
            "perStep": summarize(self.per_step),
            "timeline": {
                "eventsSeen": len(self.head),
                "head": summarize(self.head),
                "tool": summarize(self.tool),
                "gap": summarize(self.gap),
                "tail": summarize(self.tail),
            },
        }
        if self.duration_ms:
            result["durationMs"] = duration_summary(self.duration_ms)
        return result


def duration_summary(ms: list[float]) -> dict[str, Any]:
    """n, p50, p99 and max of the exec tool's own ``durationMs`` values (whole milliseconds), and how many took
    50 ms or more (``run_command``'s poll interval: a command that ends between two polls waits for the next)."""
    if not ms:
        return {"n": 0}
    cuts = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {"n": len(ms), "p50": cuts[49], "p99": cuts[98], "max": max(ms), "atLeast50": sum(v >= 50 for v in ms)}


async def run_series(
    wire: Wire,
    key: str,
    *,
    call: dict[str, Any],
    counts: list[int],
    rounds: int,
    warmup: int,
    tag: str,
    read_duration: bool = False,
) -> dict[int, Series]:
    """``warmup`` + ``rounds`` rounds; each round runs, for every N (in an order that turns every round), an N-step
    turn and a plain turn, which goes first on every other round."""
    series = {n: Series(n) for n in counts}
    for round_no in range(warmup + rounds):
        shift = round_no % len(counts)
        for n in counts[shift:] + counts[:shift]:
            pair: dict[str, TurnSample] = {}
            for kind in ("plain", "turn") if round_no % 2 == 0 else ("turn", "plain"):
                steps = n if kind == "turn" else 0
                pair[kind] = await wire.turn(key, plan_message(call, steps), f"{tag}-{n}-{round_no}-{kind}")
                if kind == "turn" and (read_duration or round_no < warmup):
                    result = await wire.last_tool_result(key)
                    if result.get("isError"):
                        raise RuntimeError(f"{call['name']} failed in {tag}: {result_text(result)[:300]}")
                    if read_duration and round_no >= warmup:
                        series[n].duration_ms.append(float(result["details"]["durationMs"]))
            if round_no >= warmup:
                series[n].add(pair["plain"], pair["turn"])
    return series


# --- the model's own time: the recorded requests replayed against the mock ------------------------------


def mock_requests(mock: MockOpenAIProcess) -> list[dict[str, Any]]:
    return mock.requests()


def mock_reset(mock: MockOpenAIProcess) -> None:
    """Forget the recorded requests (``POST /_mock/reset``, the mock's documented control)."""
    root = mock.base_url.removesuffix("/v1")
    request = urllib.request.Request(f"{root}/_mock/reset", data=b"{}", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def request_kind(body: dict[str, Any]) -> tuple[str, int, int] | None:
    """(tool, N, step) of a recorded model request: the plan's tool and step count, and how many steps the
    transcript it carries has taken (0: the turn's first model call). None: not a request of a plan."""
    messages = body.get("messages") or []
    user_at = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), None)
    if user_at is None:
        return None
    text = messages[user_at].get("content")
    if not isinstance(text, str) or not text.startswith("TOOL_PLAN: "):
        return None
    plan = json.loads(text.removeprefix("TOOL_PLAN: "))
    steps = plan["steps"]
    tool = steps[0]["calls"][0]["name"] if steps else ""
    taken = sum(1 for m in messages[user_at + 1 :] if m.get("role") == "assistant" and m.get("tool_calls"))
    return tool, len(steps), taken


def replay(base_url: str, body: dict[str, Any]) -> float:
    """One model request as a client with a new connection sends it: seconds to the end of the streamed answer."""
    target = urlsplit(base_url)
    payload = json.dumps(body).encode()
    started = time.perf_counter()
    connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
    try:
        connection.request(
            "POST",
            f"{target.path}/chat/completions",
            body=payload,
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"mock answered a replayed request with HTTP {response.status}")
    finally:
        connection.close()
    return time.perf_counter() - started


def model_time(mock: MockOpenAIProcess, *, per_kind: int) -> dict[str, Any]:
    """Replay what the mock recorded since its last reset (at most ``per_kind`` requests of each (tool, N, step)),
    then reset it. Per N: the model's time of an N-step turn (the medians of its N + 1 calls added up) minus a plain
    turn's (its one call), per step."""
    by_kind: dict[tuple[str, int, int], list[float]] = {}
    for body in mock_requests(mock):
        kind = request_kind(body)
        if kind is None:
            continue
        samples = by_kind.setdefault(kind, [])
        if len(samples) < per_kind:
            samples.append(replay(mock.base_url, body))
    mock_reset(mock)
    medians = {kind: statistics.median(samples) for kind, samples in by_kind.items()}
    plain = medians.get(("", 0, 0))
    every = [s for samples in by_kind.values() for s in samples]
    result: dict[str, Any] = {"requests": summarize(every), "plainCall": plain * 1000 if plain else None, "perStep": {}}
    for tool, n, _taken in sorted({(t, n, 0) for t, n, _ in medians if n}):
        calls = [medians.get((tool, n, k)) for k in range(n + 1)]
        if plain is None or any(c is None for c in calls):
            continue
        turn = sum(c for c in calls if c is not None)
        result["perStep"][f"{tool}:{n}"] = {
            "turnMs": turn * 1000,
            "perStepMs": (turn - plain) / n * 1000,
            "stepCallMs": statistics.median(medians[(tool, n, k)] for k in range(1, n + 1)) * 1000,
        }
    return result


# --- 3: the approval round trip ------------------------------------------------------------------------


# What each approval round measures (seconds), in the order of the turn:
APPROVAL_FIGURES = (
    "toRequested",  # chat.send → exec.approval.requested received by the approver
    "toResolveSent",  # the event received → exec.approval.resolve sent
    "resolveAnswered",  # resolve sent → its answer
    "toCommand",  # resolve sent → the clock the command printed
    "toRecorded",  # resolve sent → the decision's resolvedAtMs (the gateway's clock, whole ms)
    "recordedToCommand",  # resolvedAtMs → the clock the command printed
    "commandToEnd",  # the clock the command printed → agent.wait answered
    "turn",  # chat.send → agent.wait answered, the decision included
)


async def approval_round(wire: Wire, approver: Wire, key: str, tag: str) -> dict[str, Any]:
    """One turn whose exec asks; the approver decides ``allow-once`` as soon as the question arrives."""
    started, run_id = await wire.send(
        key, plan_message({"name": "exec", "arguments": {"command": STAMP_COMMAND}}, 1), tag
    )
    waiting = asyncio.ensure_future(wire.wait(run_id))
    try:
        async with asyncio.timeout(EVENT_TIMEOUT_S):
            while run_id not in approver.requested:
                approver.arrived.clear()  # on_event runs on this loop: nothing arrives between the check and here
                await approver.arrived.wait()
        arrived, payload = approver.requested.pop(run_id)
        sent_ns, sent = time.time_ns(), time.perf_counter()
        await approver.request("exec.approval.resolve", {"id": payload["id"], "decision": "allow-once"})
        answered = time.perf_counter()
        waited = await waiting
    finally:
        if not waiting.done():
            waiting.cancel()
    ended = time.perf_counter()
    wire.drain()
    approver.drain()
    wire.tool_marks.pop(run_id, None)
    wire.requested.clear()  # the sender holds operator.approvals too
    if waited.get("status") != "ok":
        raise RuntimeError(f"approval turn {tag}: {json.dumps(waited)[:400]}")
    result = await wire.last_tool_result(key)
    found = STAMP.search(result_text(result))
    if result.get("isError") or found is None:
        raise RuntimeError(f"the stamped command of {tag} did not run: {json.dumps(result)[:400]}")
    command_s = (int(found.group(1)) - sent_ns) / 1e9
    return {
        "approvalId": payload["id"],
        "sentNs": sent_ns,
        "stampNs": int(found.group(1)),
        "durationMs": float(result["details"]["durationMs"]),
        "toRequested": arrived - started,
        "toResolveSent": sent - arrived,
        "resolveAnswered": answered - sent,
        "toCommand": command_s,
        "commandToEnd": ended - (sent + command_s),
        "turn": ended - started,
    }


async def resolved_at_ms(client: Wire, ids: set[str]) -> dict[str, int]:
    """``resolvedAtMs`` of these approvals, from ``approval.history`` (newest first, paged)."""
    found: dict[str, int] = {}
    cursor = None
    while ids - found.keys():
        params: dict[str, Any] = {"limit": 100, **({"cursor": cursor} if cursor else {})}
        page = await client.request("approval.history", params)
        found.update({item["id"]: int(item["resolvedAtMs"]) for item in page["items"] if item["id"] in ids})
        cursor = page.get("nextCursor")
        if not cursor:
            break
    return found


async def run_approvals(wire: Wire, approver: Wire, key: str, *, count: int, warmup: int, tag: str) -> dict:
    rounds = []
    for n in range(warmup + count):
        measured = await approval_round(wire, approver, key, f"{tag}-{n}")
        if n >= warmup:
            rounds.append(measured)
    recorded = await resolved_at_ms(approver, {r["approvalId"] for r in rounds})
    for r in rounds:
        at_ms = recorded.get(r["approvalId"])
        if at_ms is not None:
            r["toRecorded"] = (at_ms - r["sentNs"] / 1e6) / 1000
            r["recordedToCommand"] = (r["stampNs"] / 1e6 - at_ms) / 1000
    return {
        "n": len(rounds),
        "commandDurationMs": duration_summary([r["durationMs"] for r in rounds]),
        **{name: summarize([r[name] for r in rounds if name in r]) for name in APPROVAL_FIGURES},
    }


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Rig:
    deployment: Deployment
    mock: MockOpenAIProcess
    node_host: NodeHostProcess | None  # None: no node part (``--places local``)
    node_id: str | None
    checkout: Path


def with_model_time(series: dict[int, Series], model: dict[str, Any], tool: str, place: str) -> dict[str, Any]:
    """Each N's summary with the model's extra time per step and what is left over it, against the goal."""
    out: dict[str, Any] = {}
    for n, measured in series.items():
        summary = measured.summary()
        step_model = (model["perStep"].get(f"{tool}:{n}") or {}).get("perStepMs")
        p50 = summary["perStep"].get("p50")
        over = p50 - step_model if p50 is not None and step_model is not None else None
        summary["modelPerStepMs"] = step_model
        summary["overModelP50Ms"] = over
        summary["goalMs"] = GOALS_MS[place]
        summary["goalMet"] = over is not None and over <= GOALS_MS[place]
        out[str(n)] = summary
    return out


async def measure(rig: Rig, args: argparse.Namespace) -> dict[str, Any]:
    deployment = rig.deployment
    wire = await Wire(deployment.url, deployment.token).connect()
    approver = await Wire(deployment.url, deployment.token, scopes=APPROVER_SCOPES).connect()
    try:
        keys = {"local": await wire.create_session(rig.checkout, "local")}
        if rig.node_id is not None:
            keys["node"] = await wire.create_session(rig.checkout, "node")
            progress("dispatching the node session to the node")
            await wire.dispatch(keys["node"], rig.node_id)
        result: dict[str, Any] = {"steps": {}, "approvals": {}, "exec": {}, "model": {}}
        mock_reset(rig.mock)
        for place in args.places if "steps" in args.parts else ():
            progress(
                f"{place}: {args.warmup} + {args.turns} rounds of read-step turns (N = "
                f"{', '.join(map(str, args.steps))}) against plain turns"
            )
            series = await run_series(
                wire, keys[place], call=NO_OP_CALL, counts=args.steps, rounds=args.turns, warmup=args.warmup, tag=place
            )
            progress(f"{place}: replaying the model requests against the mock")
            model = await asyncio.to_thread(model_time, rig.mock, per_kind=args.replays)
            result["model"][f"{place}:read"] = model
            result["steps"][place] = with_model_time(series, model, "read", place)
        for place in args.places if "approvals" in args.parts else ():
            progress(f"{place}: {args.warmup} + {args.approvals} exec approvals (default policy: ask), allow-once")
            result["approvals"][place] = await run_approvals(
                wire, approver, keys[place], count=args.approvals, warmup=args.warmup, tag=f"{place}-ask"
            )
        mock_reset(rig.mock)
        if "exec" in args.parts:
            progress("exec policy full/off for the agent, on the gateway and on the node")
            await wire.set_policies(rig.node_id, {"security": "full", "ask": "off"})
        for place in args.places if "exec" in args.parts else ():
            progress(f"{place}: {args.warmup} + {args.turns} rounds of exec-true turns against plain turns")
            series = await run_series(
                wire,
                keys[place],
                call=EXEC_TRUE_CALL,
                counts=[1],
                rounds=args.turns,
                warmup=args.warmup,
                tag=f"{place}-true",
                read_duration=True,
            )
            model = await asyncio.to_thread(model_time, rig.mock, per_kind=args.replays)
            result["model"][f"{place}:exec"] = model
            result["exec"][place] = with_model_time(series, model, "exec", place)["1"]
        return result
    finally:
        await approver.close()
        await wire.close()


def _guarded(action: Callable[[], object], what: str) -> None:
    """Cleanup that must not stop the rest of the cleanup: failures become warnings."""
    try:
        action()
    except Exception as exc:
        print(f"warning: {what} failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def _stop_node_host(node_host: NodeHostProcess, *, failed: bool) -> None:
    _guarded(node_host.stop, "stopping the node host")
    if failed:
        tail = node_host.log().splitlines()[-30:]
        print("--- last lines of the node host log ---", *tail, sep="\n", file=sys.stderr)


def _remove_scratch(scratch: Path, keep: bool) -> None:
    if keep:
        progress(f"checkout and node host state kept in {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)


def run(args: argparse.Namespace, cleanups: contextlib.ExitStack) -> dict[str, Any]:
    report: dict[str, Any] = {"command": args.command}
    scratch = Path(tempfile.mkdtemp(prefix="openclaw-bench-tools-"))
    cleanups.callback(lambda: _remove_scratch(scratch, args.keep_state))
    workspaces = scratch / "workspaces"
    workspaces.mkdir()
    progress("starting the mock OpenAI server")
    mock = start_mock_openai()
    cleanups.callback(lambda: _guarded(mock.stop, "stopping the mock OpenAI server"))
    # Every turn's model context is its own messages only (its user message, then its steps), however long the
    # session's transcript has grown: turns of every round compare alike. (Not sessions.reset between turns: a reset
    # of a session placed on a node gets the placement failed by the next recovery sweep; see bench/README.md.)
    extra_env = {**model_env(mock.base_url, workspaces), "OPENCLAW_MODEL_CONTEXT_MESSAGES": str(args.context_messages)}
    report["contextMessages"] = args.context_messages
    deployment = Deployment(args, name="gateway", suffix="_tools", extra_env=extra_env, bootstrap=True)
    cleanups.callback(lambda: deployment.close(failed=not report.get("complete")))
    deployment.start()
    node_host: NodeHostProcess | None = None
    node_id: str | None = None
    if "node" in args.places:
        progress("starting the node host and approving its pairing")
        node_host, node_id = start_paired_node_host(deployment, scratch)
        cleanups.callback(lambda: _stop_node_host(node_host, failed=not report.get("complete")))
    checkout = publish_tiny_checkout(workspaces)
    facts = asyncio.run(gateway_facts(deployment.url, deployment.token))
    report["loadBefore"] = os.getloadavg()[0]
    busy, total = machine_cpu_seconds()
    report.update(asyncio.run(measure(Rig(deployment, mock, node_host, node_id, checkout), args)))
    busy_after, total_after = machine_cpu_seconds()
    report["loadAfter"] = os.getloadavg()[0]
    report["machineBusyPercent"] = 100 * (busy_after - busy) / (total_after - total) if total_after > total else 0.0
    report["memory"] = deployment.memory()
    if node_host is not None:
        report["nodeHostTracebacks"] = node_host.log().count("Traceback")
        _stop_node_host(node_host, failed=False)
    deployment.stop()
    report["logs"] = deployment.logs
    report["environment"] = {
        **base_environment(
            announced=deployment.announced,
            facts=facts,
            postgres=deployment.postgres,
            redis_prefix=deployment.redis_prefix,
            redis_url=args.redis_url,
        ),
        "gatewayPid": deployment.gateway_pid,
        "workerPid": deployment.worker_pid,
        "taskMode": "celery" if args.redis_url else "inprocess",
        "mockUrl": mock.base_url,
    }
    report["scratch"] = {
        "stateDir": deployment.launch.state_dir if deployment.launch else None,
        "scratchDir": str(scratch),
        "pids": [
            pid
            for pid in (deployment.gateway_pid, deployment.worker_pid, node_host and node_host.process.pid, mock.pid)
            if pid
        ],
    }
    report["complete"] = True
    return report


# --- output -----------------------------------------------------------------------------------


def _ms(value: float | None, width: int = 9) -> str:
    return f"{fmt_ms(value).strip():>{width}}"


def _pair(stats: dict[str, Any], width: int = 16) -> str:
    return f"{fmt_ms(stats.get('p50')).strip()} / {fmt_ms(stats.get('p99')).strip():<6}".rjust(width)


def _durations(d: dict[str, Any]) -> str:
    if not d.get("n"):
        return "-"
    return f"{d['p50']:.0f} / {d['p99']:.0f} / {d['max']:.0f} ({d['atLeast50']}/{d['n']} ≥ 50)"


def _met(summary: dict[str, Any]) -> str:
    if summary.get("overModelP50Ms") is None:
        return "-"
    return "met" if summary["goalMet"] else "MISSED"


STEP_HEADER = (
    f"{'place':<7}{'N':>4}{'pairs':>6}{'plain p50':>10}{'turn p50':>10}{'step p50 / p99':>17}"
    f"{'model/step':>11}{'over model':>11}{'goal':>7}  met"
)


def _step_row(place: str, label: str, s: dict[str, Any]) -> str:
    return (
        f"{place:<7}{label:>4}{s['pairs']:>6}{_ms(s['plain'].get('p50'), 10)}{_ms(s['turn'].get('p50'), 10)}"
        f"{_pair(s['perStep'], 17)}{_ms(s['modelPerStepMs'], 11)}{_ms(s['overModelP50Ms'], 11)}"
        f"{'≤' + format(s['goalMs'], 'g'):>7}  {_met(s)}"
    )


def render(report: dict[str, Any], args: argparse.Namespace) -> str:
    env = report["environment"]
    task_mode = (
        "celery (turns and dispatch stages in a Celery worker)"
        if env["taskMode"] == "celery"
        else "in-process (turns run in worker threads of the gateway)"
    )
    lines = [
        "OpenClaw tool-loop benchmark (issue 22)",
        *environment_lines(env),
        f"  task mode      {task_mode}",
        "  node host      "
        + (
            f"python -m openclaw_client.node, capacity {NODE_CAPACITY}, capacity wait {NODE_CAPACITY_WAIT_MS} ms, "
            "same machine"
            if "nodeHostTracebacks" in report
            else "none (--places local)"
        ),
        f"  model          tests/support/mock_openai.py at {env['mockUrl']} (TOOL_PLAN, answers at once)",
        f"  command        {report['command']}",
        f"  machine load   1-min load average {report['loadBefore']:.2f} before, {report['loadAfter']:.2f} after; "
        f"all cores {report['machineBusyPercent']:.0f} % busy during the measurements",
        "  every figure below: chat.send → agent.wait on one operator connection; the model is sent "
        f"the newest {report['contextMessages']} transcript message(s) (OPENCLAW_MODEL_CONTEXT_MESSAGES)",
    ]
    steps = report.get("steps") or {}
    if steps:
        lines += [
            "",
            f"1-2. tool step overhead: N steps of one `read {TINY_FILE}` call ({len(TINY_CONTENT)} bytes) against a "
            f"plain turn of the same round (ms)",
            "     step = (N-step turn − plain turn) / N per pair; model/step = the mock's extra time per step (its",
            "     recorded requests replayed, new connection each); over model = step p50 − model/step; goal on it",
            STEP_HEADER,
        ]
        for place, by_n in steps.items():
            lines += [_step_row(place, n, s) for n, s in by_n.items()]
        lines += [
            "",
            "     where a step's time goes, from the tool events as they reach the operator (p50 over turns of each "
            "turn's mean, ms)",
            f"{'place':<7}{'N':>4}{'send→1st start':>16}{'start→result':>14}{'result→next':>13}{'last→end':>10}"
            f"{'model call':>12}",
        ]
        for place, by_n in steps.items():
            model = (report.get("model") or {}).get(f"{place}:read") or {}
            for n, s in by_n.items():
                t = s["timeline"]
                call = ((model.get("perStep") or {}).get(f"read:{n}") or {}).get("stepCallMs")
                lines.append(
                    f"{place:<7}{n:>4}{_ms(t['head'].get('p50'), 16)}{_ms(t['tool'].get('p50'), 14)}"
                    f"{_ms(t['gap'].get('p50'), 13)}{_ms(t['tail'].get('p50'), 10)}{_ms(call, 12)}"
                )
        lines.append(
            "     start→result: the tool runs and its result is recorded; result→next: the next model call and the "
            "assistant message recorded; model call: a replayed step request's median"
        )
    approvals = report.get("approvals") or {}
    if approvals:
        lines += [
            "",
            f"3. approval round trip: `exec {STAMP_COMMAND}` asked by the default policy, resolved allow-once by a "
            "second connection (operator.approvals) as soon as exec.approval.requested arrives (ms, p50 / p99)",
            f"{'place':<7}{'n':>4}{'send→requested':>17}{'event→resolve':>17}{'resolve rt':>17}"
            f"{'resolve→cmd start':>19}{'cmd→turn end':>17}{'whole turn':>17}{'cmd durationMs p50/p99/max':>36}",
        ]
        for place, a in approvals.items():
            lines.append(
                f"{place:<7}{a['n']:>4}{_pair(a['toRequested'], 17)}{_pair(a['toResolveSent'], 17)}"
                f"{_pair(a['resolveAnswered'], 17)}{_pair(a['toCommand'], 19)}{_pair(a['commandToEnd'], 17)}"
                f"{_pair(a['turn'], 17)}{_durations(a['commandDurationMs']):>36}"
            )
        lines.append(
            "     resolve→cmd start: from just before exec.approval.resolve is sent to the clock the command printed "
            "(same host; starting sh and date included), of which"
        )
        for place, a in approvals.items():
            lines.append(
                f"       {place}: resolve sent → decision recorded (resolvedAtMs, whole ms) p50 "
                f"{fmt_ms(a['toRecorded'].get('p50')).strip()}, recorded → command's clock p50 "
                f"{fmt_ms(a['recordedToCommand'].get('p50')).strip()} / p99 "
                f"{fmt_ms(a['recordedToCommand'].get('p99')).strip()}"
            )
    executed = report.get("exec") or {}
    if executed:
        lines += [
            "",
            "4. `exec true`, policy full/off for the agent and on the node: one exec step against a plain turn (ms)",
            STEP_HEADER + f"{'durationMs p50 / p99 / max':>35}",
        ]
        for place, s in executed.items():
            lines.append(_step_row(place, "1", s) + f"{_durations(s.get('durationMs') or {}):>37}")
        for place, s in executed.items():
            t = s["timeline"]
            lines.append(
                f"     {place}: tool start→result event p50 {fmt_ms(t['tool'].get('p50')).strip()} ms (the policy "
                "decision, the command, its result recorded)"
            )
    memory, logs = report.get("memory") or {}, report.get("logs") or {}
    if memory:
        lines += [
            "",
            f"gateway RSS {memory['gatewayRssMiB']:.1f} MiB (idle {memory['gatewayIdleRssMiB']:.1f})"
            + (f", worker {memory['workerRssMiB']:.1f} MiB" if memory.get("workerRssMiB") else "")
            + f"; node host Tracebacks: {report.get('nodeHostTracebacks', '-')}",
            f"gateway stop: exit code {logs.get('gatewayExitCode')}, {logs.get('gatewayErrorRecords', 0)} ERROR records"
            + (
                f"; worker exit code {logs.get('workerExitCode')}, {logs.get('workerErrorRecords', 0)} ERROR records"
                if logs.get("workerStopped")
                else ""
            ),
        ]
        for key in ("gatewayErrorsByMessage", "workerErrorsByMessage"):
            lines += [f"  {count:>5} x {message}" for message, count in list(logs.get(key, {}).items())[:10]]
    return "\n".join(lines)


def _command(argv: list[str]) -> str:
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):
        python = python.relative_to(ROOT)
    return shlex.join([str(python), "bench/agent_tools.py", *argv])


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of step counts: {text!r}") from None
    if not counts or any(n < 1 or n > 23 for n in counts):
        raise argparse.ArgumentTypeError("step counts must be 1 to 23 (the default step limit is 24 model calls)")
    return counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--database-url", help="PostgreSQL server to use (a scratch database is created and dropped)")
    parser.add_argument("--redis-url", help="Redis for the channel layer, cache and Celery (a scratch key prefix)")
    parser.add_argument(
        "--turns", type=int, default=40, help="measured rounds per N (each: an N-step and a plain turn)"
    )
    parser.add_argument("--steps", type=_counts, default=[1, 4, 16], help="the N of the no-op series (1,4,16)")
    parser.add_argument("--approvals", type=int, default=40, help="measured approval round trips per place")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured rounds before each series")
    parser.add_argument(
        "--context-messages",
        type=int,
        default=1,
        help="the gateway's OPENCLAW_MODEL_CONTEXT_MESSAGES (1: each turn's own messages only)",
    )
    parser.add_argument("--replays", type=int, default=40, help="model requests replayed per kind and step")
    parser.add_argument("--places", type=_names, default=list(PLACES), help="local,node (both)")
    parser.add_argument(
        "--parts", type=_names, default=list(PARTS), help="which figures: steps (1-2), approvals (3), exec (4)"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--keep-state", action="store_true", help="keep the state dir, logs, checkout and node state")
    args = parser.parse_args(argv)
    for name in ("turns", "approvals", "replays", "context_messages"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    if not args.places or any(place not in PLACES for place in args.places):
        parser.error("--places takes local, node or both")
    if not args.parts or any(part not in PARTS for part in args.parts):
        parser.error("--parts takes steps, approvals, exec (comma-separated)")
    args.command = _command(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
