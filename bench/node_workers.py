"""Node worker benchmark: turn round trip on a paired node vs locally, dispatch time, and idle node connections.

Starts gateways like ``bench/sessions_bench.py`` (embedded profile by default; PostgreSQL and Redis when their URLs
are given, then with a Celery worker that runs the turns and dispatch stages), the project's mock OpenAI server as
the model and the project's node host (``python -m openclaw_client.node``) as a paired worker host, and measures:

1. ``chat.send``→``agent.wait`` on a local session and on a session placed on the node (warm worker child), plus
   the first node turn after the node host (re)started (no idle worker child yet);
2. ``sessions.dispatch`` until ``active`` for worktrees of 10 and 1,000 files;
3. on a second gateway with a 1 s tick: the gateway's memory and tick CPU with 1,000 idle node connections (made
   from separate client processes, paired in bulk, each declaring a worker host).

With ``--node-host openclaw`` or ``both`` (the default), parts 1 and 2 also run with OpenClaw's own node host
(``openclaw node run`` from the workplace's ``openclaw-cli`` tool, ``tests/support/openclaw_node_process.py``), one
host after the other on the same gateway and mock model, reported side by side (each host's first dispatch too);
that part is skipped with a message when the tool's package is not installed.

See ``bench/README.md`` for what each figure means.

    .venv/bin/python bench/node_workers.py
    .venv/bin/python bench/node_workers.py --node-host both --turns 20 --dispatch-samples 2 --skip-idle-nodes
    .venv/bin/python bench/node_workers.py --database-url postgres://postgres@127.0.0.1:5432/postgres \\
        --redis-url redis://127.0.0.1:6379/0 --json node-workers.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import multiprocessing
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402  (the repository root must be importable first)
    base_environment,
    connected_client,
    environment_lines,
    latency_header,
    latency_row,
    process_cpu_seconds,
    progress,
    rss_mib,
    run_benchmark,
    summarize,
)
from bench.sessions_bench import Deployment  # noqa: E402
from openclaw_client.client import (  # noqa: E402
    ClientOptions,
    ConnectError,
    GatewayClient,
    GatewayError,
    NodeCommandError,
)
from openclaw_client.identity import DeviceIdentity  # noqa: E402
from openclaw_client.node import (  # noqa: E402
    NODE_HOST_CAPS,
    NODE_HOST_COMMANDS,
    RETAIN_COMMAND,
    STATUS_COMMAND,
    WORKER_SUPERVISOR_FEATURE,
)
from tests.support.openclaw_node_process import OpenClawNodeProcess, openclaw_node_missing  # noqa: E402
from tests.support.processes import NodeHostProcess, start_mock_openai, start_node_host  # noqa: E402

NODE_HOSTS = ("project", "openclaw")
NODE_HOST_NAMES = {"project": "the project's node host", "openclaw": "OpenClaw's node host"}
AGENT_ID = "bench"
SESSION_PREFIX = f"agent:{AGENT_ID}:node-workers"
NODE_CAPACITY = 2
NODE_CAPACITY_WAIT_MS = 750
TURN_WARMUP = 10
WAIT_TIMEOUT_MS = 30_000
REQUEST_TIMEOUT_S = 60.0
DISPATCH_TIMEOUT_S = 300.0
WAIT_S = 60.0
FILE_BYTES = 1024
FILES_PER_DIRECTORY = 100
DISPATCH_SIZES = (10, 1000)
RETAIN_SETTLE_S = 0.5  # after the node host answered the gateway's retain (sent on every connect)
FLEET_JOIN_TIMEOUT_S = 3600.0
RECONNECT_DELAY_S = 1.0  # the node host's first reconnect backoff
FLEET_SETTLE_S = 3.0
SETTLE_SAMPLE_S = 2.0
SETTLE_QUIET_SHARE = 0.2  # of one core
SETTLE_BUSY_SHARE = 0.8
SETTLE_MAX_S = 180.0
FLEET_DRAIN_INTERVAL_S = 0.5
FAILURE_SAMPLES = 20
IDLE_WARMUP_NODES = 10  # paired, connected and closed before the baseline: one-time costs are not per connection
GIT = ["git", "-c", "user.email=bench@example.com", "-c", "user.name=bench", "-c", "commit.gpgsign=false"]


# --- workspaces: git checkouts committed on main --------------------------------------------------


def file_content(salt: str, index: int) -> bytes:
    """About 1 KiB that no other file of any checkout of this run has (the node stores blobs by digest)."""
    header = f"{salt} file {index}\n".encode()
    digest = hashlib.sha256(header).hexdigest().encode()
    body = (digest + b"\n") * (FILE_BYTES // (len(digest) + 1) + 1)
    return header + body[: FILE_BYTES - len(header)]


def publish_checkout(root: Path, name: str, files: int) -> Path:
    """A git checkout of ``files`` files (100 per directory) committed on ``main``: a worktree's source."""
    source = root / name
    for index in range(files):
        path = source / f"dir{index // FILES_PER_DIRECTORY:03d}" / f"file{index:05d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(file_content(name, index))
    git = [*GIT, "-C", str(source)]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", f"{files} files"], check=True)
    return source


# --- operator side ----------------------------------------------------------------------------


