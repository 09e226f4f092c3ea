"""Writes and the slow-consumer limit: a frame goes to the kernel at once when nothing waits before it, what the
kernel does not take waits in Twisted's transport and the frames after it in the protocol, which counts them;
droppable events skipped past ``maxBufferedBytes`` held, anything else closing 1008 ``slow consumer``; and the
events marked droppable on their way from the publisher to the transport.

The connection is a real loopback TCP connection upgraded by Daphne (``tests/support/daphne_wire.py``) whose client
reads nothing until the test lets it: the kernel's buffers and Twisted's transport are the real ones.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from typing import Any

import pytest
from autobahn.exception import Disconnected
from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer
from twisted.internet import main
from twisted.python import failure

from gateway import broadcast, daphne_server, events, publisher
from gateway import scopes as sc
from gateway.consumers import GatewayConsumer
from gateway.context import RpcContext
from gateway.protocol import DROP_IF_SLOW_KEY, EncodedEvent
from tests.support.daphne_wire import open_wire, server_frames

LIMIT = 1000
FRAME_TEXT = "x" * 800
# A server frame of 800 bytes: 2 header bytes plus a 16-bit length.
FRAME_BYTES = 4 + len(FRAME_TEXT)
TEXT = 1
CLOSE = 8


@pytest.fixture
def wire(settings):
    wire = open_wire(max_buffered_bytes=LIMIT, settings=settings)
    yield wire
    wire.close()


def _send(protocol, *, droppable: bool = False, text: str = FRAME_TEXT) -> None:
    message: dict[str, Any] = {"type": "websocket.send", "text": text}
    if droppable:
        message[DROP_IF_SLOW_KEY] = True
    protocol.handle_reply(message)


def _numbered(n: int) -> str:
    return f"{n:08d}" + FRAME_TEXT[8:]


def _fill(wire) -> list[str]:
    """Numbered frames until the kernel stops taking them and Twisted's transport holds the rest of one."""
    texts: list[str] = []
    while not wire.protocol.transport_busy:
        assert len(texts) < 10_000, "the kernel never stopped taking frames"
        texts.append(_numbered(len(texts)))
        _send(wire.protocol, text=texts[-1])
    return texts


def _texts(frames: list[tuple[int, bytes]]) -> list[str]:
    return [payload.decode() for opcode, payload in frames if opcode == TEXT]


# --- writes ----------------------------------------------------------------------------------------


def test_the_protocol_takes_the_transports_producer_slot_from_the_http_channel(wire):
    assert wire.transport.producer is wire.protocol
    assert not wire.transport.streamingProducer  # a pull producer: called whenever the transport has sent it all


def test_a_connections_first_write_waits_for_the_reactor_as_twisted_may_still_hold_an_earlier_answer(wire):
    assert wire.first_write_waited


def test_a_frame_with_nothing_before_it_reaches_the_kernel_without_a_reactor_turn(wire):
    _send(wire.protocol, text="hello")
    assert server_frames(wire.arrived()) == [(TEXT, b"hello")]
    assert not wire.transport_waits_to_write()  # no writability registration to make and undo
    assert wire.protocol.held_bytes == 0


def test_what_the_kernel_does_not_take_waits_in_twisted_and_later_frames_wait_here_in_order(wire):
    texts = _fill(wire)
    assert wire.transport_waits_to_write()
    assert wire.protocol.held_bytes == 0

    texts += [_numbered(len(texts)), _numbered(len(texts) + 1)]
    _send(wire.protocol, text=texts[-2])
    _send(wire.protocol, text=texts[-1])
    assert wire.protocol.held_bytes == 2 * FRAME_BYTES
    assert wire.protocol.state == wire.protocol.STATE_OPEN

    assert _texts(server_frames(wire.deliver())) == texts
    assert wire.protocol.held_bytes == 0
    # Twisted said it had sent everything: the next frame goes at once again.
    _send(wire.protocol, text="again")
    assert server_frames(wire.arrived()) == [(TEXT, b"again")]


# --- the limit -------------------------------------------------------------------------------------


