"""Port of seed 004 (``paired-node-worker-lifecycle-wire.e2e.test.ts``): local control stays usable across
bundle loss, disconnect, capacity and role removal of a paired node worker host.

Same steps and assertions, in order (docs/seeds.md, "Seed 004", maps each seed line to this file): a gateway
whose model is the project's mock OpenAI server (with hold markers), an operator over a real WebSocket with
``identity: null`` (the shared token, as the loopback backend client, which keeps its scopes), and the
project's node host in its own process (capacity 2, 750 ms capacity wait), paired by the operator, reaching its
gateway through a TCP proxy so that the test can drop and re-open the **same** process's connection. Worktree
sessions of a published git workspace; a dispatch to the node (its bundle hash is 64 hex); a node turn and a
local turn; a move back to the gateway with the exact source facts, a local turn, a dispatch back and a node
turn; the public bundle projection (``installed`` with only status and version); the bundle directory deleted
and the same process's connection dropped and re-opened → ``missing`` (a retain was sent), a local turn, then a
new session's dispatch reinstalls exactly once → ``installed``; the node cut off → a turn fails as
``runner-offline``, the placement stays active, local turns work, and once it reconnects the same session's turn
succeeds; two held turns fill both slots and a third fails on capacity with its user message (and no reply) in
history, the placement active, a local turn working, and a retry succeeding once a slot frees; and
``node.pair.remove`` cleans the environment and the placement up before it answers, the old connection's
inventory publish is rejected, the old credentials are refused, the node shows not connected, its disk keeps
nothing of the gateway, local turns go on, and the node host's journal holds no invoke error but the capacity
attempt's. Every clean-up step runs, and each that fails fails the test.

Then the same with the node on a second gateway process (operator on process A, with a device identity; node on
process B).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from openclaw_client.client import ConnectError, GatewayClient
from openclaw_client.identity import IdentityStore
from tests.support.clients import ALL_SCOPES, call_once, move_back_params, node, operator
from tests.support.mock_openai import MockOpenAI
from tests.support.openclaw_cli import require_openclaw_cli
from tests.support.openclaw_node import OpenClawNodeHost
from tests.support.processes import GatewayServer, NodeHostProcess, start_node_host
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SESSION_PREFIX = "agent:qa:paired-node-worker-lifecycle"
HOLD_A = "WIRE-HOLD-A"
HOLD_B = "WIRE-HOLD-B"
TURN_TIMEOUT_MS = 60_000
WAIT_S = 30.0
INSTALL_COMMAND = "worker.bundle.install.v1"
RETAIN_COMMAND = "worker.workspace.retain.v1"


def publish_workspace(root: Path) -> Path:
    """A git checkout with a few files on ``main``: the source of the sessions' worktrees."""
    source = root / "published"
    source.mkdir(parents=True)
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "-C", str(source)]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (source / "README.md").write_text("published workspace\n")
    (source / "src").mkdir()
    (source / "src" / "app.py").write_text("print('hello from the worker')\n")
    (source / "run.sh").write_text("#!/bin/sh\necho run\n")
    (source / "run.sh").chmod(0o755)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "publish"], check=True)
    return source


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