class Operator:
    """One admin connection: sessions, dispatches and turns, as the e2e tests drive them."""

    def __init__(self, client: GatewayClient):
        self.client = client
        self._names = 0

    async def create_session(self, checkout: Path, suffix: str) -> str:
        self._names += 1
        key = f"{SESSION_PREFIX}:{suffix}"
        await self.client.request(
            "sessions.create",
            {
                "key": key,
                "agentId": AGENT_ID,
                "worktree": True,
                "worktreeName": f"bench-{suffix}-{self._names}",
                "worktreeBaseRef": "main",
                "cwd": str(checkout),
            },
            timeout=REQUEST_TIMEOUT_S,
        )
        return key

    async def timed_dispatch(self, key: str, node_id: str) -> float:
        """Seconds of ``sessions.dispatch`` (it answers once the placement is active, or fails)."""
        started = time.perf_counter()
        result = await self.client.request(
            "sessions.dispatch", {"key": key, "deviceId": node_id}, timeout=DISPATCH_TIMEOUT_S
        )
        seconds = time.perf_counter() - started
        state = result["placement"]["state"]
        if state != "active":
            raise RuntimeError(f"dispatch of {key} ended {state}: {result['placement']}")
        return seconds

    async def timed_turn(self, key: str, marker: str) -> float:
        """``chat.send`` then ``agent.wait`` on its run; seconds from sending to the wait's answer.

        The mock model answers "Reply exactly: X" with X; any other outcome fails the run."""
        started = time.perf_counter()
        sent = await self.client.request(
            "chat.send",
            {"sessionKey": key, "message": f"Reply exactly: {marker}", "idempotencyKey": f"{marker}-{time.time_ns()}"},
            timeout=REQUEST_TIMEOUT_S,
        )
        waited = await self.client.request(
            "agent.wait", {"runId": sent["runId"], "timeoutMs": WAIT_TIMEOUT_MS}, timeout=REQUEST_TIMEOUT_S
        )
        seconds = time.perf_counter() - started
        self.drain_events()
        if waited.get("status") != "ok" or waited.get("outputText") != marker:
            raise RuntimeError(f"turn {marker} on {key}: {json.dumps(waited)[:300]}")
        return seconds

    async def node_row(self, node_id: str) -> dict[str, Any] | None:
        nodes = (await self.client.request("node.list", {}))["nodes"]
        return next((row for row in nodes if row["nodeId"] == node_id), None)

    async def wait_hosting(self, node_id: str) -> None:
        """Until the node is connected and has declared its worker host."""
        deadline = time.monotonic() + WAIT_S
        while True:
            row = await self.node_row(node_id)
            if row is not None and row.get("connected") is True and row.get("sessionHost") is True:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"node {node_id} is not hosting workers: {row}")
            await asyncio.sleep(0.05)

    def drain_events(self) -> None:
        """The chat/agent events of the turns this connection sent are not needed; keep the queue empty."""
        while not self.client.events.empty():
            self.client.events.get_nowait()


async def with_operator[T](url: str, token: str, work: Callable[[Operator], Awaitable[T]]) -> T:
    client = await connected_client(url, token)
    try:
        return await work(Operator(client))
    finally:
        await client.close()


async def gateway_facts(url: str, token: str) -> dict[str, Any]:
    client = await connected_client(url, token)
    try:
        hello = client.hello or {}
        health = await client.request("health")
        return {
            "gatewayVersion": (hello.get("server") or {}).get("version"),
            "protocol": hello.get("protocol"),
            "databaseVendor": (health.get("database") or {}).get("vendor"),
        }
    finally:
        await client.close()


# --- part 1 and 2: a node host, turns and dispatches -------------------------------------------------


@dataclass
class NodeRig:
    """The node gateway's bench furniture: the node host, its id and the published checkouts."""

    deployment: Deployment
    scratch: Path
    node_host: NodeHostProcess | OpenClawNodeProcess
    node_id: str
    kind: str  # one of NODE_HOSTS: names its checkouts and sessions apart from the other host's

    @property
    def url(self) -> str:
        return self.deployment.url

    @property
    def token(self) -> str:
        return self.deployment.token

    @property
    def checkouts(self) -> Path:
        return self.scratch / "workspaces"

    def operate[T](self, work: Callable[[Operator], Awaitable[T]]) -> T:
        return asyncio.run(with_operator(self.url, self.token, work))


def node_id_of(node_host: NodeHostProcess) -> str:
    identity = json.loads((Path(node_host.state_dir) / "identity" / "device.json").read_text())
    return str(identity["deviceId"])


def start_paired_node_host(deployment: Deployment, scratch: Path) -> tuple[NodeHostProcess, str]:
    """The project's node host, started and approved like an operator would (``node.pair.approve``)."""
    assert deployment.gateway is not None
    (scratch / "node-host").mkdir()
    node_host = start_node_host(
        deployment.gateway,
        capacity=NODE_CAPACITY,
        capacity_wait_ms=NODE_CAPACITY_WAIT_MS,
        state_dir=str(scratch / "node-host"),
    )
    request_id = node_host.pairing_request(timeout=WAIT_S)

    async def approve(operator: Operator) -> None:
        await operator.client.request("node.pair.approve", {"requestId": request_id})

    asyncio.run(with_operator(deployment.url, deployment.token, approve))
    node_host.wait_connects(1, timeout=WAIT_S)
    node_id = node_id_of(node_host)

    async def hosting(operator: Operator) -> None:
        await operator.wait_hosting(node_id)

    asyncio.run(with_operator(deployment.url, deployment.token, hosting))
    return node_host, node_id


def start_paired_openclaw_node_host(
    deployment: Deployment, cleanups: contextlib.ExitStack, *, failed: Callable[[], bool]
) -> tuple[OpenClawNodeProcess, str]:
    """OpenClaw's node host (``tests/support/openclaw_node_process.py``) with the project host's capacity, its
    pairing request approved over ``node.pair.list``/``node.pair.approve``; stopped and its HOME removed by
    ``cleanups``."""
    assert deployment.gateway is not None
    node_host = OpenClawNodeProcess.start(deployment.gateway, capacity=NODE_CAPACITY)
    cleanups.callback(lambda: _stop_openclaw_node_host(node_host, failed=failed()))

    async def approve(operator: Operator) -> str:
        deadline = time.monotonic() + WAIT_S
        while True:
            pending = (await operator.client.request("node.pair.list", {}))["pending"]
            if pending:
                break
            if time.monotonic() >= deadline:
                raise RuntimeError(f"OpenClaw's node host asked for no pairing:\n{node_host.log()[-3000:]}")
            await asyncio.sleep(0.1)
        request = pending[0]
        await operator.client.request("node.pair.approve", {"requestId": request["requestId"]})
        await operator.wait_hosting(request["nodeId"])
        return str(request["nodeId"])

    node_host.node_id = asyncio.run(with_operator(deployment.url, deployment.token, approve))
    return node_host, node_host.node_id


def run_turns(rig: NodeRig, turns: int) -> dict[str, Any]:
    """Warm-up, then ``turns`` pairs of turns, local and node interleaved (both transcripts grow alike)."""
    checkout = publish_checkout(rig.checkouts, f"{rig.kind}-turns", 10)

    async def work(operator: Operator) -> dict[str, Any]:
        local_key = await operator.create_session(checkout, f"{rig.kind}-local")
        node_key = await operator.create_session(checkout, f"{rig.kind}-node")
        first_dispatch = await operator.timed_dispatch(node_key, rig.node_id)
        for n in range(TURN_WARMUP):
            await operator.timed_turn(local_key, f"WARM-LOCAL-{n}")
            await operator.timed_turn(node_key, f"WARM-NODE-{n}")
        local, node = [], []
        for n in range(turns):
            local.append(await operator.timed_turn(local_key, f"LOCAL-{n}"))
            node.append(await operator.timed_turn(node_key, f"NODE-{n}"))
        return {"nodeKey": node_key, "firstDispatchS": first_dispatch, "localS": local, "nodeS": node}

    progress(
        f"{NODE_HOST_NAMES[rig.kind]}: first dispatch, then {turns} local and {turns} node turns, interleaved, "
        f"after {TURN_WARMUP} warm-up turns each"
    )
    measured: dict[str, Any] = rig.operate(work)
    return measured