def test_at_the_limit_one_more_frame_is_still_held(wire):
    _fill(wire)
    _send(wire.protocol)
    _send(wire.protocol)  # LIMIT lies between one and two frames: the second still goes
    assert wire.protocol.held_bytes == 2 * FRAME_BYTES
    assert wire.protocol.state == wire.protocol.STATE_OPEN


def test_past_the_limit_a_droppable_event_is_skipped_and_the_connection_stays_open(wire, caplog):
    texts = _fill(wire)
    _send(wire.protocol)
    _send(wire.protocol)
    _send(wire.protocol, droppable=True)
    _send(wire.protocol, droppable=True)

    assert wire.protocol.held_bytes == 2 * FRAME_BYTES
    assert wire.protocol.state == wire.protocol.STATE_OPEN
    assert caplog.text.count("dropping droppable events") == 1  # once per slow spell, not per event

    # The client reads again: frames flow, droppable ones too.
    assert len(_texts(server_frames(wire.deliver()))) == len(texts) + 2  # the skipped ones never went
    _send(wire.protocol, droppable=True, text="droppable")
    assert server_frames(wire.arrived()) == [(TEXT, b"droppable")]  # written, not dropped
    assert wire.protocol.dropped_while_slow == 0


def test_past_the_limit_any_other_frame_closes_1008_slow_consumer_and_nothing_more_is_written(wire):
    texts = _fill(wire)
    _send(wire.protocol)
    _send(wire.protocol)
    held = wire.protocol.held_bytes

    _send(wire.protocol)

    close_payload = struct.pack("!H", 1008) + b"slow consumer"
    assert wire.protocol.held_bytes == held + 2 + len(close_payload)
    assert wire.protocol.state == wire.protocol.STATE_CLOSING

    # Daphne's answer to a send on a closing socket; the consumer takes it as its disconnect.
    with pytest.raises(Disconnected):
        _send(wire.protocol)
    with pytest.raises(Disconnected):
        _send(wire.protocol, droppable=True)
    assert wire.protocol.held_bytes == held + 2 + len(close_payload)

    frames = server_frames(wire.deliver())
    assert len(_texts(frames)) == len(texts) + 2
    assert frames[-1] == (CLOSE, close_payload)  # behind what was held before it, and the last


def test_a_slow_consumer_that_never_answers_the_close_is_aborted_which_lets_go_of_what_was_held(wire):
    _fill(wire)
    _send(wire.protocol)
    _send(wire.protocol)
    _send(wire.protocol)

    assert wire.protocol.closeHandshakeTimeout == daphne_server.SLOW_CONSUMER_CLOSE_TIMEOUT_S
    assert wire.protocol.closeHandshakeTimeoutCall is not None
    wire.protocol.onCloseHandshakeTimeout()  # what the timer runs when the client never read the close
    assert (wire.protocol.held_bytes, len(wire.protocol.held)) == (0, 0)
    wire.clock.advance(0)  # Twisted's abort completes on the reactor's next turn
    assert wire.transport.disconnected


def test_a_close_answered_while_frames_are_held_sends_them_and_the_answer_before_the_tcp_close(wire):
    texts = _fill(wire)
    _send(wire.protocol, text="last")

    # What autobahn does when the client's close frame arrives at a server: answer it, then drop the TCP.
    wire.protocol.sendCloseFrame(code=1000, isReply=True)
    wire.protocol.dropConnection(abort=False)

    assert (wire.protocol.held_bytes, len(wire.protocol.held)) == (0, 0)
    assert wire.transport.producer is None and wire.transport.disconnecting
    frames = server_frames(wire.deliver())
    assert _texts(frames) == [*texts, "last"]
    assert frames[-1] == (CLOSE, struct.pack("!H", 1000))


def test_a_lost_connection_lets_go_of_what_was_held(wire):
    _fill(wire)
    _send(wire.protocol)
    wire.transport.connectionLost(failure.Failure(main.CONNECTION_LOST))
    assert (wire.protocol.held_bytes, len(wire.protocol.held)) == (0, 0)


# --- droppable events on their way to the transport ----------------------------------------------