async def eventually(check, *, timeout: float = WAIT_S, interval: float = 0.1):
    """``await check()`` until it stops raising AssertionError (the seed's ``vi.waitFor``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await check()
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        await asyncio.sleep(interval)


class Wire:
    """The seed's helpers, over one operator connection."""

    def __init__(self, client: GatewayClient, published: Path):
        self.client = client
        self.published = published

    async def create_session(self, suffix: str) -> str:
        key = f"{SESSION_PREFIX}:{suffix}"
        await self.client.request(
            "sessions.create",
            {
                "key": key,
                "agentId": "qa",
                "worktree": True,
                "worktreeName": f"paired-node-{suffix}",
                "worktreeBaseRef": "main",
                "cwd": str(self.published),
            },
        )
        return key

    async def dispatch_node_session(self, key: str, node_id: str) -> dict[str, Any]:
        result = await self.client.request("sessions.dispatch", {"key": key, "deviceId": node_id}, timeout=120)
        assert result["placement"]["state"] == "active", result
        return result["placement"]

    async def start_turn(self, key: str, marker: str) -> str:
        run_id = f"{marker.lower()}-{int(time.time() * 1000)}"
        started = await self.client.request(
            "chat.send",
            {"sessionKey": key, "message": f"Reply exactly: {marker}", "deliver": False, "idempotencyKey": run_id},
        )
        assert started["runId"] == run_id and started["status"] == "started", started
        return run_id

    async def wait_for_turn(self, run_id: str) -> dict[str, Any]:
        return await self.client.request(
            "agent.wait", {"runId": run_id, "timeoutMs": TURN_TIMEOUT_MS}, timeout=TURN_TIMEOUT_MS / 1000 + 5
        )

    async def history(self, key: str) -> list[dict[str, Any]]:
        return (await self.client.request("chat.history", {"sessionKey": key, "limit": 100}))["messages"]

    async def expect_successful_turn(self, key: str, marker: str) -> None:
        run_id = await self.start_turn(key, marker)
        waited = await self.wait_for_turn(run_id)
        assert waited["status"] == "ok", waited

        async def replied():
            messages = await self.history(key)
            assert any(m.get("role") == "assistant" and marker in message_text(m) for m in messages), messages

        await eventually(replied)

    async def move_to_gateway(self, key: str) -> dict[str, Any]:
        """``sessions.move`` back to the gateway with the exact source facts the placement shows."""
        source = await self.describe_placement(key)
        assert source["state"] == "active", source
        moved = await self.client.request("sessions.move", move_back_params(key, source), timeout=120)
        return moved["placement"]

    async def describe_placement(self, key: str) -> dict[str, Any]:
        described = await self.client.request("sessions.describe", {"key": key})
        return described["session"].get("placement") or {}

    async def read_node(self, node_id: str) -> dict[str, Any] | None:
        nodes = (await self.client.request("node.list", {}))["nodes"]
        return next((row for row in nodes if row["nodeId"] == node_id), None)

    async def read_environments(self) -> list[dict[str, Any]]:
        return (await self.client.request("environments.list", {}))["environments"]

    async def expect_public_bundle_status(self, node_id: str, status: str) -> None:
        async def projected():
            row = await self.read_node(node_id)
            environment = next((e for e in await self.read_environments() if e["id"] == f"node:{node_id}"), None)
            assert row is not None and environment is not None
            for projection in (row.get("workerBundle"), environment.get("workerBundle")):
                assert projection is not None and projection["status"] == status, (row, environment)
                assert sorted(projection) == (["status", "version"] if status == "installed" else ["status"])
                assert "bundleHash" not in projection and "path" not in projection

        await eventually(projected)


def node_id_of(node_host: NodeHostProcess) -> str:
    identity = json.loads((Path(node_host.state_dir) / "identity" / "device.json").read_text())
    return identity["deviceId"]


async def wait_connected(wire: Wire, node_id: str) -> None:
    async def hosting():
        row = await wire.read_node(node_id)
        assert row is not None and row.get("connected") is True and row.get("sessionHost") is True, row

    await eventually(hosting)