def restart_node_host(rig: NodeRig) -> None:
    """Stop the node host (its idle worker children stop with it), start it again, and wait until it is connected,
    hosting, and has answered the retain the gateway sends after every connect (so that is not in the turn)."""
    assert isinstance(rig.node_host, NodeHostProcess)  # the project's: its log counts connects and invokes
    connects, retains = rig.node_host.connects(), rig.node_host.invokes(RETAIN_COMMAND)
    rig.node_host.stop()
    rig.node_host.start_again()
    rig.node_host.wait_connects(connects + 1, timeout=WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while rig.node_host.invokes(RETAIN_COMMAND) <= retains:
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the node host got no retain after reconnecting:\n{rig.node_host.log()[-3000:]}")
        time.sleep(0.05)
    time.sleep(RETAIN_SETTLE_S)

    async def hosting(operator: Operator) -> None:
        await operator.wait_hosting(rig.node_id)

    rig.operate(hosting)


def run_cold_starts(rig: NodeRig, node_key: str, samples: int) -> dict[str, list[float]]:
    """The first turn after each node host restart (a worker child is spawned), and the turn right after it."""
    cold, warm = [], []
    for sample in range(samples):
        progress(f"cold start {sample + 1}/{samples}: restarting the node host")
        restart_node_host(rig)

        async def work(operator: Operator, sample: int = sample) -> tuple[float, float]:
            first = await operator.timed_turn(node_key, f"COLD-{sample}")
            second = await operator.timed_turn(node_key, f"AFTER-COLD-{sample}")
            return first, second

        first, second = rig.operate(work)
        cold.append(first)
        warm.append(second)
    return {"coldS": cold, "nextS": warm}


def run_dispatches(rig: NodeRig, samples: int, *, warm_up: bool) -> dict[str, Any]:
    """Per size: ``samples`` dispatches of worktrees whose content the node has never seen (each sample its own
    checkout), and as many of a second worktree of the same checkout (the node's blob store already has it)."""
    checkouts = {
        size: [publish_checkout(rig.checkouts, f"{rig.kind}-d{size}-{i}", size) for i in range(samples)]
        for size in DISPATCH_SIZES
    }
    warm_up_checkout = publish_checkout(rig.checkouts, f"{rig.kind}-dispatch-warmup", 10) if warm_up else None

    async def work(operator: Operator) -> dict[str, Any]:
        result: dict[str, Any] = {}
        if warm_up_checkout is not None:  # the node's first dispatch installs the worker bundle
            key = await operator.create_session(warm_up_checkout, f"{rig.kind}-dispatch-warmup")
            result["firstDispatchS"] = await operator.timed_dispatch(key, rig.node_id)
        for size, sources in checkouts.items():
            new: list[float] = []
            known: list[float] = []
            failures: list[str] = []
            for i, checkout in enumerate(sources):
                for samples_of_kind, what in ((new, "new"), (known, "again")):
                    key = await operator.create_session(checkout, f"{rig.kind}-d{size}-{i}-{what}")
                    try:
                        samples_of_kind.append(await operator.timed_dispatch(key, rig.node_id))
                    except (GatewayError, RuntimeError) as exc:  # counted and reported; the series goes on
                        failures.append(f"{what}: {exc}")
            result[str(size)] = {"newContentS": new, "knownContentS": known, "failures": failures}
        return result

    progress(
        f"{NODE_HOST_NAMES[rig.kind]}: {samples} dispatches each of {', '.join(map(str, DISPATCH_SIZES))}-file "
        "worktrees (new and known content)"
    )
    measured: dict[str, Any] = rig.operate(work)
    return measured


def model_env(mock_base_url: str, roots: Path) -> dict[str, str]:
    return {
        "OPENCLAW_MODEL_BASE_URL": mock_base_url,
        "OPENCLAW_MODEL_API_KEY": "sk-bench",
        "OPENCLAW_MODEL": "mock-model",
        "OPENCLAW_MODEL_READ_TIMEOUT_S": "60",
        "OPENCLAW_WORKSPACE_ROOTS": str(roots),
    }


def run_node_gateway(args: argparse.Namespace, cleanups: contextlib.ExitStack, report: dict[str, Any]) -> None:
    """Parts 1 and 2 on one gateway with the mock model, for each ``--node-host`` in turn (one paired at a time)."""
    scratch = Path(tempfile.mkdtemp(prefix="openclaw-bench-nodes-"))
    cleanups.callback(lambda: _remove_scratch(scratch, args.keep_state))
    (scratch / "workspaces").mkdir()
    progress("starting the mock OpenAI server")
    mock = start_mock_openai()
    cleanups.callback(lambda: _guarded(mock.stop, "stopping the mock OpenAI server"))
    deployment = Deployment(
        args, name="node gateway", suffix="", extra_env=model_env(mock.base_url, scratch / "workspaces")
    )
    cleanups.callback(lambda: deployment.close(failed=not report.get("complete")))
    deployment.start()
    facts = asyncio.run(gateway_facts(deployment.url, deployment.token))
    hosts: dict[str, Any] = {}
    for kind in node_hosts(args.node_host):
        missing = openclaw_node_missing() if kind == "openclaw" else None
        if missing:
            progress(f"skipping {NODE_HOST_NAMES[kind]}: {missing}")
            hosts[kind] = {"skipped": missing}
            continue
        finished = HostRun()
        with contextlib.ExitStack() as host_cleanups:
            progress(f"node gateway: starting {NODE_HOST_NAMES[kind]} and approving its pairing")
            node_host, node_id = start_paired_host(kind, deployment, scratch, host_cleanups, finished)
            hosts[kind] = run_node_host(NodeRig(deployment, scratch, node_host, node_id, kind), args)
            hosts[kind]["nodeHostTracebacks"] = node_host.log().count("Traceback")
            finished.complete = True
        # The host is stopped (and OpenClaw's HOME removed) before the next one starts: one node on the gateway.
    part: dict[str, Any] = {"hosts": hosts, "memory": deployment.memory()}
    deployment.stop()
    part["logs"] = deployment.logs
    part["mockCompletions"] = len(mock.requests())
    report["environment"] = _environment(deployment, facts, args)
    report["nodeGateway"] = part


@dataclass
class HostRun:
    """Whether a node host's series completed (else its cleanup prints the tail of its log)."""

    complete: bool = False


def start_paired_host(
    kind: str, deployment: Deployment, scratch: Path, cleanups: contextlib.ExitStack, run: HostRun
) -> tuple[NodeHostProcess | OpenClawNodeProcess, str]:
    """The ``kind`` node host, paired and hosting; ``cleanups`` stops it."""
    if kind == "openclaw":
        return start_paired_openclaw_node_host(deployment, cleanups, failed=lambda: not run.complete)
    node_host, node_id = start_paired_node_host(deployment, scratch)
    cleanups.callback(lambda: _stop_node_host(node_host, failed=not run.complete))
    return node_host, node_id


def node_hosts(choice: str) -> tuple[str, ...]:
    return NODE_HOSTS if choice == "both" else (choice,)


def run_node_host(rig: NodeRig, args: argparse.Namespace) -> dict[str, Any]:
    """One node host's series: its first dispatch (the bundle install), node turns, cold starts (the project's node
    host only: OpenClaw's starts a worker for every turn anyway), dispatches."""
    part: dict[str, Any] = {}
    if not args.skip_turns:
        turns = run_turns(rig, args.turns)
        part["turns"] = {
            "local": summarize(turns["localS"]),
            "node": summarize(turns["nodeS"]),
            "firstDispatchS": turns["firstDispatchS"],
        }
        if rig.kind == "project":
            part["coldStart"] = {
                k: summarize(v) for k, v in run_cold_starts(rig, turns["nodeKey"], args.cold_starts).items()
            }
    if not args.skip_dispatch:
        dispatches = run_dispatches(rig, args.dispatch_samples, warm_up=args.skip_turns)
        if "firstDispatchS" in dispatches:
            part.setdefault("turns", {})["firstDispatchS"] = dispatches.pop("firstDispatchS")
        part["dispatch"] = {
            size: {
                "newContentS": summarize(by_kind["newContentS"]),
                "knownContentS": summarize(by_kind["knownContentS"]),
                "failures": by_kind["failures"],
            }
            for size, by_kind in dispatches.items()
        }
    return part


# --- part 3: idle node connections -------------------------------------------------------------


@dataclass
class FleetCounters:
    """What one client process's nodes saw: first connects (with their times), retains answered, ticks, and the
    connections that ended while they should have stayed up (the client's tick watchdog, or the gateway)."""

    connected: int = 0
    retains: int = 0
    ticks: int = 0
    closes: int = 0
    reconnects: int = 0
    skipped: int = 0  # not tried: the join budget was spent
    connect_seconds: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # the first FAILURE_SAMPLES, for the report
    failure_kinds: dict[str, int] = field(default_factory=dict)

    def fail(self, what: str, exc: BaseException) -> None:
        if len(self.failures) < FAILURE_SAMPLES:
            self.failures.append(f"{what}: {type(exc).__name__}: {exc}")
        kind = f"{what}: {type(exc).__name__}"
        self.failure_kinds[kind] = self.failure_kinds.get(kind, 0) + 1


def node_options(url: str, token: str, identity: DeviceIdentity, name: str) -> ClientOptions:
    """A node like the node host connects it (``tests/support/clients.py`` ``node()``), identity kept in memory."""
    return ClientOptions(
        url=url,
        token=token,
        role="node",
        client_id="node-host",
        client_mode="node",
        display_name=name,
        commands=list(NODE_HOST_COMMANDS),
        caps=list(NODE_HOST_CAPS),
        identity=identity,
    )


def idle_inventory() -> dict[str, Any]:
    """What an idle node host declares after connect (``NodeHost.inventory`` with nothing running)."""
    return {
        "protocolFeatures": [WORKER_SUPERVISOR_FEATURE],
        "workerHost": {
            "enabled": True,
            "capacity": {"total": NODE_CAPACITY, "available": NODE_CAPACITY},
            "capturedExecPolicy": True,
        },
    }


class AdminLink:
    """The operator connection that approves a client process's pairing requests (reopened if it was closed)."""

    def __init__(self, url: str, token: str):
        self.url, self.token = url, token
        self.client: GatewayClient | None = None
        self._lock = asyncio.Lock()

    async def approve(self, request_id: str) -> None:
        async with self._lock:
            if self.client is None or self.client.closed.is_set():
                self.client = await connected_client(self.url, self.token)
        await self.client.request("node.pair.approve", {"requestId": request_id}, timeout=REQUEST_TIMEOUT_S)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


class IdleNode:
    """One bench node: a new device that asks for pairing, is approved, connects, declares an idle worker host and
    then stays connected like the node host's loop does (a connection that ends is reopened after a second)."""

    def __init__(self, url: str, token: str, name: str, counters: FleetCounters):
        self.options = node_options(url, token, DeviceIdentity.generate(), name)
        self.counters = counters
        self.client: GatewayClient | None = None
        self.retained = asyncio.Event()

    async def pair(self, admin: AdminLink) -> None:
        """Connect unpaired (refused NOT_PAIRED with a request id), then have the request approved."""
        try:
            await GatewayClient(self.options).connect()
            raise RuntimeError("an unpaired node was let in")
        except ConnectError as refused:
            if refused.code != "NOT_PAIRED":
                raise
            request_id = (refused.details or {})["requestId"]
        await admin.approve(request_id)

    async def connect(self) -> None:
        """Connect as the paired device and declare the worker host (the gateway then sends its retain)."""
        self.retained.clear()
        client = GatewayClient(self.options, invoke_handler=self.answer)
        await client.connect()
        self.client = client
        await client.request("node.runnerInventory.update", idle_inventory(), timeout=REQUEST_TIMEOUT_S)

    async def answer(self, command: str, params: Any) -> dict[str, Any]:
        """What the gateway asks an idle node host: the retain after connect (nothing kept, no bundle yet) and a
        status. A node that left the retain unanswered would hold a gateway worker thread for ten minutes."""
        if command == RETAIN_COMMAND:
            self.counters.retains += 1
            self.retained.set()
            deleted: dict[str, list[str]] = {"environments": [], "bundles": []}
            return {"applied": True, "deleted": deleted, "hasMore": False, "bundleStatus": "missing"}
        if command == STATUS_COMMAND:
            capacity = {"total": NODE_CAPACITY, "available": NODE_CAPACITY, "reclaimableIdle": 0}
            return {"capacity": capacity, "running": [], "environments": []}
        raise NodeCommandError("UNAVAILABLE", f"this bench node does not run {command}")

    async def join(self, admin: AdminLink, gate: asyncio.Semaphore, deadline: float) -> bool:
        """Pair, connect, declare and wait for the retain, at most ``gate`` nodes at a time; False if it failed or
        was not tried (``deadline``, a ``time.monotonic()``, passed first)."""
        async with gate:
            if time.monotonic() >= deadline:
                self.counters.skipped += 1
                return False
            started = time.perf_counter()
            try:
                await self.pair(admin)
                await self.connect()
                await asyncio.wait_for(self.retained.wait(), WAIT_S)
            except Exception as exc:
                self.counters.fail("join", exc)
                return False
            self.counters.connect_seconds.append(time.perf_counter() - started)
            self.counters.connected += 1
            return True

    async def stay_connected(self, stop: asyncio.Event) -> None:
        """Until ``stop``: when the connection ends, count it and reconnect after RECONNECT_DELAY_S."""
        while not stop.is_set():
            if self.client is not None and not self.client.closed.is_set():
                await first_of(self.client.closed.wait(), stop.wait())
                if stop.is_set():
                    return
                self.counters.closes += 1
            if await first_of(stop.wait(), asyncio.sleep(RECONNECT_DELAY_S)) is True:
                return
            try:
                await self.connect()
                self.counters.reconnects += 1
            except Exception as exc:
                self.counters.fail("reconnect", exc)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


async def first_of(*waits: Awaitable[Any]) -> Any:
    """The result of whichever awaitable finishes first; the others are cancelled."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return next(iter(done)).result()


class NodeGroup:
    """The idle nodes of one client process (or of the warm-up): joined at a bounded pace, then kept connected."""

    def __init__(self, url: str, token: str, count: int, tag: str):
        self.counters = FleetCounters()
        self.nodes = [IdleNode(url, token, f"bench-node-{tag}-{i}", self.counters) for i in range(count)]
        self.admin = AdminLink(url, token)
        self.stop = asyncio.Event()
        self.tag = tag
        self._tasks: list[asyncio.Task[None]] = []

    async def join(self, concurrency: int, budget_s: float) -> None:
        """Every node joins (at most ``concurrency`` at a time, none started after ``budget_s``); returns once all
        have, failed to, or were skipped."""
        gate = asyncio.Semaphore(concurrency)
        deadline = time.monotonic() + budget_s
        joined = [asyncio.Event() for _ in self.nodes]
        self._tasks = [
            asyncio.create_task(self._life(node, gate, deadline, event))
            for node, event in zip(self.nodes, joined, strict=True)
        ]
        self._tasks.append(asyncio.create_task(self._drain_ticks()))
        await asyncio.gather(*(event.wait() for event in joined))
        await self.admin.close()

    async def _life(self, node: IdleNode, gate: asyncio.Semaphore, deadline: float, joined: asyncio.Event) -> None:
        try:
            ok = await node.join(self.admin, gate, deadline)
        finally:
            joined.set()
        if self.counters.connected % 100 == 0 and ok:
            progress(f"client process {self.tag}: {self.counters.connected} of {len(self.nodes)} nodes connected")
        if ok:
            await node.stay_connected(self.stop)

    async def _drain_ticks(self) -> None:
        """Empty the nodes' event queues now and then, counting ticks (the client queues every event)."""
        while not self.stop.is_set():
            for node in self.nodes:
                events = node.client.events if node.client is not None else None
                while events is not None and not events.empty():
                    if events.get_nowait().get("event") == "tick":
                        self.counters.ticks += 1
            await first_of(self.stop.wait(), asyncio.sleep(FLEET_DRAIN_INTERVAL_S))

    def open_connections(self) -> int:
        return sum(1 for node in self.nodes if node.client is not None and not node.client.closed.is_set())

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(node.close() for node in self.nodes), return_exceptions=True)


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit to ``wanted`` (at most the hard limit); the new soft limit.

    Children (the gateway started after this) inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


