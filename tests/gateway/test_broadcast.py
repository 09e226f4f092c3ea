"""Broadcast events fanned out in-process: one channel-layer message per process, gated and stamped
per connection exactly as a copy that came through the channel layer."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

import pytest
from autobahn.exception import Disconnected
from channels.layers import InMemoryChannelLayer

from devices_app import events as device_events
from gateway import broadcast, consumers, events, lifecycle, state
from gateway import scopes as sc
from gateway.consumers import GatewayConsumer
from gateway.context import RpcContext
from gateway.ports import connection_authority
from gateway.protocol import EncodedEvent
from gateway.registry import registry
from gateway.visibility import event_visible


class Transport:
    """Stands for Daphne: records the frames a consumer sent and the closes it asked for."""

    def __init__(self, consumer: GatewayConsumer, *, send_fails: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.closed: list[tuple[int | None, str | None]] = []

        async def send(text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False):
            if send_fails:
                raise RuntimeError("transport refused the frame")
            self.sent.append(json.loads(text_data))

        async def close_socket(code: int | None = None, reason: str | None = None):
            self.closed.append((code, reason))

        consumer.send = send
        consumer.close = close_socket


def _open(
    role: str = sc.ROLE_OPERATOR, scopes: list[str] | None = None, **transport
) -> tuple[GatewayConsumer, Transport]:
    consumer = GatewayConsumer()
    consumer.phase = "open"
    consumer.seq = 0
    consumer.conn_id = f"conn-{id(consumer)}"
    consumer.ctx = RpcContext(
        conn_id=consumer.conn_id,
        channel_name=f"inmemory!{consumer.conn_id}",
        role=role,
        scopes=[sc.ADMIN] if scopes is None else scopes,
        auth_method="token",
        client_id="test",
        client_mode="test",
    )
    return consumer, Transport(consumer, **transport)


def _message(event: str, payload: Any, state_version: dict | None = None) -> dict[str, Any]:
    return events.broadcast_message(event, payload, state_version=state_version)


# --- the fan-out ------------------------------------------------------------------------------


def test_each_connection_gets_what_its_role_and_scopes_allow_exactly_as_through_the_channel_layer():
    admin, admin_wire = _open(scopes=[sc.ADMIN])
    reader, reader_wire = _open(scopes=[sc.READ])
    node, node_wire = _open(role=sc.ROLE_NODE, scopes=[])
    connections = [admin, reader, node]
    sent = [
        _message("presence", {"presence": [{"host": "a"}]}, {"presence": 3, "health": 1}),
        _message(device_events.EVENT_NODE_PAIR_REQUESTED, {"requestId": "r1"}),
        _message("no.such.event", {}),
    ]

    async def scenario():
        for message in sent:
            assert await broadcast.fan_out(message, connections) == 3

    asyncio.run(scenario())

    for consumer, wire in ((admin, admin_wire), (reader, reader_wire), (node, node_wire)):
        expected = [
            message["event"]
            for message in sent
            if event_visible(
                registry.events.get(message["event"]),
                role=consumer.ctx.role,
                scopes=consumer.ctx.scopes,
                subscriptions=consumer.ctx.subscriptions,
            )
        ]
        assert [frame["event"] for frame in wire.sent] == expected
    # Presence reaches every authenticated connection, nodes included; pairing only the pairing scope.
    assert [frame["event"] for frame in node_wire.sent] == ["presence"]
    assert [frame["event"] for frame in admin_wire.sent] == ["presence", "node.pair.requested"]
    assert node_wire.sent[0] == {
        "type": "event",
        "event": "presence",
        "payload": {"presence": [{"host": "a"}]},
        "stateVersion": {"presence": 3, "health": 1},
        "seq": 1,
    }


def test_seq_stays_contiguous_across_ticks_broadcasts_and_per_connection_events():
    consumer, wire = _open()

    async def scenario():
        await consumer.send_encoded_event(EncodedEvent.of("tick", {"ts": 1}))
        await broadcast.fan_out(_message("presence", {"presence": []}), [consumer])
        await consumer.gateway_event(_message("presence", {"presence": []}))  # a copy through the layer
        await consumer.send_event("shutdown", {"reason": "x"})
        await broadcast.fan_out(_message(device_events.EVENT_DEVICE_PAIR_RESOLVED, {"requestId": "r"}), [consumer])

    asyncio.run(scenario())
    assert [frame["seq"] for frame in wire.sent] == [1, 2, 3, 4, 5]
    # The encoded-once frame is the frame send_event builds, field for field.
    assert wire.sent[1] == {k: v for k, v in wire.sent[2].items() if k != "seq"} | {"seq": 2}


def test_a_connection_that_closed_during_the_fan_out_is_skipped_and_the_others_still_get_the_event():
    first, first_wire = _open()
    closing, closing_wire = _open()
    last, last_wire = _open()

    async def send_then_close_the_next(text_data: str | None = None, **_: Any) -> None:
        first_wire.sent.append(json.loads(text_data))
        closing.phase = "closed"  # its socket went away while the fan-out was at the first connection

    first.send = send_then_close_the_next
    asyncio.run(broadcast.fan_out(_message("presence", {"presence": []}), [first, closing, last]))

    assert [frame["seq"] for frame in first_wire.sent] == [1]
    assert closing_wire.sent == [] and closing.seq == 0
    assert [frame["seq"] for frame in last_wire.sent] == [1]


def test_a_connection_that_fails_is_logged_and_the_others_still_get_the_event(caplog):
    refusing, refusing_wire = _open(send_fails=True)
    broken, _ = _open()
    healthy, healthy_wire = _open()

    async def explode(encoded: EncodedEvent) -> None:
        raise RuntimeError("consumer state is broken")

    broken.send_broadcast = explode
    with caplog.at_level(logging.ERROR):
        asyncio.run(broadcast.fan_out(_message("presence", {"presence": []}), [refusing, broken, healthy]))

    # A transport that refuses a frame closes that connection with a reason, as for any frame.
    [(code, reason)] = refusing_wire.closed
    assert code == 1011 and reason.startswith("internal error; reference ")
    assert refusing.phase == "closed"
    assert any("failed to deliver presence to a local connection" in r.getMessage() for r in caplog.records)
    assert [frame["event"] for frame in healthy_wire.sent] == ["presence"]


def test_an_event_that_cannot_be_encoded_closes_each_connection_that_would_receive_it(caplog):
    operator, operator_wire = _open()
    node, node_wire = _open(role=sc.ROLE_NODE, scopes=[])
    with caplog.at_level(logging.ERROR):
        asyncio.run(
            broadcast.fan_out(_message(device_events.EVENT_NODE_PAIR_REQUESTED, {"x": "\udfff"}), [operator, node])
        )

    assert operator_wire.sent == []
    [(code, _reason)] = operator_wire.closed
    assert code == 1011 and operator.phase == "closed"
    assert node_wire.closed == [] and node.phase == "open"  # the event was never for it


def test_encoded_event_splices_seq_into_valid_json():
    encoded = EncodedEvent.of("presence", {"presence": [{"host": "é😀"}]}, state_version={"presence": 1, "health": 0})
    assert json.loads(encoded.frame_text(7)) == {
        "type": "event",
        "event": "presence",
        "payload": {"presence": [{"host": "é😀"}]},
        "stateVersion": {"presence": 1, "health": 0},
        "seq": 7,
    }
    assert EncodedEvent.of("tick", {"x": float("nan")}).body is None


# --- the consumer's channel: no database hop before a message ------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        _message("presence", {"presence": []}),
        events.close_message(4001, "device removed"),
        {"type": "gateway.invoke.progress", "id": "i1"},
        {"type": "gateway.invoke.request", "id": "i1"},
        {"type": "websocket.receive", "text": "{}"},
    ],
)
def test_no_message_waits_for_a_stale_connection_hop_through_the_database_thread(monkeypatch, message):
    """Every database hop of the consumer is a ``database_sync_to_async`` call, which closes stale
    connections itself; channels' extra hop before each frame and message would queue it there."""
    hops: list[str] = []

    async def close_old_connections() -> None:
        hops.append("close-old-connections")

    async def handled(_message: dict) -> None:
        hops.append("handled")

    monkeypatch.setattr("channels.consumer.aclose_old_connections", close_old_connections)
    consumer, _ = _open()
    for handler in (
        "gateway_event",
        "gateway_close",
        "gateway_invoke_progress",
        "gateway_invoke_request",
        "websocket_receive",
    ):
        setattr(consumer, handler, handled)
    asyncio.run(consumer.dispatch(message))

    assert hops == ["handled"]


