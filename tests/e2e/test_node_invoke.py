"""node.invoke: operator → gateway → node.invoke.request → node.invoke.result → operator."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.intake import OFF_LOOP_FRAME_CHARS
from openclaw_client.client import GatewayError, NodeCommandError
from tests.support.clients import operator, paired_node

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


async def node_commands(command: str, params):
    if command == "echo":
        return {"echoed": params}
    if command == "fail":
        raise NodeCommandError("SYSTEM_RUN_DENIED", "denied by policy")
    if command == "sleep":
        await asyncio.sleep(params.get("seconds", 5))
        return {"slept": True}
    raise NodeCommandError("UNAVAILABLE", f"unknown command {command}")


async def _admin_and_node(server, **node_kwargs):
    admin = operator(server)
    await admin.connect()
    worker = await paired_node(server, admin, invoke_handler=node_commands, **node_kwargs)
    return admin, worker


def test_invoke_round_trip(gateway):
    async def scenario():
        admin, worker = await _admin_and_node(gateway)
        result = await admin.request(
            "node.invoke",
            {"nodeId": worker.device_id, "command": "echo", "params": {"x": [1, "two"]}, "idempotencyKey": "k1"},
        )
        request_event = await worker.next_event("node.invoke.request")
        await worker.close()
        await admin.close()
        return worker.device_id, result, request_event

    node_id, result, request_event = asyncio.run(scenario())
    assert result == {
        "ok": True,
        "nodeId": node_id,
        "command": "echo",
        "payload": {"echoed": {"x": [1, "two"]}},
        "payloadJSON": '{"echoed": {"x": [1, "two"]}}',
    }
    payload = request_event["payload"]
    assert "seq" not in request_event  # targeted events carry no seq
    assert payload["nodeId"] == node_id
    assert payload["command"] == "echo"
    assert payload["paramsJSON"] == '{"x": [1, "two"]}'
    assert payload["idempotencyKey"] == "k1"
    assert payload["timeoutMs"] == 30000


def test_a_result_bigger_than_a_small_frame_arrives_whole(gateway):
    """Its payloadJSON is decoded off the event loop (``intake.is_big``); what the operator gets is the same."""
    rows = [f"row {index} " + "x" * 90 for index in range(2000)]

    async def scenario():
        admin, worker = await _admin_and_node(gateway)
        params = {"nodeId": worker.device_id, "command": "echo", "params": {"rows": rows}, "idempotencyKey": "b"}
        result = await admin.request("node.invoke", params)
        await worker.close()
        await admin.close()
        return result

    result = asyncio.run(scenario())
    assert len(result["payloadJSON"]) > OFF_LOOP_FRAME_CHARS
    assert result["payload"] == {"echoed": {"rows": rows}} == json.loads(result["payloadJSON"])


def test_node_error_reaches_the_operator(gateway):
    async def scenario():
        admin, worker = await _admin_and_node(gateway)
        with pytest.raises(GatewayError) as failed:
            await admin.request("node.invoke", {"nodeId": worker.device_id, "command": "fail", "idempotencyKey": "k"})
        await worker.close()
        await admin.close()
        return failed.value

    failed = asyncio.run(scenario())
    assert failed.code == "UNAVAILABLE"
    assert failed.message == "denied by policy"
    assert failed.details == {"nodeError": {"code": "SYSTEM_RUN_DENIED", "message": "denied by policy"}}


def test_invoke_times_out_and_a_late_result_is_ignored(gateway):
    async def scenario():
        admin, worker = await _admin_and_node(gateway)
        with pytest.raises(GatewayError) as timed_out:
            await admin.request(
                "node.invoke",
                {
                    "nodeId": worker.device_id,
                    "command": "sleep",
                    "params": {"seconds": 1},
                    "timeoutMs": 200,
                    "idempotencyKey": "k",
                },
            )
        late = await worker.request(
            "node.invoke.result", {"id": "no-such-invoke", "nodeId": worker.device_id, "ok": True}
        )
        await asyncio.sleep(1.2)  # the node answers after the caller gave up
        still_fine = await admin.request(
            "node.invoke", {"nodeId": worker.device_id, "command": "echo", "params": 1, "idempotencyKey": "k2"}
        )
        await worker.close()
        await admin.close()
        return timed_out.value, late, still_fine

    timed_out, late, still_fine = asyncio.run(scenario())
    assert timed_out.code == "UNAVAILABLE"
    assert timed_out.message == "node invoke timed out"
    assert timed_out.details == {"nodeError": {"code": "TIMEOUT", "message": "node invoke timed out"}}
    assert late == {"ok": True, "ignored": True}
    assert still_fine["payload"] == {"echoed": 1}


def test_invoke_of_an_offline_node_is_unavailable(gateway):
    async def scenario():
        admin, worker = await _admin_and_node(gateway)
        await worker.close()
        await asyncio.sleep(0.2)
        with pytest.raises(GatewayError) as offline:
            await admin.request("node.invoke", {"nodeId": worker.device_id, "command": "echo", "idempotencyKey": "k"})
        with pytest.raises(GatewayError) as unknown:
            await admin.request("node.invoke", {"nodeId": "never-seen", "command": "echo", "idempotencyKey": "k"})
        await admin.close()
        return offline.value, unknown.value

    offline, unknown = asyncio.run(scenario())
    assert (offline.code, offline.message, offline.details) == (
        "UNAVAILABLE",
        "node not connected",
        {"code": "NOT_CONNECTED"},
    )
    assert unknown.message == "node not connected"


def test_node_disconnecting_mid_invoke_fails_the_call(gateway):
    async def scenario():
        admin, worker = await _admin_and_node(gateway)
        call = asyncio.create_task(
            admin.request(
                "node.invoke",
                {"nodeId": worker.device_id, "command": "sleep", "params": {"seconds": 30}, "idempotencyKey": "k"},
            )
        )
        await worker.next_event("node.invoke.request")
        await worker.close()
        with pytest.raises(GatewayError) as failed:
            await asyncio.wait_for(call, 10)
        await admin.close()
        return failed.value

    failed = asyncio.run(scenario())
    assert failed.code == "UNAVAILABLE"
    assert failed.message == "node disconnected (sleep)"
    assert failed.details["code"] == "NOT_CONNECTED"


def test_undeclared_or_unapproved_commands_are_refused(gateway):
    async def scenario():
        admin, worker = await _admin_and_node(gateway, commands=["echo"])
        with pytest.raises(GatewayError) as undeclared:
            await admin.request("node.invoke", {"nodeId": worker.device_id, "command": "sleep", "idempotencyKey": "k"})
        with pytest.raises(GatewayError) as blank:
            await admin.request("node.invoke", {"nodeId": " ", "command": "echo", "idempotencyKey": "k"})
        with pytest.raises(GatewayError) as no_key:
            await admin.request("node.invoke", {"nodeId": worker.device_id, "command": "echo"})
        await worker.close()
        # Reconnect declaring more than was approved: the extra command is not invocable.
        wider = await _reconnect(gateway, worker, commands=["echo", "sleep"])
        with pytest.raises(GatewayError) as unapproved:
            await admin.request("node.invoke", {"nodeId": worker.device_id, "command": "sleep", "idempotencyKey": "k"})
        await wider.close()
        await admin.close()
        return undeclared.value, blank.value, no_key.value, unapproved.value

    undeclared, blank, no_key, unapproved = asyncio.run(scenario())
    assert undeclared.code == "INVALID_REQUEST"
    assert undeclared.details == {"reason": "command not declared by node", "command": "sleep"}
    assert blank.message == "nodeId and command required"
    assert no_key.message == "invalid node.invoke params: at /idempotencyKey: must have required property"
    assert unapproved.details == {"reason": "command not declared by node", "command": "sleep"}


async def _reconnect(server, worker, *, commands):
    from tests.support.clients import node

    client = node(server, commands=commands, state_dir=worker.options.state_dir, invoke_handler=node_commands)
    await client.connect()
    return client


def test_a_node_cannot_answer_for_another_node(gateway):
    async def scenario():
        admin, worker = await _admin_and_node(gateway)
        with pytest.raises(GatewayError) as mismatch:
            await worker.request("node.invoke.result", {"id": "x", "nodeId": "someone-else", "ok": True})
        await worker.close()
        await admin.close()
        return mismatch.value

    mismatch = asyncio.run(scenario())
    assert (mismatch.code, mismatch.message) == ("INVALID_REQUEST", "nodeId mismatch")


def test_a_newer_connection_of_the_same_node_replaces_the_older(gateway):
    async def scenario():
        admin, worker = await _admin_and_node(gateway)
        newer = await _reconnect(gateway, worker, commands=["echo", "fail", "sleep"])
        await asyncio.wait_for(worker.closed.wait(), 10)
        result = await admin.request(
            "node.invoke", {"nodeId": worker.device_id, "command": "echo", "params": "via newer", "idempotencyKey": "k"}
        )
        nodes = await admin.request("node.list")
        await newer.close()
        await admin.close()
        return worker, result, nodes

    worker, result, nodes = asyncio.run(scenario())
    assert (worker.close_code, worker.close_reason) == (1008, "replaced by a newer connection")
    assert result["payload"] == {"echoed": "via newer"}
    assert [n["connected"] for n in nodes["nodes"]] == [True]


def test_node_events(gateway):
    async def scenario():
        admin, worker = await _admin_and_node(gateway)
        alive = await worker.request("node.event", {"event": "node.presence.alive", "payload": {"trigger": "manual"}})
        unknown = await worker.request("node.event", {"event": "something.else", "payloadJSON": "{}"})
        with pytest.raises(GatewayError) as bad:
            await worker.request("node.event", {"event": ""})
        await worker.close()
        await admin.close()
        return alive, unknown, bad.value

    alive, unknown, bad = asyncio.run(scenario())
    assert alive == {"ok": True, "event": "node.presence.alive", "handled": True, "reason": "persisted"}
    assert unknown == {"ok": True, "event": "something.else", "handled": False, "reason": "unknown-event"}
    assert bad.message.startswith("invalid node.event params: at /event:")


def test_a_retried_invoke_is_answered_from_the_first_outcome(gateway):
    async def scenario():
        admin, worker = await _admin_and_node(gateway)
        call = {"nodeId": worker.device_id, "command": "echo", "params": {"n": 1}, "idempotencyKey": "once"}
        first = await admin.request("node.invoke", call)
        second = await admin.request("node.invoke", {**call, "params": {"n": 2}})
        fresh = await admin.request("node.invoke", {**call, "idempotencyKey": "twice"})
        failing = {"nodeId": worker.device_id, "command": "fail", "idempotencyKey": "fails"}
        errors = []
        for _ in range(2):
            with pytest.raises(GatewayError) as failed:
                await admin.request("node.invoke", failing)
            errors.append(failed.value.shape)
        await asyncio.sleep(0.2)
        requests = []
        while not worker.events.empty():
            frame = worker.events.get_nowait()
            if frame["event"] == "node.invoke.request":
                requests.append(frame["payload"]["idempotencyKey"])
        await worker.close()
        await admin.close()
        return first, second, fresh, errors, requests

    first, second, fresh, errors, requests = asyncio.run(scenario())
    assert first == second
    assert second["payload"] == {"echoed": {"n": 1}}
    assert fresh["payload"] == {"echoed": {"n": 1}}
    assert errors[0] == errors[1]
    assert errors[0]["details"]["nodeError"]["code"] == "SYSTEM_RUN_DENIED"
    # The node ran each distinct key exactly once.
    assert requests == ["once", "twice", "fails"]


def test_a_duplicate_of_a_running_invoke_is_a_conflict(gateway):
    async def scenario():
        admin, worker = await _admin_and_node(gateway)
        call = {"nodeId": worker.device_id, "command": "sleep", "params": {"seconds": 1}, "idempotencyKey": "slow"}
        running = asyncio.create_task(admin.request("node.invoke", call))
        await worker.next_event("node.invoke.request")
        with pytest.raises(GatewayError) as duplicate:
            await admin.request("node.invoke", call)
        result = await running
        replayed = await admin.request("node.invoke", call)
        await worker.close()
        await admin.close()
        return duplicate.value, result, replayed

    duplicate, result, replayed = asyncio.run(scenario())
    assert duplicate.code == "INVALID_REQUEST"
    assert duplicate.message == "node.invoke with this idempotencyKey is still in flight"
    assert duplicate.details == {"code": "IDEMPOTENCY_IN_FLIGHT"}
    assert duplicate.retryable is True
    assert result == replayed
    assert result["payload"] == {"slept": True}


def test_an_invoke_that_never_reached_the_node_can_be_retried(gateway):
    async def scenario():
        admin, worker = await _admin_and_node(gateway)
        call = {
            "nodeId": worker.device_id,
            "command": "sleep",
            "params": {"seconds": 1},
            "timeoutMs": 100,
            "idempotencyKey": "retry-me",
        }
        with pytest.raises(GatewayError) as timed_out:
            await admin.request("node.invoke", call)
        await asyncio.sleep(1.1)
        retried = await admin.request("node.invoke", {**call, "timeoutMs": 5000})
        await worker.close()
        await admin.close()
        return timed_out.value, retried

    timed_out, retried = asyncio.run(scenario())
    assert timed_out.message == "node invoke timed out"
    assert retried["payload"] == {"slept": True}
