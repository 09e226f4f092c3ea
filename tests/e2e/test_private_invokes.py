"""Private node commands (docs/node-worker-protocol.md): the gateway's own invokes of a node's worker
commands, their ``node.invoke.progress``, and what operators can never see or send.

Over real sockets, against a real gateway process and real node clients (``openclaw_client``):

* ``node.event`` ``node.invoke.progress`` in a bad shape is refused with the exact message; progress
  for an invoke the connection does not owe (unknown, or already answered) is acknowledged, ignored;
* an operator's ``node.invoke`` of any private command is refused, even when the node declared it,
  and no private command shows in ``node.list``, ``node.describe`` or the node's ``environments.list`` row.

``invoke_private`` runs wherever the worker runtime runs: on a gateway's loop (in-process tasks) or
in a Celery worker, reaching the node's connection through the channel layer. How it is driven here:

* Its refusals before anything is sent (``NOT_CONNECTED``, ``UNSUPPORTED``, a pinned connection that
  is no longer current) are decided from the database rows the gateway keeps of its connections, so
  the test process calls it against the real gateway, in every profile.
* Results, progress order, stale ``seq`` dropping, the idle ``TIMEOUT`` and a node that disconnects
  mid-invoke need the node connection's channel layer. With Redis (the PostgreSQL+Redis profile),
  the test process joins the gateway's channel layer and calls ``invoke_private`` exactly as a Celery
  worker does, against a real node client (route ``gateway``). The embedded profile's in-memory
  layer lives inside the gateway process and cannot be joined from outside (importing the gateway's
  in-process state here would only test a copy of it), so there those scenarios run in-process
  (route ``in-process``): this process plays the node connection's gateway side with the real
  handlers (``forward_to_node``, ``node.event`` and ``node.invoke.result`` through the request
  dispatcher, ``fail_pending``), as ``GatewayConsumer`` does, and ``invoke_private`` reaches it over
  this process's channel layer. The route ``in-process`` runs in every profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import pytest
from channels.layers import get_channel_layer
from django.db import connections
from django.utils import timezone

from gateway import invoke
from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.dispatch import run_request
from gateway.invoke import NodeCommandFailed, invoke_private
from gateway.models import GatewayConnection, GatewayProcess
from gateway.node_commands import NODE_WORKER_PRIVATE_COMMANDS
from gateway.protocol import RequestFrame
from openclaw_client.client import GatewayError, NodeCommandError, current_invoke
from tests.support.clients import operator, paired_node
from tests.support.processes import gateway_settings_for_tests

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PRIVATE = sorted(NODE_WORKER_PRIVATE_COMMANDS)
PRIVATE_REFUSAL = "node.invoke does not allow private node controls"
NEEDS_SHAPE = "node.invoke.progress needs {id, seq, data}"
NEEDS_SEQ = "node.invoke.progress needs a positive integer seq and an object data"
HOST = {
    "protocolFeatures": ["node-worker-supervisor-v6"],
    "workerHost": {"enabled": True, "capacity": {"total": 2, "available": 2}, "capturedExecPolicy": True},
}
WAIT_S = 10.0


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def in_own_connection(fn, *args, **kwargs):
    """Database work from a scenario's thread, on a connection closed afterwards."""
    try:
        return fn(*args, **kwargs)
    finally:
        connections.close_all()


async def db(fn, *args, **kwargs):
    return await asyncio.to_thread(in_own_connection, fn, *args, **kwargs)


def live_node_conn_id(node_id: str) -> str | None:
    from gateway.selectors import live_node_connection

    conn = live_node_connection(node_id)
    return str(conn.conn_id) if conn is not None else None


@contextlib.asynccontextmanager
async def operator_and_node(server, *, commands: list[str], handler=None) -> AsyncIterator[tuple[Any, Any]]:
    admin = operator(server)
    await admin.connect()
    node = await paired_node(server, admin, commands=commands, invoke_handler=handler)
    try:
        yield admin, node
    finally:
        await node.close()
        await admin.close()


async def progress(node, payload: Any = None, **params: Any) -> dict:
    """One ``node.event`` ``node.invoke.progress`` from the node (its response payload)."""
    body = {"event": invoke.PROGRESS_EVENT, **params}
    if payload is not None:
        body["payload"] = payload
    return await node.request("node.event", body)


def _drain(queue: asyncio.Queue, event: str) -> list[dict]:
    frames = []
    while not queue.empty():
        frame = queue.get_nowait()
        if frame.get("event") == event:
            frames.append(frame)
    return frames