def test_a_message_of_no_known_type_is_refused_as_channels_refuses_it():
    consumer, _ = _open()
    with pytest.raises(ValueError, match=r"No handler for message type gateway\.unknown"):
        asyncio.run(consumer.dispatch({"type": "gateway.unknown"}))


# --- cleanup: the connection is unregistered whatever the channel layer does -------------------


class FailingLayer:
    async def group_discard(self, group: str, channel: str) -> None:
        raise ConnectionError("Too many connections")


def _registered_consumer(monkeypatch) -> tuple[GatewayConsumer, list[str], list[Any]]:
    unregistered: list[str] = []
    presence: list[Any] = []

    def connection_unregister(*, conn_id: str) -> bool:
        unregistered.append(conn_id)
        return True

    monkeypatch.setattr(connection_authority(), "connection_unregister", connection_unregister)
    monkeypatch.setattr(consumers, "presence_changed", presence.append)
    consumer, _ = _open()
    consumer.cleaned_up = False
    consumer.request_tasks = {}
    consumer.channel_layer = FailingLayer()
    consumer.ctx.subscriptions.add("sessions")
    return consumer, unregistered, presence


def test_a_channel_layer_error_during_cleanup_still_unregisters_the_connection(monkeypatch, caplog):
    consumer, unregistered, presence = _registered_consumer(monkeypatch)
    state.local_connections.add(consumer)
    with caplog.at_level(logging.ERROR):
        asyncio.run(consumer._cleanup())

    assert unregistered == [consumer.conn_id]
    assert presence == [None]
    assert consumer not in list(state.local_connections)
    assert any("failed to leave gateway.sub.sessions" in r.getMessage() for r in caplog.records)


