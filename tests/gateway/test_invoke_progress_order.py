"""A node's progress and result for one invoke leave the gateway in the order the node sent them.

The node host sends an invoke's result right after its last progress, without waiting for the
gateway's answers, and the gateway answers a connection's frames concurrently: the result must
still reach the caller after the progress sent before it, however slow a progress forward is.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway import invoke
from gateway.context import RpcContext
from gateway.schemas import NodeInvokeResultParams

NODE = "n" * 64


class RecordingLayer:
    """A channel layer whose sends of progress take ``progress_delays`` seconds each, in turn."""

    def __init__(self, progress_delays: list[float]):
        self.progress_delays = list(progress_delays)
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        if message["type"] == invoke.PROGRESS_MESSAGE:
            await asyncio.sleep(self.progress_delays.pop(0))
        self.sent.append((channel, message))


@pytest.fixture
def layer(monkeypatch):
    recording = RecordingLayer([0.05, 0.0, 0.02])
    monkeypatch.setattr(invoke, "get_channel_layer", lambda: recording)
    return recording


def node_context() -> RpcContext:
    ctx = RpcContext(
        conn_id="conn",
        channel_name="node-channel",
        role="node",
        scopes=[],
        auth_method="device-token",
        client_id="node-host",
        client_mode="node",
        node_id=NODE,
    )
    ctx.pending_invokes["invoke-1"] = ("reply-channel", "worker.launch.v1")
    return ctx


def test_the_result_waits_for_the_progress_forwarded_before_it(layer):
    async def scenario() -> None:
        ctx = node_context()
        # As the consumer starts them: one task per frame, in arrival order.
        tasks = [
            asyncio.ensure_future(invoke.forward_progress(ctx, {"id": "invoke-1", "seq": seq, "data": {"n": seq}}))
            for seq in (1, 2, 3)
        ]
        tasks.append(
            asyncio.ensure_future(
                invoke.node_invoke_result(ctx, NodeInvokeResultParams(id="invoke-1", nodeId=NODE, ok=True, payload={}))
            )
        )
        answers = await asyncio.gather(*tasks)
        assert answers == [{"handled": True}] * 3 + [{"ok": True}]
        assert ctx.progress_forwards == {}  # nothing left behind per invoke

    asyncio.run(scenario())

    assert [(message["type"], message.get("seq")) for _channel, message in layer.sent] == [
        (invoke.PROGRESS_MESSAGE, 1),
        (invoke.PROGRESS_MESSAGE, 2),
        (invoke.PROGRESS_MESSAGE, 3),
        (invoke.RESULT_MESSAGE, None),
    ]
    assert {channel for channel, _message in layer.sent} == {"reply-channel"}


def test_a_failed_progress_forward_does_not_hold_back_the_result(monkeypatch):
    class FailingLayer(RecordingLayer):
        async def send(self, channel: str, message: dict[str, Any]) -> None:
            if message["type"] == invoke.PROGRESS_MESSAGE:
                raise ConnectionError("layer down")
            self.sent.append((channel, message))

    failing = FailingLayer([])
    monkeypatch.setattr(invoke, "get_channel_layer", lambda: failing)

    async def scenario() -> list[Any]:
        ctx = node_context()
        progress = asyncio.ensure_future(invoke.forward_progress(ctx, {"id": "invoke-1", "seq": 1, "data": {}}))
        result = asyncio.ensure_future(
            invoke.node_invoke_result(ctx, NodeInvokeResultParams(id="invoke-1", nodeId=NODE, ok=True, payload={}))
        )
        return await asyncio.gather(progress, result, return_exceptions=True)

    progress_outcome, result_outcome = asyncio.run(scenario())

    assert isinstance(progress_outcome, ConnectionError)  # that request's own answer says so
    assert result_outcome == {"ok": True}
    assert [message["type"] for _channel, message in failing.sent] == [invoke.RESULT_MESSAGE]


def test_progress_after_the_result_is_acknowledged_and_ignored(layer):
    async def scenario() -> dict[str, Any]:
        ctx = node_context()
        await invoke.node_invoke_result(ctx, NodeInvokeResultParams(id="invoke-1", nodeId=NODE, ok=True, payload={}))
        return await invoke.forward_progress(ctx, {"id": "invoke-1", "seq": 1, "data": {}})

    assert asyncio.run(scenario()) == {"handled": False, "reason": "unknown-invoke"}
    assert [message["type"] for _channel, message in layer.sent] == [invoke.RESULT_MESSAGE]