# --- node.invoke.progress as the gateway takes it --------------------------------------------------

MALFORMED = {
    "no payload": ({}, NEEDS_SHAPE),
    "payload not an object": ({"payload": [1, 2]}, NEEDS_SHAPE),
    "missing id": ({"payload": {"seq": 1, "data": {}}}, NEEDS_SHAPE),
    "id not a string": ({"payload": {"id": 7, "seq": 1, "data": {}}}, NEEDS_SHAPE),
    "seq 0": ({"payload": {"id": "i", "seq": 0, "data": {}}}, NEEDS_SEQ),
    "seq negative": ({"payload": {"id": "i", "seq": -1, "data": {}}}, NEEDS_SEQ),
    "seq true": ({"payload": {"id": "i", "seq": True, "data": {}}}, NEEDS_SEQ),
    "seq a float": ({"payload": {"id": "i", "seq": 1.5, "data": {}}}, NEEDS_SEQ),
    "seq a string": ({"payload": {"id": "i", "seq": "1", "data": {}}}, NEEDS_SEQ),
    "seq missing": ({"payload": {"id": "i", "data": {}}}, NEEDS_SEQ),
    "data a list": ({"payload": {"id": "i", "seq": 1, "data": []}}, NEEDS_SEQ),
    "data a string": ({"payload": {"id": "i", "seq": 1, "data": "text"}}, NEEDS_SEQ),
    "data missing": ({"payload": {"id": "i", "seq": 1}}, NEEDS_SEQ),
    "payloadJSON not JSON": (
        {"payloadJSON": "{not json"},
        "invalid node.event params: payloadJSON: malformed JSON (Expecting property name enclosed in double quotes)",
    ),
    "payloadJSON a bare string": ({"payloadJSON": '"text"'}, NEEDS_SHAPE),
    "payloadJSON with seq 0": ({"payloadJSON": '{"id": "i", "seq": 0, "data": {}}'}, NEEDS_SEQ),
}


def test_malformed_progress_is_refused_with_the_exact_message(gateway):
    """Every bad shape, on one node connection (which stays usable after each refusal)."""

    async def scenario() -> dict[str, tuple[str, str]]:
        async with operator_and_node(gateway, commands=["echo"]) as (_admin, node):
            refused = {}
            for case, (params, _message) in MALFORMED.items():
                with pytest.raises(GatewayError) as error:
                    await node.request("node.event", {"event": invoke.PROGRESS_EVENT, **params})
                refused[case] = (error.value.code, error.value.message)
            return refused

    refused = asyncio.run(scenario())

    assert refused == {case: ("INVALID_REQUEST", message) for case, (_params, message) in MALFORMED.items()}


def test_progress_for_an_unknown_or_answered_invoke_is_acknowledged_and_ignored(gateway):
    """An operator's invoke answered, its id reported again as progress: nobody waits for it any more."""
    seen: list[str] = []

    async def echo(command: str, params: Any) -> Any:
        seen.append(current_invoke.get().invoke_id)
        return {"echoed": params}

    async def scenario():
        async with operator_and_node(gateway, commands=["echo"], handler=echo) as (admin, node):
            unknown = await progress(node, {"id": "no-such-invoke", "seq": 1, "data": {"kind": "delta"}})
            as_json = await progress(node, payloadJSON='{"id": "no-such-invoke", "seq": 2, "data": {}}')
            answered = await admin.request(
                "node.invoke", {"nodeId": node.device_id, "command": "echo", "params": 1, "idempotencyKey": "k"}
            )
            late = await progress(node, {"id": seen[0], "seq": 1, "data": {}})
            return unknown, as_json, answered, late

    unknown, as_json, answered, late = asyncio.run(scenario())

    ignored = {"ok": True, "event": invoke.PROGRESS_EVENT, "handled": False, "reason": "unknown-invoke"}
    assert unknown == as_json == late == ignored
    assert answered["payload"] == {"echoed": 1}


def test_progress_of_an_operators_invoke_does_not_break_the_operators_connection(gateway):
    async def reporting(command: str, params: Any) -> Any:
        await current_invoke.get().progress({"step": 1})
        return {"done": True}

    async def scenario():
        async with operator_and_node(gateway, commands=["echo"], handler=reporting) as (admin, node):
            answered = await admin.request(
                "node.invoke", {"nodeId": node.device_id, "command": "echo", "idempotencyKey": "k"}, timeout=10
            )
            still_there = await admin.request("node.list", {}, timeout=10)
            return node.device_id, answered, still_there

    node_id, answered, still_there = asyncio.run(scenario())

    assert answered["payload"] == {"done": True}
    assert any(row["nodeId"] == node_id for row in still_there["nodes"])