async def fleet_session(
    url: str, token: str, count: int, tag: str, pacing: tuple[int, float], pipe: Connection
) -> None:
    """One client process: join its share (``pacing``: concurrency, budget), report, then answer the parent's
    commands until ``stop``."""
    group = NodeGroup(url, token, count, tag)
    started = time.perf_counter()
    await group.join(*pacing)
    counters = group.counters
    pipe.send(
        {
            "connected": counters.connected,
            "retains": counters.retains,
            "seconds": time.perf_counter() - started,
            "connectSeconds": counters.connect_seconds,
            "failures": counters.failures[:5],
            "failureCount": sum(counters.failure_kinds.values()),
            "skipped": counters.skipped,
        }
    )
    while (command := await asyncio.to_thread(pipe.recv)) != "stop":
        assert command == "count", command
        pipe.send(
            {
                "ticks": counters.ticks,
                "closes": counters.closes,
                "reconnects": counters.reconnects,
                "open": group.open_connections(),
                "failureKinds": counters.failure_kinds,
            }
        )
    await group.close()
    pipe.send({"stopped": True})


def _fleet_process_main(
    url: str, token: str, count: int, tag: str, pacing: tuple[int, float], pipe: Connection
) -> None:
    """Entry point of a client process of the idle-node fleet."""
    raise_fd_limit(count * 2 + 256)
    # The tick watchdog's "no tick; closing" warnings are counted (closes), not printed one by one.
    logging.getLogger("openclaw_client").setLevel(logging.ERROR)
    try:
        asyncio.run(fleet_session(url, token, count, tag, pacing, pipe))
    except BaseException as exc:
        pipe.send({"failure": f"{type(exc).__name__}: {exc}"})