class ProjectNodeHost:
    """The project's node host (``python -m openclaw_client.node``) as the scenario drives it: its own journal counts
    its connects, installs and retains."""

    def __init__(self, node_host: NodeHostProcess):
        self.node_host = node_host
        self.process = node_host.process
        self.node_id = node_id_of(node_host)

    @classmethod
    def start(cls, gateway: GatewayServer, node_gateway: GatewayServer, proxy: TcpProxy) -> ProjectNodeHost:
        node_host = start_node_host(
            node_gateway, capacity=2, capacity_wait_ms=750, gateway_url=f"ws://127.0.0.1:{proxy.port}"
        )
        try:
            call_once(gateway, "node.pair.approve", {"requestId": node_host.pairing_request()})
            return cls(node_host)
        except BaseException:
            node_host.stop()
            node_host.remove_state()
            raise

    def bundle_dir(self, bundle_hash: str) -> Path:
        return Path(self.node_host.state_dir) / "bundles" / bundle_hash

    def installs(self) -> int:
        return self.node_host.invokes(INSTALL_COMMAND)

    def retains(self) -> int | None:
        return self.node_host.invokes(RETAIN_COMMAND)

    def connection_mark(self) -> int:
        return self.node_host.connects()

    def wait_reconnected(self, mark: int, timeout: float = WAIT_S) -> None:
        self.node_host.wait_connects(mark + 1, timeout)

    def wait_for_workers_idle(self) -> None:
        self.node_host.wait_for_workers_idle()

    def device_token(self) -> str:
        return IdentityStore(self.node_host.state_dir).device_token("node") or ""

    async def check_after_removal(self, wire: Wire, node_id: str, node_token: str) -> None:
        # The old connection (the node host's own, never reopened since) can no longer publish its inventory.
        publish = await asyncio.to_thread(self.node_host.publish_inventory)
        # Closed by the gateway for the removal, or refused by it when the close had not reached the socket yet.
        closed_for_removal = publish.get("closeReason") == "device removed"
        assert publish["ok"] is False and (closed_for_removal or publish["code"] not in ("CLOSED", "UNREACHABLE")), (
            publish
        )
        with pytest.raises(ConnectError):
            # The removed node's own credentials (identity and device token) can no longer connect.
            stale = node(node_host_gateway(self.node_host), state_dir=self.node_host.state_dir, token=node_token)
            await stale.connect()
            await stale.request("node.runnerInventory.update", {"protocolFeatures": []})

        async def cleaned_up():
            assert self.node_host.journal("pairing-removed"), self.node_host.log()

        # Nothing of the gateway stays on the node's disk: its workspaces, environment records, bundles and
        # content are gone once the node learns (at its next connect) that it is no longer paired.
        await eventually(cleaned_up)
        assert node_state(self.node_host) == {"workspaces": [], "environments": [], "bundles": [], "blobs": []}

    def check_invoke_errors(self) -> None:
        # Every node.invoke error the node host answered (its journal, not a search of its log): only the capacity
        # attempt's launch, which this protocol answers as that invoke's error (docs/node-worker-protocol.md).
        errors = [(e["command"], e["code"]) for e in self.node_host.journal("invoke-error")]
        assert errors == [("worker.launch.v1", "WORKER_CAPACITY_EXHAUSTED")], self.node_host.journal("invoke-error")

    def stop(self) -> int | None:
        return self.node_host.stop()

    def remove_state(self) -> None:
        self.node_host.remove_state()

    def log(self) -> str:
        return self.node_host.log()


class OpenClawHost:
    """OpenClaw's own node host, unmodified (``tests/support/openclaw_node.py``). What the scenario counts is read on
    the gateway's side (the node's connection and declaration, the bundle downloads the gateway served it), and its
    disk is OpenClaw's (``<home>/.openclaw/node-host/<gatewayNamespace>/``)."""

    def __init__(self, host: OpenClawNodeHost):
        self.host = host
        self.process = host.process
        self.node_id = host.node_id

    @classmethod
    def start(cls, gateway: GatewayServer, node_gateway: GatewayServer, proxy: TcpProxy) -> OpenClawHost:
        logs = [gateway.log_path] if gateway is node_gateway else [gateway.log_path, node_gateway.log_path]
        host = OpenClawNodeHost.start(node_gateway, port=proxy.port, capacity=2, gateway_logs=logs)
        try:
            host.approve()
            return cls(host)
        except BaseException:
            host.stop()
            host.remove_state()
            raise

    def bundle_dir(self, bundle_hash: str) -> Path:
        return self.host.bundle_dir(bundle_hash)

    def installs(self) -> int:
        return self.host.installs()

    def retains(self) -> int | None:
        return None  # not counted: the bundle status the scenario reads next comes only from a retain's answer

    def connection_mark(self) -> str | None:
        return self.host.connection()

    def wait_reconnected(self, mark: str | None, timeout: float = WAIT_S) -> None:
        self.host.wait_reconnected(mark, timeout)

    def wait_for_workers_idle(self) -> None:
        self.host.wait_for_workers_idle()

    def device_token(self) -> str:
        # OpenClaw's node keeps its token in its own state; that the removal refuses it is shown by its new
        # pairing request (it asks to pair again), checked in check_after_removal.
        return "kept by OpenClaw's node host"

    async def check_after_removal(self, wire: Wire, node_id: str, node_token: str) -> None:
        # Before the removal answered, the gateway stopped the node's environments and told it (a retain that keeps
        # nothing) to delete this gateway's workspaces and bundles.
        assert await asyncio.to_thread(self.host.gateway_state) == {"workspaces": [], "bundles": []}, self.log()[-3000:]

    def check_invoke_errors(self) -> None:
        """OpenClaw's node host keeps no journal of its invoke errors that a test could read."""

    def stop(self) -> int | None:
        return self.host.stop()

    def remove_state(self) -> None:
        self.host.remove_state()

    def log(self) -> str:
        return self.host.log()