def _consumer() -> tuple[GatewayConsumer, list[dict[str, Any]]]:
    consumer = GatewayConsumer()
    consumer.phase = "open"
    consumer.seq = 0
    consumer.conn_id = "conn-slow"
    consumer.ctx = RpcContext(
        conn_id="conn-slow",
        channel_name="inmemory!conn-slow",
        role=sc.ROLE_OPERATOR,
        scopes=[sc.ADMIN],
        auth_method="token",
        client_id="test",
        client_mode="test",
    )
    sent: list[dict[str, Any]] = []

    async def base_send(message: dict[str, Any]) -> None:
        sent.append(message)

    consumer.base_send = base_send
    return consumer, sent


def test_a_droppable_event_reaches_the_transport_marked_and_still_spends_its_seq():
    consumer, sent = _consumer()

    async def deliver() -> None:
        await consumer.gateway_event(events.broadcast_message("presence", {"presence": []}, drop_if_slow=True))
        await consumer.gateway_event(events.broadcast_message("tick", {"ts": 1}))
        await broadcast.fan_out(
            events.broadcast_message("presence", {"presence": []}, drop_if_slow=True), connections=[consumer]
        )

    asyncio.run(deliver())

    assert [message.get(DROP_IF_SLOW_KEY, False) for message in sent] == [True, False, True]
    assert [f'"seq":{n}' in message["text"] for n, message in enumerate(sent, start=1)] == [True, True, True]


def test_an_event_that_cannot_be_encoded_once_keeps_its_mark_on_the_per_frame_path():
    consumer, sent = _consumer()
    encoded = EncodedEvent(event="presence", payload={"presence": []}, state_version=None, body=None, drop_if_slow=True)
    asyncio.run(consumer.send_encoded_event(encoded))
    assert sent[0][DROP_IF_SLOW_KEY] is True


def test_only_the_kinds_openclaw_drops_are_published_droppable():
    assert events.broadcast_message("presence", {}, drop_if_slow=True)[DROP_IF_SLOW_KEY] is True
    assert DROP_IF_SLOW_KEY not in events.broadcast_message("chat", {"state": "final"})


# --- a full channel-layer queue -------------------------------------------------------------------


@pytest.fixture
def on_loop(monkeypatch):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(publisher, "_layer_loop", lambda: loop)
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_a_full_connection_channel_fails_that_publication_only(on_loop, caplog):
    layer = InMemoryChannelLayer(capacity=1)
    publisher.post(lambda: layer.send("conn!a", {"type": "gateway.event", "n": 1}), what="first").result(5)

    full = publisher.post(lambda: layer.send("conn!a", {"type": "gateway.event", "n": 2}), what="chat to conn!a")
    other = publisher.post(lambda: layer.send("conn!b", {"type": "gateway.event", "n": 3}), what="chat to conn!b")

    assert isinstance(full.exception(5), ChannelFull)
    assert other.exception(5) is None
    assert "failed to publish chat to conn!a" in caplog.text


def test_a_group_send_to_a_full_member_skips_it_and_reaches_the_others(on_loop):
    layer = InMemoryChannelLayer(capacity=1)

    async def setup() -> None:
        await layer.group_add("gateway.sub.sessions", "conn!full")
        await layer.group_add("gateway.sub.sessions", "conn!free")
        await layer.send("conn!full", {"type": "gateway.event", "n": 0})

    publisher.post(setup, what="setup").result(publisher.PUBLISH_TIMEOUT_S)
    message = events.broadcast_message("sessions.changed", {"sessionKey": "k"}, drop_if_slow=True)
    publisher.post(lambda: layer.group_send("gateway.sub.sessions", message), what="sessions.changed").result(
        publisher.PUBLISH_TIMEOUT_S
    )

    async def drain() -> tuple[dict, dict]:
        return await layer.receive("conn!full"), await layer.receive("conn!free")

    kept, delivered = publisher.post(drain, what="drain").result(publisher.PUBLISH_TIMEOUT_S)
    assert kept["n"] == 0
    assert delivered["payload"] == {"sessionKey": "k"}