class Fleet:
    """The idle nodes, spread over client processes (their memory is not the gateway's)."""

    def __init__(self, url: str, token: str, count: int, procs: int, pacing: tuple[int, float]):
        """``pacing``: nodes joining at a time per process, and the seconds after which no new join starts."""
        context = multiprocessing.get_context("spawn")
        shares = [n for n in split_evenly(count, procs) if n > 0]
        self.pipes: list[Connection] = []
        self.processes: list[Any] = []
        for index, share in enumerate(shares):
            parent, child = context.Pipe()
            process = context.Process(
                target=_fleet_process_main, args=(url, token, share, str(index), pacing, child), daemon=True
            )
            self.pipes.append(parent)
            self.processes.append(process)

    def start(self) -> dict[str, Any]:
        """Start the processes; returns once every one joined its share (connected, declared, retain answered)."""
        for process in self.processes:
            process.start()
        answers = [self._receive(pipe, FLEET_JOIN_TIMEOUT_S) for pipe in self.pipes]
        failures = [failure for answer in answers for failure in answer["failures"]]
        return {
            "connected": sum(a["connected"] for a in answers),
            "retainsAnswered": sum(a["retains"] for a in answers),
            "seconds": max(a["seconds"] for a in answers),
            "connectSeconds": [s for a in answers for s in a["connectSeconds"]],
            "failureCount": sum(a["failureCount"] for a in answers),
            "failureSamples": failures[:5],
            "skipped": sum(a["skipped"] for a in answers),
        }

    def counts(self) -> dict[str, int]:
        """Ticks received, connections that ended, reconnects so far and connections open now, over all processes."""
        for pipe in self.pipes:
            pipe.send("count")
        answers = [self._receive(pipe, 60) for pipe in self.pipes]
        counts: dict[str, Any] = {
            key: sum(a[key] for a in answers) for key in ("ticks", "closes", "reconnects", "open")
        }
        kinds: dict[str, int] = {}
        for answer in answers:
            for kind, count in answer["failureKinds"].items():
                kinds[kind] = kinds.get(kind, 0) + count
        counts["failureKinds"] = kinds
        return counts

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send("stop")
        for pipe in self.pipes:
            with contextlib.suppress(Exception):
                self._receive(pipe, 60)
        self.kill()

    def kill(self) -> None:
        for process in self.processes:
            if process.pid is None:
                continue
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)

    @staticmethod
    def _receive(pipe: Connection, timeout: float) -> dict[str, Any]:
        if not pipe.poll(timeout):
            raise RuntimeError(f"a fleet client process did not answer within {timeout:.0f} s")
        answer: dict[str, Any] = pipe.recv()
        if "failure" in answer:
            raise RuntimeError(f"a fleet client process failed: {answer['failure']}")
        return answer