# --- what operators never reach or see -----------------------------------------------------------


def test_an_operator_cannot_invoke_any_private_command_even_when_the_node_declared_it(gateway):
    invoked: list[str] = []

    async def record(command: str, params: Any) -> Any:
        invoked.append(command)
        return {}

    async def scenario():
        async with operator_and_node(gateway, commands=["echo", *PRIVATE], handler=record) as (admin, node):
            refusals = {}
            for command in PRIVATE:
                with pytest.raises(GatewayError) as refused:
                    await admin.request(
                        "node.invoke",
                        {
                            "nodeId": node.device_id,
                            "command": command,
                            "params": {"version": 1},
                            "idempotencyKey": command,
                        },
                    )
                refusals[command] = (refused.value.code, refused.value.message, refused.value.details)
            # Padded or not, the name is the private command's.
            with pytest.raises(GatewayError) as padded:
                await admin.request(
                    "node.invoke", {"nodeId": node.device_id, "command": " worker.launch.v1 ", "idempotencyKey": "p"}
                )
            echoed = await admin.request(
                "node.invoke", {"nodeId": node.device_id, "command": "echo", "idempotencyKey": "e"}
            )
            return refusals, padded.value, echoed

    refusals, padded, echoed = asyncio.run(scenario())

    assert refusals == {command: ("INVALID_REQUEST", PRIVATE_REFUSAL, {"command": command}) for command in PRIVATE}
    assert (padded.code, padded.message, padded.details) == (
        "INVALID_REQUEST",
        PRIVATE_REFUSAL,
        {"command": "worker.launch.v1"},
    )
    assert echoed["ok"] is True
    assert invoked == ["echo"]  # no private command reached the node


def test_private_commands_never_show_in_node_list_describe_or_environments_list(gateway):
    async def scenario():
        async with operator_and_node(gateway, commands=["echo", *PRIVATE]) as (admin, node):
            await node.request("node.runnerInventory.update", HOST)
            listed = await admin.request("node.list", {})
            described = await admin.request("node.describe", {"nodeId": node.device_id})
            environments = await admin.request("environments.list", {})
            return node.device_id, listed, described, environments

    node_id, listed, described, environments = asyncio.run(scenario())

    node_row = next(row for row in listed["nodes"] if row["nodeId"] == node_id)
    environment_row = next(row for row in environments["environments"] if row["id"] == f"node:{node_id}")
    assert node_row["commands"] == ["echo"]
    assert described["commands"] == ["echo"]
    assert environment_row["invocableCommands"] == ["echo"]
    assert environment_row["sessionHost"] is True  # the node is a worker host: the commands are there
    for answer in (listed, described, environments):
        text = json.dumps(answer)
        assert not [command for command in PRIVATE if command in text]


# --- invoke_private: refused before anything is sent ----------------------------------------------


def test_invoke_private_of_a_node_that_is_not_connected_is_not_connected(gateway):
    async def scenario():
        with pytest.raises(NodeCommandFailed) as never:
            await invoke_private("f" * 64, "worker.status.v1", {"version": 1}, timeout_ms=30_000)
        async with operator_and_node(gateway, commands=["echo", "worker.status.v1"]) as (_admin, node):
            node_id = node.device_id
        await eventually(lambda: db(lambda: live_node_conn_id(node_id) is None))
        started = time.monotonic()
        with pytest.raises(NodeCommandFailed) as gone:
            await invoke_private(node_id, "worker.status.v1", {"version": 1}, timeout_ms=30_000)
        return never.value, gone.value, time.monotonic() - started

    never, gone, took = asyncio.run(scenario())

    assert (never.code, never.message) == ("NOT_CONNECTED", "node not connected")
    assert (gone.code, gone.message) == ("NOT_CONNECTED", "node not connected")
    assert took < 5  # refused at once, not after the timeout