def lifecycle(
    gateway: GatewayServer,
    node_gateway: GatewayServer,
    mock: MockOpenAI,
    root: Path,
    *,
    device_less: bool,
    host_kind: type[ProjectNodeHost] | type[OpenClawHost] = ProjectNodeHost,
) -> None:
    """The seed's test body, and its ``finally``: every clean-up step runs, and each one that fails fails the test
    (with the test's own failure, as one group when there are several: seed lines 378–397)."""
    published = publish_workspace(root)
    mock.hold(HOLD_A, HOLD_B)
    failures: list[BaseException] = []
    proxy: TcpProxy | None = None
    node_host: ProjectNodeHost | OpenClawHost | None = None
    try:
        proxy = TcpProxy("127.0.0.1", urlsplit(node_gateway.url).port)
        proxy.__enter__()
        # The node host reaches its gateway through the proxy: the test drops its connection without stopping it.
        node_host = host_kind.start(gateway, node_gateway, proxy)
        asyncio.run(scenario(gateway, node_host, proxy, mock, published, device_less=device_less))
    except BaseException as failure:
        failures.append(failure)
    finally:
        servers = [gateway] if gateway is node_gateway else [gateway, node_gateway]
        steps: list[Callable[[], None]] = [mock.release]
        if node_host is not None:
            steps.append(lambda: stopped_cleanly("the node host", node_host.stop()))
            steps.append(node_host.remove_state)
        if proxy is not None:
            steps.append(lambda: proxy.__exit__(None, None, None))
        steps += [lambda server=server: stopped_cleanly("a gateway", server.stop()) for server in servers]
        for step in steps:
            try:
                step()
            except Exception as failure:  # every step runs; each failure is reported
                failures.append(failure)
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise ExceptionGroup("paired node worker lifecycle test failed", failures)


def stopped_cleanly(what: str, returncode: int | None) -> None:
    if returncode != 0:
        raise AssertionError(f"{what} did not stop cleanly (exit code {returncode})")