def test_a_failure_failing_pending_invokes_still_unregisters_the_connection(monkeypatch, caplog):
    consumer, unregistered, presence = _registered_consumer(monkeypatch)

    async def fail_pending(ctx: RpcContext) -> None:
        raise ConnectionError("Too many connections")

    monkeypatch.setattr(consumers.invoke, "fail_pending", fail_pending)
    with caplog.at_level(logging.ERROR):
        asyncio.run(consumer._cleanup())

    assert unregistered == [consumer.conn_id]
    assert presence == [None]
    assert any("failed to fail its pending invokes" in r.getMessage() for r in caplog.records)


# --- the process channel ------------------------------------------------------------------------


def test_the_process_channel_joins_the_process_and_broadcast_groups_once(monkeypatch):
    layer = InMemoryChannelLayer()
    monkeypatch.setattr(lifecycle, "get_channel_layer", lambda: layer)

    async def scenario():
        first, second = await asyncio.gather(
            lifecycle.ensure_broadcast_subscribed(), lifecycle.ensure_broadcast_subscribed()
        )
        await layer.group_send(events.BROADCAST_GROUP, _message("presence", {"presence": []}))
        await layer.group_send(state.PROCESS_GROUP, {"type": "runs.finished", "runId": "r"})
        return first, second, [await layer.receive(first), await layer.receive(first)]

    first, second, received = asyncio.run(scenario())
    assert first == second
    assert [message["type"] for message in received] == ["gateway.event", "runs.finished"]
    assert set(layer.groups) == {events.BROADCAST_GROUP, state.PROCESS_GROUP}
    assert all(list(members) == [first] for members in layer.groups.values())