def test_invoke_private_of_a_command_the_node_does_not_offer_is_unsupported_at_once(gateway):
    async def echo(command: str, params: Any) -> Any:
        return {"echoed": params}

    async def scenario():
        async with operator_and_node(gateway, commands=["echo"], handler=echo) as (admin, node):
            started = time.monotonic()
            with pytest.raises(NodeCommandFailed) as refused:
                await invoke_private(node.device_id, "worker.status.v1", {"version": 1}, timeout_ms=30_000)
            took = time.monotonic() - started
            # A round trip later, the node has still been asked nothing.
            await admin.request("node.invoke", {"nodeId": node.device_id, "command": "echo", "idempotencyKey": "k"})
            requests = [frame["payload"]["command"] for frame in _drain(node.events, "node.invoke.request")]
            return refused.value, took, requests

    refused, took, requests = asyncio.run(scenario())

    assert (refused.code, refused.message) == ("UNSUPPORTED", "node does not offer worker.status.v1")
    assert took < 5
    assert requests == ["echo"]


def test_invoke_private_pinned_to_an_older_connection_is_refused(gateway):
    async def scenario():
        async with operator_and_node(gateway, commands=["echo", "worker.status.v1"]) as (_admin, node):
            current = await db(live_node_conn_id, node.device_id)
            with pytest.raises(NodeCommandFailed) as refused:
                await invoke_private(
                    node.device_id, "worker.status.v1", {"version": 1}, timeout_ms=30_000, conn_id=str(uuid.uuid4())
                )
            return current, refused.value

    current, refused = asyncio.run(scenario())

    assert current is not None
    assert (refused.code, refused.message) == ("NOT_CONNECTED", "node connection is no longer current")


# --- invoke_private: results, progress, timeouts (both routes) -----------------------------------

Script = Callable[["Node", str, str, Any], Awaitable[Any]]


class Node(Protocol):
    """What a scenario's node script may do while it answers an invoke (both routes implement it)."""

    node_id: str

    async def progress(self, invoke_id: str, seq: int, data: dict) -> dict: ...

    async def disconnect(self) -> None: ...


class WireNode(Node):
    """A real node client connected to the gateway process (the route ``gateway``)."""

    def __init__(self, client):
        self.client = client
        self.node_id = client.device_id

    async def progress(self, invoke_id: str, seq: int, data: dict) -> dict:
        return await progress(self.client, {"id": invoke_id, "seq": seq, "data": data})

    async def disconnect(self) -> None:
        await self.client.close()


class InProcessNode(Node):
    """The gateway side of a node connection in this process (the route ``in-process``): routed invokes
    reach ``forward_to_node`` (as ``GatewayConsumer.gateway_invoke_request``), the node's requests go
    through the request dispatcher, and a disconnect runs ``fail_pending``."""

    def __init__(self, node_id: str, commands: list[str], script: Script):
        self.node_id = node_id
        self.commands = commands
        self.script = script
        self.ctx: RpcContext | None = None
        self.tasks: set[asyncio.Task] = set()
        self.frames = itertools.count(1)

    async def open(self) -> None:
        channel = await get_channel_layer().new_channel()
        self.ctx = RpcContext(
            conn_id=str(uuid.uuid4()),
            channel_name=channel,
            role=sc.ROLE_NODE,
            scopes=[],
            auth_method="device-token",
            client_id="node-host",
            client_mode="node",
            device_id=self.node_id,
            node_id=self.node_id,
            commands=list(self.commands),
        )
        await db(self._register)
        self.pump = asyncio.ensure_future(self._pump())

    def _register(self) -> None:
        now = timezone.now()
        process = GatewayProcess.objects.create(
            boot_id=uuid.uuid4(), hostname="in-process", pid=1, started_at=now, heartbeat_at=now
        )
        GatewayConnection.objects.create(
            conn_id=self.ctx.conn_id,
            process=process,
            channel_name=self.ctx.channel_name,
            role=sc.ROLE_NODE,
            scopes=[],
            auth_method="device-token",
            device_id=self.node_id,
            node_id=self.node_id,
            client_id="node-host",
            client_mode="node",
            commands=list(self.commands),
            connected_at=now,
        )

    def _unregister(self) -> None:
        GatewayConnection.objects.filter(conn_id=self.ctx.conn_id).delete()
        GatewayProcess.objects.filter(hostname="in-process").delete()

    async def _pump(self) -> None:
        layer = get_channel_layer()
        while True:
            message = await layer.receive(self.ctx.channel_name)
            if message.get("type") == invoke.REQUEST_MESSAGE:
                await invoke.forward_to_node(self.ctx, message, self._deliver)

    async def _deliver(self, frame: dict) -> None:
        task = asyncio.ensure_future(self._answer(frame["payload"]))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, request: dict) -> None:
        params = json.loads(request["paramsJSON"]) if request.get("paramsJSON") else None
        result: dict[str, Any] = {"id": request["id"], "nodeId": request["nodeId"]}
        try:
            payload = await self.script(self, request["id"], request["command"], params)
            result.update(ok=True, payloadJSON=json.dumps(payload))
        except NodeCommandError as error:
            result.update(ok=False, error={"code": error.code, "message": error.message})
        await self.request("node.invoke.result", result)

    async def request(self, method: str, params: dict) -> dict:
        frame = RequestFrame(type="req", id=f"r{next(self.frames)}", method=method, params=params)
        response = await run_request(self.ctx, frame)
        if not response.get("ok"):
            raise GatewayError(response.get("error") or {})
        return response["payload"]

    async def progress(self, invoke_id: str, seq: int, data: dict) -> dict:
        return await self.request(
            "node.event", {"event": invoke.PROGRESS_EVENT, "payload": {"id": invoke_id, "seq": seq, "data": data}}
        )

    async def disconnect(self) -> None:
        if self.ctx is None:
            return
        self.pump.cancel()
        for task in list(self.tasks):
            task.cancel()
        await invoke.fail_pending(self.ctx)
        await db(self._unregister)
        self.ctx = None