async def scenario(
    gateway: GatewayServer,
    node_host: ProjectNodeHost | OpenClawHost,
    proxy: TcpProxy,
    mock: MockOpenAI,
    published: Path,
    *,
    device_less: bool,
) -> None:
    if device_less:
        # The seed's operator: ``identity: null`` with the shared token. The reference (protocol.md §2.3) clears the
        # scopes of a client without a device identity except for the loopback backend client with the shared
        # secret, which keeps what it asks for: that is the client the seed's gateway runtime connects as.
        client = operator(gateway, identity=None, client_id="gateway-client", client_mode="backend")
    else:
        client = operator(gateway)
    hello = await client.connect()
    if device_less:
        assert hello["auth"]["scopes"] == ALL_SCOPES, hello["auth"]
    wire = Wire(client, published)
    try:
        node_id = node_host.node_id
        await wait_connected(wire, node_id)
        local_key = await wire.create_session("local-control")
        retained_key = await wire.create_session("retention")
        retained_placement = await wire.dispatch_node_session(retained_key, node_id)
        bundle_hash = retained_placement["workerBundleHash"]
        assert re.fullmatch(r"[a-f0-9]{64}", bundle_hash)

        # Local and node-placed sessions share the gateway without sharing failure state.
        await wire.expect_successful_turn(retained_key, "WIRE-NODE-BASELINE")
        await wire.expect_successful_turn(local_key, "WIRE-LOCAL-BASELINE")

        # Stop-and-continue moves reconcile the source before returning local, never pass through
        # reclaimed, and the same session can dispatch back to its paired node afterwards.
        source = await wire.describe_placement(retained_key)
        assert source["state"] == "active" and source["environmentId"] == retained_placement["environmentId"]
        assert isinstance(source["generation"], int) and isinstance(source["activeOwnerEpoch"], int)
        moved = await wire.move_to_gateway(retained_key)
        assert moved["state"] == "local"
        assert (await wire.describe_placement(retained_key))["state"] == "local"
        await wire.expect_successful_turn(retained_key, "WIRE-MOVED-LOCAL")
        await wire.dispatch_node_session(retained_key, node_id)
        await wire.expect_successful_turn(retained_key, "WIRE-MOVED-BACK")

        # Bundle maintenance reports only the public status/version projection and repairs loss.
        await wire.expect_public_bundle_status(node_id, "installed")
        installed_bundle = node_host.bundle_dir(bundle_hash)
        assert installed_bundle.is_dir()
        installs_before_loss = await asyncio.to_thread(node_host.installs)
        shutil.rmtree(installed_bundle)
        # The same node-host process disconnects and reconnects: what it answers comes from its disk, not from
        # what it remembers having installed.
        pid, retains = node_host.process.pid, node_host.retains()
        mark = await asyncio.to_thread(node_host.connection_mark)
        proxy.cut()
        proxy.restore()
        await asyncio.to_thread(node_host.wait_reconnected, mark)
        assert node_host.process.pid == pid and node_host.process.poll() is None
        await wire.expect_public_bundle_status(node_id, "missing")
        assert retains is None or node_host.retains() > retains
        await wire.expect_successful_turn(local_key, "WIRE-LOCAL-AFTER-LOSS")

        repaired_key = await wire.create_session("reinstalled")
        await wire.dispatch_node_session(repaired_key, node_id)

        async def reinstalled_once():
            assert await asyncio.to_thread(node_host.installs) == installs_before_loss + 1

        await eventually(reinstalled_once)
        await wire.expect_public_bundle_status(node_id, "installed")

        # An offline runner fails before handoff, leaves the active placement retryable, and does not
        # end the independent local session.
        mark = await asyncio.to_thread(node_host.connection_mark)
        proxy.cut()  # and kept cut: the node host (still running) cannot reach its gateway until restored

        async def offline():
            row = await wire.read_node(node_id)
            assert row is not None and row.get("connected") is not True, row

        await eventually(offline)
        offline_run = await wire.start_turn(repaired_key, "WIRE-OFFLINE-ATTEMPT")
        offline = await wire.wait_for_turn(offline_run)
        assert offline["status"] != "ok"
        assert re.search(r"runner-offline|runner is offline|reconnect", json.dumps(offline), re.IGNORECASE), offline
        assert (await wire.describe_placement(repaired_key))["state"] == "active"
        await wire.expect_successful_turn(local_key, "WIRE-LOCAL-AFTER-OFFLINE")
        proxy.restore()
        await asyncio.to_thread(node_host.wait_reconnected, mark, 60.0)
        await wait_connected(wire, node_id)
        await wire.expect_successful_turn(repaired_key, "WIRE-OFFLINE-RETRY")
        await asyncio.to_thread(node_host.wait_for_workers_idle)

        # Two real worker children in flight take both slots; the third turn fails on capacity at the
        # public RPC, history and placement boundaries.
        hold_a_key = await wire.create_session("capacity-a")
        hold_b_key = await wire.create_session("capacity-b")
        capacity_key = await wire.create_session("capacity-c")
        await wire.dispatch_node_session(hold_a_key, node_id)
        await wire.dispatch_node_session(hold_b_key, node_id)
        await wire.dispatch_node_session(capacity_key, node_id)
        hold_a_run = await wire.start_turn(hold_a_key, HOLD_A)
        hold_b_run = await wire.start_turn(hold_b_key, HOLD_B)

        async def both_held():
            assert mock.held() == sorted([HOLD_A, HOLD_B])

        await eventually(both_held)
        capacity_run = await wire.start_turn(capacity_key, "WIRE-CAPACITY-ATTEMPT")
        capacity = await wire.wait_for_turn(capacity_run)
        assert capacity["status"] != "ok"
        assert re.search(r"capacity", json.dumps(capacity), re.IGNORECASE), capacity
        assert (await wire.describe_placement(capacity_key))["state"] == "active"

        async def asked_not_answered():
            messages = await wire.history(capacity_key)
            assert any(m.get("role") == "user" and "WIRE-CAPACITY-ATTEMPT" in message_text(m) for m in messages)
            assert not any(
                m.get("role") == "assistant" and "WIRE-CAPACITY-ATTEMPT" in message_text(m) for m in messages
            )

        await eventually(asked_not_answered)
        await wire.expect_successful_turn(local_key, "WIRE-LOCAL-AT-CAPACITY")
        mock.release(HOLD_A)
        assert (await wire.wait_for_turn(hold_a_run))["status"] == "ok"
        await wire.expect_successful_turn(capacity_key, "WIRE-CAPACITY-RETRY")
        mock.release(HOLD_B)
        assert (await wire.wait_for_turn(hold_b_run))["status"] == "ok"

        # Node-role removal waits for environment and placement cleanup before it answers, invalidates
        # the old connection, and leaves local execution available.
        removal_key = await wire.create_session("role-removal")
        removal_placement = await wire.dispatch_node_session(removal_key, node_id)
        node_token = node_host.device_token()
        assert node_token
        removed = await client.request("node.pair.remove", {"nodeId": node_id}, timeout=120)
        assert removed["nodeId"] == node_id
        environment = next(e for e in await wire.read_environments() if e["id"] == removal_placement["environmentId"])
        assert environment["worker"]["state"] in ("destroyed", "failed", "orphaned"), environment
        assert (await wire.describe_placement(removal_key))["state"] == "failed"

        async def not_connected():
            row = await wire.read_node(node_id)
            assert row is None or row.get("connected") is not True, row

        await eventually(not_connected)

        await node_host.check_after_removal(wire, node_id, node_token)
        await wire.expect_successful_turn(local_key, "WIRE-LOCAL-AFTER-REMOVAL")
        node_host.check_invoke_errors()
    finally:
        await client.close()