def test_a_failed_subscription_is_retried_by_the_next_connection(monkeypatch):
    layer = InMemoryChannelLayer()
    monkeypatch.setattr(lifecycle, "get_channel_layer", lambda: layer)
    group_add = layer.group_add
    attempts: list[str] = []

    async def flaky_group_add(group: str, channel: str) -> None:
        attempts.append(group)
        if len(attempts) == 1:
            raise ConnectionError("Redis went away")
        await group_add(group, channel)

    layer.group_add = flaky_group_add

    async def scenario():
        with pytest.raises(ConnectionError):
            await lifecycle.ensure_broadcast_subscribed()
        return await lifecycle.ensure_broadcast_subscribed()

    channel = asyncio.run(scenario())
    assert set(layer.groups) == {events.BROADCAST_GROUP, state.PROCESS_GROUP}
    assert channel in layer.groups[events.BROADCAST_GROUP]


def test_the_process_listener_fans_broadcasts_out_to_the_local_connections(monkeypatch):
    layer = InMemoryChannelLayer()
    monkeypatch.setattr(lifecycle, "get_channel_layer", lambda: layer)
    consumer, wire = _open(role=sc.ROLE_NODE, scopes=[])
    delivered = asyncio.Event()
    send_broadcast = consumer.send_broadcast

    async def record(encoded: EncodedEvent) -> None:
        await send_broadcast(encoded)
        delivered.set()

    consumer.send_broadcast = record

    async def scenario():
        listener = asyncio.create_task(lifecycle._process_listener())
        try:
            await lifecycle.ensure_broadcast_subscribed()
            await layer.group_send(events.BROADCAST_GROUP, _message("presence", {"presence": []}))
            await asyncio.wait_for(delivered.wait(), 10)
        finally:
            listener.cancel()

    state.local_connections.add(consumer)
    try:
        asyncio.run(scenario())
    finally:
        state.local_connections.discard(consumer)
    assert [(frame["event"], frame["seq"]) for frame in wire.sent] == [("presence", 1)]


def test_a_socket_that_closed_before_its_disconnect_arrived_is_not_an_error(caplog):
    consumer, wire = _open()

    async def gone(text_data: str | None = None, **_: Any) -> None:
        raise Disconnected("Attempt to send on a closed protocol")

    consumer.send = gone
    with caplog.at_level(logging.ERROR):
        asyncio.run(broadcast.fan_out(_message("presence", {"presence": []}), [consumer]))

    assert wire.closed == [] and consumer.phase == "closed"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# --- ticks do not wait for the heartbeat ---------------------------------------------------------


class TickCounter:
    def __init__(self, wanted: int) -> None:
        self.ticks = 0
        self.wanted = wanted
        self.enough = asyncio.Event()

    async def send_encoded_event(self, encoded: EncodedEvent) -> None:
        if encoded.event == "tick":
            self.ticks += 1
            if self.ticks >= self.wanted:
                self.enough.set()


def test_ticks_keep_going_while_the_heartbeat_waits_for_the_database(monkeypatch, settings):
    settings.OPENCLAW_GATEWAY = {
        **settings.OPENCLAW_GATEWAY,
        "TICK_INTERVAL_MS": 20,
        "PROCESS_HEARTBEAT_INTERVAL_MS": 10,
        "SWEEP_INTERVAL_MS": 3_600_000,
    }
    database_free = threading.Event()
    heartbeats: list[str] = []

    def stuck_heartbeat(*, boot_id: str) -> None:
        heartbeats.append(boot_id)
        database_free.wait(30)

    monkeypatch.setattr(lifecycle.connection_services, "process_heartbeat", stuck_heartbeat)
    counter = TickCounter(wanted=5)

    async def scenario():
        loop = asyncio.create_task(lifecycle._background_loop())
        try:
            await asyncio.wait_for(counter.enough.wait(), 20)
        finally:
            database_free.set()
            loop.cancel()

    state.local_connections.add(counter)
    try:
        asyncio.run(scenario())
    finally:
        state.local_connections.discard(counter)
    assert counter.ticks >= 5
    assert heartbeats == [state.BOOT_ID]  # one in flight at a time, however many rounds passed