@pytest.fixture(params=["gateway", "in-process"])
def route(request, settings):
    """How ``invoke_private`` reaches the node (see the module docstring)."""
    if request.param == "gateway":
        if not settings.REDIS_URL:
            pytest.skip("joining a gateway's channel layer from another process needs Redis")
        prefix = gateway_settings_for_tests(0)["OPENCLAW_REDIS_PREFIX"]
        settings.CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "channels_redis.core.RedisChannelLayer",
                "CONFIG": {
                    "hosts": [{"address": settings.REDIS_URL, "socket_timeout": 15}],
                    "prefix": f"{prefix}:asgi",
                },
            }
        }
        return request.getfixturevalue("gateway")
    return None


@contextlib.asynccontextmanager
async def node_for(server, commands: list[str], script: Script) -> AsyncIterator[Node]:
    """A node offering ``commands`` whose invokes ``script`` answers, on the route's connection.

    The channel layer's Redis pools are not closed here: channels_redis closes a loop's pools when
    the loop closes (the end of the scenario's ``asyncio.run``). ``close_pools()`` would close every
    loop's, from this one: the layer is the process's, and the publisher's long-lived loop holds
    pools in it once an earlier test published from synchronous code.
    """
    if server is None:
        node = InProcessNode(uuid.uuid4().hex * 2, commands, script)
        await node.open()
        try:
            yield node
        finally:
            await node.disconnect()
        return
    holder: dict[str, WireNode] = {}

    async def handler(command: str, params: Any) -> Any:
        return await script(holder["node"], current_invoke.get().invoke_id, command, params)

    async with operator_and_node(server, commands=commands, handler=handler) as (_admin, client):
        holder["node"] = WireNode(client)
        yield holder["node"]


def test_progress_reaches_the_caller_in_seq_order_before_the_result(route):
    seen_params: list[Any] = []

    async def script(node: Node, invoke_id: str, command: str, params: Any) -> Any:
        seen_params.append((command, params))
        for seq in (1, 2, 3):
            assert await node.progress(invoke_id, seq, {"kind": "delta", "text": "ab"[: seq - 1]}) == {
                "ok": True,
                "event": invoke.PROGRESS_EVENT,
                "handled": True,
            }
        return {"status": "ok", "text": "ab"}

    async def scenario():
        received: list[dict] = []

        async def on_progress(data: dict) -> None:
            received.append(data)

        async with node_for(route, ["worker.launch.v1"], script) as node:
            result = await invoke_private(
                node.node_id,
                "worker.launch.v1",
                {"version": 1, "runId": "r1"},
                timeout_ms=10_000,
                on_progress=on_progress,
            )
        return result, received

    result, received = asyncio.run(scenario())

    assert result == {"status": "ok", "text": "ab"}
    assert received == [{"kind": "delta", "text": ""}, {"kind": "delta", "text": "a"}, {"kind": "delta", "text": "ab"}]
    assert seen_params == [("worker.launch.v1", {"version": 1, "runId": "r1"})]