def node_state(node_host: NodeHostProcess) -> dict[str, list[str]]:
    """What the node host keeps for its gateway, as it lies on its disk."""
    state = Path(node_host.state_dir)
    return {
        folder: sorted(str(path.relative_to(state / folder)) for path in (state / folder).rglob("*"))
        for folder in ("workspaces", "environments", "bundles", "blobs")
    }


def node_host_gateway(node_host: NodeHostProcess):
    """The gateway the node host talks to, as ``tests.support.clients.node`` takes it."""
    url = node_host.argv[node_host.argv.index("--gateway") + 1]
    return type("NodeGateway", (), {"url": url, "token": None})()


@pytest.fixture
def workspace_root(tmp_path) -> Path:
    root = tmp_path / "allowed"
    root.mkdir()
    return root


def model_env(mock: MockOpenAI, workspace_root: Path) -> dict[str, str]:
    return {
        "OPENCLAW_MODEL_BASE_URL": mock.base_url,
        "OPENCLAW_MODEL_API_KEY": "sk-test",
        "OPENCLAW_MODEL": "mock-model",
        "OPENCLAW_MODEL_READ_TIMEOUT_S": "60",
        "OPENCLAW_WORKSPACE_ROOTS": str(workspace_root),
    }


def test_local_control_survives_bundle_loss_disconnect_capacity_and_role_removal(
    gateway_factory, mock_openai, workspace_root
):
    gateway = gateway_factory(extra_env=model_env(mock_openai, workspace_root))
    lifecycle(gateway, gateway, mock_openai, workspace_root, device_less=True)


@pytest.mark.redis
def test_the_same_with_the_node_on_a_second_gateway_process(gateway_factory, mock_openai, workspace_root):
    # One deployment: its processes share the secret that signs what one issues and another checks
    # (here, the inference token of a turn that process A runs and the node asks process B for).
    cluster = {**model_env(mock_openai, workspace_root), "DJANGO_SECRET_KEY": secrets.token_urlsafe(50)}
    gateway_a = gateway_factory(extra_env=cluster)
    gateway_b = gateway_factory(extra_env=cluster)
    lifecycle(gateway_a, gateway_b, mock_openai, workspace_root, device_less=False)


@pytest.mark.openclaw_cli
def test_the_same_with_openclaw_s_own_node_host(gateway_factory, mock_openai, workspace_root):
    """Issue 29's proof: the seed's steps with OpenClaw's node host (2026.9.6, unmodified) in place of the project's.
    It installs the project's worker bundle, syncs the worktrees, runs the turns in the project's worker
    (``workers_app/openclaw_worker``) and stops the environments, all in OpenClaw's own dialect."""
    require_openclaw_cli()
    gateway = gateway_factory(extra_env=model_env(mock_openai, workspace_root))
    lifecycle(gateway, gateway, mock_openai, workspace_root, device_less=True, host_kind=OpenClawHost)