def split_evenly(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


async def warm_up_nodes(url: str, token: str, count: int) -> None:
    """Pair, connect, declare and close a few nodes: imports, caches and pools the first ones warm up are not
    a cost of each connection."""
    group = NodeGroup(url, token, count, "warmup")
    await group.join(count, WAIT_S)
    await group.close()
    if group.counters.failures:
        raise RuntimeError(f"warm-up nodes failed: {group.counters.failures[:3]}")


def settled_rss(pid: int, seconds: float) -> float:
    time.sleep(seconds)
    return rss_mib(pid)


def cpu_window(pid: int, seconds: float) -> float:
    """CPU seconds (user + system) of the process over ``seconds`` of wall time."""
    before = process_cpu_seconds(pid)
    time.sleep(seconds)
    return process_cpu_seconds(pid) - before


def join_summary(joined: dict[str, Any]) -> dict[str, Any]:
    """The join phase: how long pairing → connected → retain answered took per node, early and late."""
    seconds = joined.pop("connectSeconds")
    tenth = max(1, len(seconds) // 10)
    return {
        **joined,
        "joinAll": summarize(seconds),
        "joinFirstTenth": summarize(seconds[:tenth]),
        "joinLastTenth": summarize(seconds[-tenth:]),
    }


def settle(pid: int) -> dict[str, float]:
    """Wait until the gateway has worked off what the joins left (presence broadcasts, retains): its CPU over
    SETTLE_SAMPLE_S is under SETTLE_QUIET_SHARE of a core, or no longer falling (then it is the steady cost of the
    connections themselves; a saturated core is a backlog still draining, not that), or SETTLE_MAX_S passed.
    Returns how long that took and the last share."""
    started = time.monotonic()
    shares: list[float] = []
    while time.monotonic() - started < SETTLE_MAX_S:
        shares.append(cpu_window(pid, SETTLE_SAMPLE_S) / SETTLE_SAMPLE_S)
        flat = len(shares) >= 4 and shares[-1] >= 0.9 * max(shares[-4:-1]) and shares[-1] < SETTLE_BUSY_SHARE
        if shares[-1] < SETTLE_QUIET_SHARE or flat:
            break
    return {"settleSeconds": time.monotonic() - started, "settleLastCpuShare": shares[-1] if shares else 0.0}


def measure_with_fleet(fleet: Fleet, pid: int, seconds: float) -> dict[str, Any]:
    """Gateway RSS once the nodes are connected and settled (with how many were open then), then its CPU over
    ``seconds`` (with what the nodes saw in that window: ticks, connections that ended, reconnects)."""
    settled = settle(pid)
    progress(f"settled after {settled['settleSeconds']:.0f} s; measuring")
    rss_with, before = rss_mib(pid), fleet.counts()
    cpu = cpu_window(pid, seconds)
    after = fleet.counts()
    return {
        **settled,
        "rssWithNodesMiB": rss_with,
        "openAtWindowStart": before["open"],
        "openAtWindowEnd": after["open"],
        "cpuNodesS": cpu,
        "ticksReceived": after["ticks"] - before["ticks"],
        "closesInWindow": after["closes"] - before["closes"],
        "closesBeforeWindow": before["closes"],
        "reconnectsInWindow": after["reconnects"] - before["reconnects"],
        "failureKinds": after["failureKinds"],
    }


def run_idle_nodes(args: argparse.Namespace, cleanups: contextlib.ExitStack, report: dict[str, Any]) -> None:
    """Part 3 on a gateway of its own (short tick): memory and tick CPU without and with ``--nodes`` idle nodes."""
    deployment = Deployment(
        args,
        name="idle-nodes gateway",
        suffix="_nodes",
        extra_env={"OPENCLAW_TICK_INTERVAL_MS": str(args.tick_interval_ms)},
    )
    cleanups.callback(lambda: deployment.close(failed=not report.get("complete")))
    deployment.start()
    if "environment" not in report:
        facts = asyncio.run(gateway_facts(deployment.url, deployment.token))
        report["environment"] = _environment(deployment, facts, args)
    pid = deployment.gateway_pid
    progress(f"idle-nodes gateway: {IDLE_WARMUP_NODES} warm-up nodes, then {args.tick_seconds:g} s without nodes")
    asyncio.run(warm_up_nodes(deployment.url, deployment.token, IDLE_WARMUP_NODES))
    rss_before = settled_rss(pid, FLEET_SETTLE_S)
    cpu_none = cpu_window(pid, args.tick_seconds)
    progress(
        f"idle-nodes gateway: pairing and connecting {args.nodes} nodes from {args.node_procs} client process(es), "
        f"{args.join_concurrency} at a time each"
    )
    fleet = Fleet(
        deployment.url, deployment.token, args.nodes, args.node_procs, (args.join_concurrency, args.join_budget)
    )
    cleanups.callback(fleet.kill)
    joined = join_summary(fleet.start())
    progress(f"idle-nodes gateway: {args.tick_seconds:g} s with {joined['connected']} idle nodes")
    window = measure_with_fleet(fleet, pid, args.tick_seconds)
    fleet.stop()
    connected = window["openAtWindowStart"]
    report["idleNodes"] = {
        "nodes": joined,
        "joinConcurrency": args.join_concurrency * len(fleet.processes),
        "joinBudgetSeconds": args.join_budget,
        "tickIntervalMs": args.tick_interval_ms,
        "windowSeconds": args.tick_seconds,
        "ticksPerWindow": args.tick_seconds * 1000 / args.tick_interval_ms,
        "rssBeforeMiB": rss_before,
        "cpuNoneS": cpu_none,
        **window,
        "kibPerConnection": (window["rssWithNodesMiB"] - rss_before) * 1024 / connected if connected else None,
        "rssAfterCloseMiB": settled_rss(pid, FLEET_SETTLE_S),
        "memory": deployment.memory(),
    }
    deployment.stop()
    report["idleNodes"]["logs"] = deployment.logs


# --- the run ----------------------------------------------------------------------------------


def _environment(deployment: Deployment, facts: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    return {
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
    }


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


def _stop_openclaw_node_host(node_host: OpenClawNodeProcess, *, failed: bool) -> None:
    _guarded(node_host.stop, "stopping OpenClaw's node host")
    if failed:
        tail = node_host.log().splitlines()[-30:]
        print("--- last lines of OpenClaw's node host log ---", *tail, sep="\n", file=sys.stderr)
    _guarded(node_host.remove_state, "removing OpenClaw's node host HOME")


def _remove_scratch(scratch: Path, keep: bool) -> None:
    if keep:
        progress(f"checkouts and node host state kept in {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)


def run(args: argparse.Namespace, cleanups: contextlib.ExitStack) -> dict[str, Any]:
    report: dict[str, Any] = {"nodeGateway": None, "idleNodes": None}
    # Before any gateway starts: it inherits the limit, and must take --nodes sockets (and their handshakes).
    report["fdLimit"] = raise_fd_limit(args.nodes * 2 + 1024)
    if not (args.skip_turns and args.skip_dispatch):
        run_node_gateway(args, cleanups, report)
    if not args.skip_idle_nodes:
        run_idle_nodes(args, cleanups, report)
    report["complete"] = True
    return report


# --- output -----------------------------------------------------------------------------------


def render_node_gateway(part: dict[str, Any], args: argparse.Namespace) -> list[str]:
    hosts = part["hosts"]
    measured = {kind: host for kind, host in hosts.items() if "skipped" not in host}
    lines = [f"{NODE_HOST_NAMES[kind]}: skipped ({hosts[kind]['skipped']})" for kind in hosts if kind not in measured]
    if any("local" in host.get("turns", {}) for host in measured.values()):
        lines += [
            "",
            f"chat.send→agent.wait round trip: {args.turns} turns each, local and node interleaved on one "
            f"connection, after {TURN_WARMUP} warm-up turns each; one node host at a time",
            latency_header("round trips (ms)", 50),
        ]
        for kind, host in measured.items():
            local, node = host["turns"]["local"], host["turns"]["node"]
            lines += [
                latency_row(f"{kind}: local session (beside the node turns)", local, 50),
                latency_row(f"{kind}: session placed on the node", node, 50),
            ]
            if "coldStart" in host:
                cold = host["coldStart"]
                lines += [
                    latency_row(f"{kind}: first node turn after node host start", cold["coldS"], 50),
                    latency_row(f"{kind}:   the node turn right after it", cold["nextS"], 50),
                ]
            lines.append(f"  {kind}: node − local, p50: {node['p50'] - local['p50']:+.2f} ms (goal < 20 ms)")
    firsts = {kind: host["turns"]["firstDispatchS"] for kind, host in measured.items() if "turns" in host}
    if firsts:
        lines += ["", "first dispatch to the node (bundle install + 10-file sync), ms"]
        lines += [f"  {kind:<10}{seconds * 1000:>10.0f}" for kind, seconds in firsts.items()]
    if any("dispatch" in host for host in measured.values()):
        lines += [
            "",
            "sessions.dispatch until active (ms; ~1 KiB files; goal: 1,000 files < 5 s)",
            latency_header("worktree, content", 50),
        ]
        for kind, host in measured.items():
            for size, kinds in host.get("dispatch", {}).items():
                lines += [
                    latency_row(f"{kind}: {int(size)} files, new to the node", kinds["newContentS"], 50),
                    latency_row(f"{kind}: {int(size)} files, the node has it", kinds["knownContentS"], 50),
                    *(f"  {kind}: {int(size)} files, failed dispatch: {failure}" for failure in kinds["failures"]),
                ]
    memory, logs = part["memory"], part["logs"]
    tracebacks = ", ".join(f"{kind} {host['nodeHostTracebacks']}" for kind, host in measured.items())
    lines += [
        "",
        f"node gateway RSS {memory['gatewayRssMiB']:.1f} MiB (idle {memory['gatewayIdleRssMiB']:.1f})"
        + (f", worker {memory['workerRssMiB']:.1f} MiB" if memory["workerRssMiB"] else "")
        + f"; mock completions served: {part['mockCompletions']}; node host Tracebacks: {tracebacks or '-'}",
        *_log_lines("node gateway", logs),
    ]
    return lines


def render_idle_nodes(part: dict[str, Any]) -> list[str]:
    nodes = part["nodes"]
    count = part["openAtWindowStart"]
    ticks = part["ticksPerWindow"]
    per_tick_none = 1000 * part["cpuNoneS"] / ticks
    per_tick_nodes = 1000 * part["cpuNodesS"] / ticks
    window = part["windowSeconds"]
    expected_ticks = count * ticks
    return [
        "",
        f"idle node connections on one gateway process (tick every {part['tickIntervalMs']} ms)",
        f"  joined: {nodes['connected']} nodes paired, connected, declared and retained in {nodes['seconds']:.1f} s, "
        f"{part['joinConcurrency']} at a time ({nodes['failureCount']} failures"
        + (
            f"; {nodes['skipped']} not tried: the {part['joinBudgetSeconds']:g} s join budget was spent"
            if nodes["skipped"]
            else ""
        )
        + ")",
        *(f"    failure: {sample}" for sample in nodes["failureSamples"]),
        latency_header("  join time per node (ms)", 46),
        latency_row("    first tenth", nodes["joinFirstTenth"], 46),
        latency_row("    last tenth", nodes["joinLastTenth"], 46),
        f"  settled {part['settleSeconds']:.0f} s after the join (gateway CPU then "
        f"{100 * part['settleLastCpuShare']:.0f} % of one core); "
        f"connections open at the window's start / end: {count} / {part['openAtWindowEnd']}; ended before the "
        f"window: {part['closesBeforeWindow']}, in it: {part['closesInWindow']} (reconnected in it: "
        f"{part['reconnectsInWindow']})",
        f"  gateway RSS before / with nodes / after they closed: {part['rssBeforeMiB']:.1f} / "
        f"{part['rssWithNodesMiB']:.1f} / {part['rssAfterCloseMiB']:.1f} MiB",
        f"  memory per open connection: {_number(part['kibPerConnection'], '.1f')} KiB (goal < 100 KiB)",
        f"  gateway CPU over {window:g} s: {part['cpuNoneS'] * 1000:.0f} ms without nodes, "
        f"{part['cpuNodesS'] * 1000:.0f} ms with them ({100 * part['cpuNoneS'] / window:.1f} / "
        f"{100 * part['cpuNodesS'] / window:.1f} % of one core)",
        f"  per tick ({ticks:.0f} ticks): {per_tick_none:.1f} ms without nodes, {per_tick_nodes:.1f} ms with them, "
        f"{per_tick_nodes - per_tick_none:.1f} ms for the nodes "
        f"({(per_tick_nodes - per_tick_none) / count * 1000 if count else 0:.1f} µs per node)",
        f"  ticks the nodes received in the window: {part['ticksReceived']} (expected ~{expected_ticks:.0f})",
        "  client-side failures by kind: "
        + (", ".join(f"{kind} {count}" for kind, count in part["failureKinds"].items()) or "none"),
        *_log_lines("idle-nodes gateway", part["logs"]),
    ]


# Per-record ids (error ids, connection and task UUIDs, channel names) would make every record a group of its own.
RECORD_IDS = re.compile(
    r"\(errorId=[0-9a-f]+\)|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|specific\.\S+"
)


def _grouped(errors: dict[str, int]) -> dict[str, int]:
    """Error records by message, their per-record ids replaced by ``<id>``."""
    grouped: dict[str, int] = {}
    for message, count in errors.items():
        key = RECORD_IDS.sub("<id>", message)
        grouped[key] = grouped.get(key, 0) + count
    return grouped


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _log_lines(name: str, logs: dict[str, Any]) -> list[str]:
    parts = [
        f"gateway exit code {logs.get('gatewayExitCode')} after {logs.get('gatewayStopSeconds') or 0:.2f} s, "
        f"{logs.get('gatewayErrorRecords', 0)} ERROR records"
    ]
    if logs.get("workerStopped"):
        parts.append(
            f"worker exit code {logs.get('workerExitCode')}, {logs.get('workerErrorRecords', 0)} ERROR records"
        )
    lines = [f"{name} stop: " + "; ".join(parts)]
    for key in ("gatewayErrorsByMessage", "workerErrorsByMessage"):
        grouped = sorted(_grouped(logs.get(key, {})).items(), key=lambda item: -item[1])
        lines += [f"  {count:>5} x {message}" for message, count in grouped[:10]]
    return lines


def render(report: dict[str, Any], args: argparse.Namespace) -> str:
    lines = ["OpenClaw node worker benchmark"]
    env = report.get("environment")
    if env:
        task_mode = (
            "celery (turns and dispatch stages in a Celery worker)"
            if env["taskMode"] == "celery"
            else ("in-process (turns run in worker threads of the gateway)")
        )
        lines += [*environment_lines(env), f"  task mode      {task_mode}"]
    lines.append(
        f"  node host      capacity {NODE_CAPACITY}, capacity wait {NODE_CAPACITY_WAIT_MS} ms; "
        f"open-file limit {report['fdLimit']}"
    )
    if report.get("nodeGateway"):
        lines += render_node_gateway(report["nodeGateway"], args)
    if report.get("idleNodes"):
        lines += render_idle_nodes(report["idleNodes"])
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--database-url", help="PostgreSQL server to use (a scratch database is created and dropped)")
    parser.add_argument(
        "--redis-url", help="Redis for the channel layer, cache and Celery (a unique key prefix per gateway)"
    )
    parser.add_argument(
        "--node-host",
        choices=(*NODE_HOSTS, "both"),
        default="both",
        help="node host(s) measured, one after the other on the same gateway (openclaw: the openclaw-cli tool's)",
    )
    parser.add_argument("--turns", type=int, default=200, help="measured turns per kind (local, node)")
    parser.add_argument("--cold-starts", type=int, default=5, help="node host restarts, each timing its first turn")
    parser.add_argument("--dispatch-samples", type=int, default=5, help="dispatches per worktree size and kind")
    parser.add_argument("--nodes", type=int, default=1000, help="idle node connections")
    parser.add_argument("--node-procs", type=int, default=2, help="client processes holding the idle nodes")
    parser.add_argument(
        "--join-concurrency", type=int, default=2, help="nodes pairing/connecting at a time per client process"
    )
    parser.add_argument(
        "--join-budget", type=float, default=300.0, help="seconds after which no further node starts joining"
    )
    parser.add_argument("--tick-interval-ms", type=int, default=1000, help="the idle-nodes gateway's tick interval")
    parser.add_argument("--tick-seconds", type=float, default=20.0, help="length of each CPU window of the idle part")
    parser.add_argument("--skip-turns", action="store_true", help="leave out the turn round trips and cold starts")
    parser.add_argument("--skip-dispatch", action="store_true", help="leave out the dispatch times")
    parser.add_argument("--skip-idle-nodes", action="store_true", help="leave out the idle node connections")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--keep-state", action="store_true", help="keep state dirs, logs, checkouts, node host state")
    args = parser.parse_args(argv)
    for name in ("turns", "cold_starts", "dispatch_samples", "nodes", "node_procs", "join_concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.tick_seconds <= 0 or args.tick_interval_ms < 100:
        parser.error("--tick-seconds must be positive and --tick-interval-ms at least 100")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
