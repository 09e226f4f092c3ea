"""Invoke progress in :class:`GatewayClient`: ``node.invoke.progress`` frames go out in ``seq`` order, all of
them before the invoke's result, and a connection that fails under them never breaks the handler."""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any

import websockets

from openclaw_client.client import ClientOptions, GatewayClient, InvokeContext, current_invoke


class FakeSocket:
    """Stands in for the gateway's socket: records frames, answers requests after ``delay`` seconds."""

    def __init__(self, client: GatewayClient, *, delay: float = 0.02, refuse_events: bool = False):
        self.client = client
        self.delay = delay
        self.refuse_events = refuse_events
        self.frames: list[dict[str, Any]] = []
        self.answered: list[str] = []
        self.unanswered_at_result: list[str] | None = None
        self.broken = False

    async def send(self, data: str) -> None:
        if self.broken:
            raise websockets.ConnectionClosed(None, None)
        frame = json.loads(data)
        self.frames.append(frame)
        if frame.get("method") == "node.invoke.result":
            sent = [f["id"] for f in self.frames if f.get("method") == "node.event"]
            self.unanswered_at_result = [request_id for request_id in sent if request_id not in self.answered]
        asyncio.get_running_loop().call_later(self.delay, self._answer, frame)

    def _answer(self, frame: dict[str, Any]) -> None:
        future = self.client._pending.pop(frame["id"], None)
        self.answered.append(frame["id"])
        if future is not None and not future.done():
            ok = not (self.refuse_events and frame.get("method") == "node.event")
            error = None if ok else {"code": "INVALID_REQUEST", "message": "refused"}
            future.set_result({"type": "res", "id": frame["id"], "ok": ok, "payload": {}, "error": error})


def connected_client(**socket_options: Any) -> tuple[GatewayClient, FakeSocket]:
    async def no_handler(command: str, params: Any) -> Any:
        return None

    client = GatewayClient(ClientOptions(url="ws://127.0.0.1:1", role="node"), invoke_handler=no_handler)
    socket = FakeSocket(client, **socket_options)
    client._ws = socket  # type: ignore[assignment]
    return client, socket


def invoke_request(invoke_id: str = "invoke-1") -> dict[str, Any]:
    return {"id": invoke_id, "nodeId": "node-1", "command": "worker.launch.v1", "paramsJSON": json.dumps({"a": 1})}


def test_progress_goes_out_in_seq_order_and_before_the_result():
    async def scenario():
        client, socket = connected_client()
        seen: list[Any] = []

        async def handler(command: str, params: Any) -> dict:
            invoke = current_invoke.get()
            seen.append((command, params, invoke.invoke_id, invoke.node_id))
            for index in range(3):
                await invoke.progress({"kind": "delta", "n": index})
            return {"status": "ok"}

        client.invoke_handler = handler
        await client._answer_invoke(invoke_request())
        return seen, socket, current_invoke.get()

    seen, socket, outside = asyncio.run(scenario())
    assert seen == [("worker.launch.v1", {"a": 1}, "invoke-1", "node-1")]
    assert outside is None  # the invoke is the handler's task's, not the caller's
    methods = [frame["method"] for frame in socket.frames]
    assert methods == ["node.event", "node.event", "node.event", "node.invoke.result"]
    assert [frame["params"] for frame in socket.frames[:3]] == [
        {"event": "node.invoke.progress", "payload": {"id": "invoke-1", "seq": seq, "data": {"kind": "delta", "n": n}}}
        for seq, n in ((1, 0), (2, 1), (3, 2))
    ]
    # Nor does the result wait for the gateway's answers: the gateway forwards it after the reports
    # that arrived before it.
    assert socket.unanswered_at_result == [frame["id"] for frame in socket.frames[:3]]
    assert socket.frames[3]["params"] == {
        "id": "invoke-1",
        "nodeId": "node-1",
        "ok": True,
        "payloadJSON": '{"status": "ok"}',
    }


def test_reporting_does_not_wait_a_round_trip_per_report():
    async def scenario():
        client, socket = connected_client(delay=0.5)

        async def handler(command: str, params: Any) -> dict:
            started = asyncio.get_running_loop().time()
            for index in range(10):
                await current_invoke.get().progress({"n": index})
            return {"elapsed": asyncio.get_running_loop().time() - started}

        client.invoke_handler = handler
        await client._answer_invoke(invoke_request())
        return json.loads(socket.frames[-1]["params"]["payloadJSON"])["elapsed"]

    assert asyncio.run(scenario()) < 0.25


def test_concurrent_reporters_still_number_in_send_order():
    async def scenario():
        client, socket = connected_client()

        async def handler(command: str, params: Any) -> dict:
            invoke = current_invoke.get()
            await asyncio.gather(*(invoke.progress({"n": index}) for index in range(20)))
            return {}

        client.invoke_handler = handler
        await client._answer_invoke(invoke_request())
        return [frame["params"]["payload"]["seq"] for frame in socket.frames if frame["method"] == "node.event"]

    assert asyncio.run(scenario()) == list(range(1, 21))


def test_a_closed_connection_under_progress_does_not_break_the_handler_or_leak_errors():
    async def scenario():
        client, socket = connected_client()
        errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: errors.append(context))
        finished: list[str] = []

        async def handler(command: str, params: Any) -> dict:
            invoke = current_invoke.get()
            await invoke.progress({"n": 1})
            client._mark_closed(1006, "gone")  # the pending report's answer can never come
            socket.broken = True
            await invoke.progress({"n": 2})  # refused by the closed socket: swallowed
            finished.append("handler")
            return {}

        client.invoke_handler = handler
        await client._answer_invoke(invoke_request())  # the result cannot be sent either: swallowed too
        gc.collect()
        await asyncio.sleep(0.05)
        return finished, errors

    finished, errors = asyncio.run(scenario())
    assert finished == ["handler"]
    assert errors == []


def test_a_refused_report_is_logged_and_the_invoke_still_answers(caplog):
    async def scenario():
        client, socket = connected_client(refuse_events=True)

        async def handler(command: str, params: Any) -> dict:
            await current_invoke.get().progress({"n": 1})
            return {"done": True}

        client.invoke_handler = handler
        await client._answer_invoke(invoke_request())
        return socket

    socket = asyncio.run(scenario())
    assert socket.frames[-1]["method"] == "node.invoke.result" and socket.frames[-1]["params"]["ok"] is True
    assert "gateway refused progress of invoke invoke-1" in caplog.text


def test_an_invoke_context_without_a_sender_ignores_progress():
    async def scenario():
        invoke = InvokeContext("invoke-1", "node-1")
        await invoke.progress({"n": 1})
        return invoke.sent

    assert asyncio.run(scenario()) == 0