def test_progress_behind_one_already_passed_is_dropped(route):
    """Frames may be handled out of order on the gateway: the caller keeps only ``seq`` above the last."""

    async def script(node: Node, invoke_id: str, command: str, params: Any) -> Any:
        for seq in (2, 1, 2, 4, 3, 5):
            await node.progress(invoke_id, seq, {"seq": seq})
        return {"done": True}

    async def scenario():
        received: list[dict] = []

        async def on_progress(data: dict) -> None:
            received.append(data)

        async with node_for(route, ["worker.launch.v1"], script) as node:
            result = await invoke_private(
                node.node_id, "worker.launch.v1", {"version": 1}, timeout_ms=10_000, on_progress=on_progress
            )
        return result, received

    result, received = asyncio.run(scenario())

    assert result == {"done": True}
    assert received == [{"seq": 2}, {"seq": 4}, {"seq": 5}]


def test_a_node_error_is_raised_with_its_code_and_message(route):
    async def script(node: Node, invoke_id: str, command: str, params: Any) -> Any:
        raise NodeCommandError("WORKER_CAPACITY_EXHAUSTED", "node worker capacity remained full for 750 ms")

    async def scenario():
        async with node_for(route, ["worker.launch.v1"], script) as node:
            with pytest.raises(NodeCommandFailed) as failed:
                await invoke_private(node.node_id, "worker.launch.v1", {"version": 1}, timeout_ms=10_000)
        return failed.value

    failed = asyncio.run(scenario())

    assert (failed.code, failed.message) == (
        "WORKER_CAPACITY_EXHAUSTED",
        "node worker capacity remained full for 750 ms",
    )


def test_a_node_that_does_not_answer_in_time_is_a_timeout_and_its_late_answer_is_ignored(route):
    release = asyncio.Event()
    calls: list[str] = []

    async def script(node: Node, invoke_id: str, command: str, params: Any) -> Any:
        calls.append(invoke_id)
        if len(calls) == 1:
            await release.wait()
            return {"late": True}
        return {"second": True}

    async def scenario():
        async with node_for(route, ["worker.status.v1"], script) as node:
            started = time.monotonic()
            with pytest.raises(NodeCommandFailed) as timed_out:
                await invoke_private(node.node_id, "worker.status.v1", {"version": 1}, timeout_ms=300)
            took = time.monotonic() - started
            release.set()
            second = await invoke_private(node.node_id, "worker.status.v1", {"version": 1}, timeout_ms=10_000)
        return timed_out.value, took, second

    timed_out, took, second = asyncio.run(scenario())

    assert (timed_out.code, timed_out.message) == ("TIMEOUT", "node did not answer worker.status.v1 within 300 ms")
    assert 0.3 <= took < 5
    assert second == {"second": True}  # the late answer of the first went nowhere


def test_progress_keeps_a_long_invoke_alive_past_its_idle_timeout(route):
    """``timeout_ms`` is an idle timeout: a node that keeps reporting may take longer than it in all."""

    async def script(node: Node, invoke_id: str, command: str, params: Any) -> Any:
        for seq in range(1, 5):
            await asyncio.sleep(0.5)  # the pace under test, well inside the 1.5 s idle timeout
            await node.progress(invoke_id, seq, {"seq": seq})
        return {"done": True}

    async def scenario():
        async with node_for(route, ["worker.launch.v1"], script) as node:
            started = time.monotonic()
            result = await invoke_private(node.node_id, "worker.launch.v1", {"version": 1}, timeout_ms=1_500)
        return result, time.monotonic() - started

    result, took = asyncio.run(scenario())

    assert result == {"done": True}
    assert took > 1.5


def test_a_node_that_disconnects_mid_invoke_fails_it_as_not_connected(route):
    asked = asyncio.Event()

    async def script(node: Node, invoke_id: str, command: str, params: Any) -> Any:
        asked.set()
        await asyncio.Event().wait()  # never answers

    async def scenario():
        async with node_for(route, ["worker.launch.v1"], script) as node:
            call = asyncio.ensure_future(
                invoke_private(node.node_id, "worker.launch.v1", {"version": 1}, timeout_ms=30_000)
            )
            await asyncio.wait_for(asked.wait(), WAIT_S)
            started = time.monotonic()
            await node.disconnect()
            with pytest.raises(NodeCommandFailed) as failed:
                await asyncio.wait_for(call, WAIT_S)
        return failed.value, time.monotonic() - started

    failed, took = asyncio.run(scenario())

    assert (failed.code, failed.message) == ("NOT_CONNECTED", "node disconnected (worker.launch.v1)")
    assert took < 5
