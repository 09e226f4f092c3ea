"""Turns of a session placed on a node host process, over real WebSockets: the reply streams out as
``chat`` deltas before the turn ends (the node's progress, passed on by the gateway), an abort stops the
worker child on the node (``worker.cancel.v1``) and keeps the partial reply, and a model failure is the
turn's error with the model's kind — the provider's key never reaching the node."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.invoke import LIVENESS_CHECK_S
from openclaw_client.client import current_invoke
from openclaw_client.node import NODE_HOST_CAPS, NODE_HOST_COMMANDS
from sessions_app.models import Run
from tests.e2e.test_seed_004_paired_node_worker_lifecycle import (
    Wire,
    model_env,
    node_id_of,
    publish_workspace,
    wait_connected,
)
from tests.support import mock_openai as mock
from tests.support.clients import call_once, operator, paired_node
from tests.support.processes import start_node_host

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

HOST = {
    "protocolFeatures": ["node-worker-supervisor-v6"],
    "workerHost": {"enabled": True, "capacity": {"total": 1, "available": 1}, "capturedExecPolicy": True},
}


async def dispatched(gateway, node_host, published: Path, suffix: str):
    client = operator(gateway)
    await client.connect()
    wire = Wire(client, published)
    node_id = node_id_of(node_host)
    await wait_connected(wire, node_id)
    key = await wire.create_session(suffix)
    await wire.dispatch_node_session(key, node_id)
    return client, wire, key


def test_a_node_turn_streams_deltas_before_it_ends(placed, mock_openai):
    gateway, node_host, published = placed
    text = "one two three four five six"
    mock_openai.script(mock.slow(text, delay_s=0.2))

    async def scenario():
        client, wire, key = await dispatched(gateway, node_host, published, "streaming")
        try:
            run_id = await wire.start_turn(key, "STREAM")
            deltas, final = [], None
            while final is None:
                frame = await client.next_event("chat", timeout=30, predicate=lambda f: f["payload"]["runId"] == run_id)
                if frame["payload"]["state"] == "delta":
                    deltas.append(frame["payload"]["message"]["content"][0]["text"])
                elif frame["payload"]["state"] == "final":
                    final = frame["payload"]
            waited = await wire.wait_for_turn(run_id)
            return deltas, final, waited
        finally:
            await client.close()

    deltas, final, waited = asyncio.run(scenario())
    assert waited["status"] == "ok"
    assert final["message"]["content"][0]["text"] == text
    assert len(deltas) >= 2, deltas  # it streamed, it did not arrive in one piece at the end
    assert all(text.startswith(partial) for partial in deltas)
    # The model was asked by the gateway (its key), never by the node.
    assert all(headers.get("authorization") == "Bearer sk-test" for headers in mock_openai.request_headers)


def test_a_reply_the_node_sends_whole_in_its_result_still_reaches_operators_as_a_delta_then_final(placed):
    """The node host sends no progress for what arrives in the window its turn ends in (the default
    mock answers at once): the gateway emits that text from the result, as a local turn would."""
    gateway, node_host, published = placed

    async def scenario():
        client, wire, key = await dispatched(gateway, node_host, published, "whole")
        try:
            run_id = await wire.start_turn(key, "short and sweet")
            states, texts = [], []
            while "final" not in states:
                frame = await client.next_event("chat", timeout=30, predicate=lambda f: f["payload"]["runId"] == run_id)
                states.append(frame["payload"]["state"])
                texts.append(frame["payload"]["message"]["content"][0]["text"])
            return states, texts, await wire.wait_for_turn(run_id)
        finally:
            await client.close()

    states, texts, waited = asyncio.run(scenario())
    assert waited["status"] == "ok"
    assert states[-2:] == ["delta", "final"]
    assert texts[-1] and texts[-2] == texts[-1]


def test_an_abort_stops_the_worker_on_the_node(placed, mock_openai):
    """The run ends ``aborted`` and its slot is free for the next turn."""
    gateway, node_host, published = placed
    mock_openai.hold("ABORT-ME")

    async def scenario():
        client, wire, key = await dispatched(gateway, node_host, published, "abort")
        try:
            run_id = await wire.start_turn(key, "ABORT-ME")
            deadline = asyncio.get_running_loop().time() + 30
            while "ABORT-ME" not in mock_openai.held():
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            aborted = await client.request("chat.abort", {"sessionKey": key, "runId": run_id})
            waited = await wire.wait_for_turn(run_id)
            # The slot is free again: the next turn runs (capacity 1).
            await wire.expect_successful_turn(key, "AFTER-ABORT")
            return aborted, waited
        finally:
            await client.close()

    aborted, waited = asyncio.run(scenario())
    assert aborted["aborted"] is True
    assert waited["status"] != "ok"
    # Stopped on the node: by worker.cancel.v1, or — whichever comes first — by the inference proxy,
    # which sees the abort too and ends the model call the worker is waiting on.
    assert Run.objects.get(run_id=aborted["runIds"][0]).status == "aborted"
    assert "ABORT-ME" not in mock_openai.held()  # the held model call was hung up on


def test_a_model_failure_is_the_turns_error_and_the_placement_stays_active(placed, mock_openai):
    gateway, node_host, published = placed
    mock_openai.script(mock.error(429, "slow down"))

    async def scenario():
        client, wire, key = await dispatched(gateway, node_host, published, "model-failure")
        try:
            run_id = await wire.start_turn(key, "FAILS")
            waited = await wire.wait_for_turn(run_id)
            placement = await wire.describe_placement(key)
            await wire.expect_successful_turn(key, "WORKS-AGAIN")
            return waited, placement
        finally:
            await client.close()

    waited, placement = asyncio.run(scenario())
    assert waited["status"] == "error"
    assert "429" in waited["error"] or "rate" in waited["error"].lower(), waited
    assert "sk-test" not in str(waited)
    assert placement["state"] == "active"


def test_an_abort_reaches_the_node_as_a_cancel_and_keeps_the_partial_reply(gateway_factory):
    """The gateway's own path, alone: the node (a peer driven by the test) streams part of a reply and
    then waits; chat.abort makes the gateway send ``worker.cancel.v1``, and the node's ``aborted`` answer
    ends the run with the partial text in the transcript."""
    gateway = gateway_factory()
    cancelled = asyncio.Event()
    launched = asyncio.Event()
    prepared: list[str] = []

    async def node_commands(command: str, params):
        if command == "worker.workspace.retain.v1":
            return {"applied": True, "deleted": {"environments": [], "bundles": []}, "hasMore": False,
                    "bundleStatus": "installed"}  # fmt: skip
        if command == "worker.bundle.install.v1":
            return {"bundleHash": params["bundleHash"], "openclawVersion": params["openclawVersion"],
                    "protocolFeatures": ["node-worker-supervisor-v6"], "installKind": "existing"}  # fmt: skip
        if command == "worker.workspace.prepare.v1":
            prepared.append(params["environmentId"])
            return {"status": "ready", "manifestRef": params["manifestRef"], "remoteWorkspaceDir": "/node/ws"}
        if command == "worker.status.v1":
            return {"capacity": {"total": 1, "available": 1, "reclaimableIdle": 0}, "running": [],
                    "environments": prepared}  # fmt: skip
        if command == "worker.launch.v1":
            await current_invoke.get().progress({"kind": "delta", "delta": "half a ", "text": "half a "})
            launched.set()
            await cancelled.wait()
            return {"status": "aborted", "text": "half a "}
        if command == "worker.cancel.v1":
            cancelled.set()
            return {"cancelled": True}
        if command == "worker.environment.stop.v1":
            return {"stopped": True, "environmentIds": []}
        raise AssertionError(f"unexpected command {command}")

    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        worker = await paired_node(
            gateway, admin, commands=list(NODE_HOST_COMMANDS), caps=list(NODE_HOST_CAPS), invoke_handler=node_commands
        )
        await worker.request("node.runnerInventory.update", HOST)
        await admin.request("sessions.create", {"key": "cancel-me"})
        await admin.request("sessions.dispatch", {"key": "cancel-me", "deviceId": worker.device_id}, timeout=60)
        started = await admin.request(
            "chat.send", {"sessionKey": "cancel-me", "message": "go", "idempotencyKey": "cancel-run"}
        )
        await asyncio.wait_for(launched.wait(), 30)
        await admin.request("chat.abort", {"sessionKey": "cancel-me", "runId": started["runId"]})
        waited = await admin.request("agent.wait", {"runId": started["runId"], "timeoutMs": 30_000}, timeout=35)
        history = await admin.request("chat.history", {"sessionKey": "cancel-me"})
        await worker.close()
        await admin.close()
        return waited, history

    waited, history = asyncio.run(scenario())
    assert cancelled.is_set()
    assert Run.objects.get(run_id="cancel-run").status == "aborted"
    assert waited["status"] != "ok"
    assistant = [m for m in history["messages"] if m["role"] == "assistant"]
    assert [(m["content"][0]["text"], m["stopReason"]) for m in assistant] == [("half a ", "aborted")]


def test_more_node_turns_at_once_than_the_loops_default_executor_has_threads_all_end(
    gateway_factory, mock_openai, tmp_path
):
    """Eight turns on one node, their model calls held past a liveness check of their launches: each turn's task
    waits on the loop, whose checks and model streams need threads of their own (gateway.background). On two cores
    asyncio's default executor has six, and before the task pool the eight tasks filled it and waited for ever."""
    turns = 8
    workspace_root = tmp_path / "allowed"
    workspace_root.mkdir()
    published = publish_workspace(workspace_root)
    gateway = gateway_factory(extra_env={**model_env(mock_openai, workspace_root), "OPENCLAW_TASK_MODE": "inprocess"})
    node_host = start_node_host(gateway, capacity=turns, capacity_wait_ms=500)
    call_once(gateway, "node.pair.approve", {"requestId": node_host.pairing_request()})
    mock_openai.hold("HELD")

    async def scenario() -> list[str]:
        client = operator(gateway)
        await client.connect()
        wire = Wire(client, published)
        try:
            await wait_connected(wire, node_id_of(node_host))
            keys = [await wire.create_session(f"many-{index}") for index in range(turns)]
            for key in keys:
                await wire.dispatch_node_session(key, node_id_of(node_host))
            run_ids = [await wire.start_turn(key, f"HELD {index}") for index, key in enumerate(keys)]
            while len(mock_openai.requests) < turns:  # every turn is waiting on its model
                await asyncio.sleep(0.05)
            await asyncio.sleep(LIVENESS_CHECK_S + 1)
            mock_openai.release()
            return [(await wire.wait_for_turn(run_id))["status"] for run_id in run_ids]
        finally:
            mock_openai.release()
            await client.close()
            node_host.stop()
            node_host.remove_state()

    assert asyncio.run(scenario()) == ["ok"] * turns
