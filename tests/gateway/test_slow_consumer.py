"""The slow-consumer limit: frames held by the protocol while Twisted says its transport is full, droppable
events skipped past ``maxBufferedBytes`` held, anything else closing 1008 ``slow consumer``; and the events
marked droppable on their way from the publisher to the transport.

The transport here is Twisted's own file descriptor whose socket accepts nothing (or everything,
once the client reads again): its buffer and its producer notifications are the real ones.
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
from daphne import ws_protocol
from twisted.internet import abstract, main
from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock
from twisted.python import failure

from gateway import broadcast, daphne_server, events, publisher
from gateway import scopes as sc
from gateway.consumers import GatewayConsumer
from gateway.context import RpcContext
from gateway.protocol import DROP_IF_SLOW_KEY, EncodedEvent

LIMIT = 1000
FRAME_TEXT = "x" * 800
# A server frame of 800 bytes: 2 header bytes plus a 16-bit length.
FRAME_BYTES = 4 + len(FRAME_TEXT)


class Socket(abstract.FileDescriptor):
    """A connected descriptor whose peer reads nothing until ``reading`` is set; keeps what it delivered."""

    def __init__(self) -> None:
        super().__init__(reactor=MemoryReactorClock())
        self.connected = 1
        self.reading = False
        self.delivered = b""
        self.aborted = False

    def getPeer(self):
        return IPv4Address("TCP", "127.0.0.1", 50000)

    def getHost(self):
        return IPv4Address("TCP", "127.0.0.1", 18789)

    def writeSomeData(self, data) -> int:
        if not self.reading:
            return 0
        self.delivered += bytes(data)
        return len(data)

    def abortConnection(self) -> None:
        self.aborted = True

    def read_all(self) -> None:
        """The client reads again: everything written (and whatever that lets through) reaches it."""
        self.reading = True
        while self.reactor.getWriters():
            self.doWrite()


class HTTPChannelStandIn:
    """The transport's producer before the upgrade (Twisted's HTTP channel, which paused reading when full)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pauseProducing(self) -> None:
        self.calls.append("pause")

    def resumeProducing(self) -> None:
        self.calls.append("resume")

    def stopProducing(self) -> None:
        self.calls.append("stop")


class Server:
    """Daphne's server as the protocol sees it at connection time."""

    def protocol_connected(self, protocol) -> None:
        pass


def _upgraded(http_channel: HTTPChannelStandIn) -> tuple[daphne_server.GatewayWebSocketProtocol, Socket]:
    factory = ws_protocol.WebSocketFactory(Server())
    factory.protocol = daphne_server.GatewayWebSocketProtocol
    protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
    sock = Socket()
    sock.registerProducer(http_channel, True)
    protocol.makeConnection(sock)
    # As after Daphne's accept (the opening handshake is not what these tests are about).
    protocol.state = protocol.STATE_OPEN
    protocol.client_addr = ["127.0.0.1", 50000]
    return protocol, sock


@pytest.fixture
def connection(settings) -> tuple[daphne_server.GatewayWebSocketProtocol, Socket]:
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "MAX_BUFFERED_BYTES": LIMIT}
    return _upgraded(HTTPChannelStandIn())


def _send(protocol, *, droppable: bool = False, text: str = FRAME_TEXT) -> None:
    message: dict[str, Any] = {"type": "websocket.send", "text": text}
    if droppable:
        message[DROP_IF_SLOW_KEY] = True
    protocol.handle_reply(message)


def _frame(text: str) -> bytes:
    return bytes([0x81, 126]) + struct.pack("!H", len(text)) + text.encode()


def _fill_the_transport(protocol) -> int:
    """Frames until Twisted says the transport is full (past its bufferSize); how many went."""
    sent = 0
    while not protocol.transport_full:
        assert sent * FRAME_BYTES < 4 * protocol.transport.bufferSize, "the transport never said it was full"
        _send(protocol, text=f"{sent:08d}" + FRAME_TEXT[8:])
        sent += 1
    return sent


# --- flow control ---------------------------------------------------------------------------------


def test_the_protocol_takes_the_transports_producer_slot_from_the_http_channel(settings):
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "MAX_BUFFERED_BYTES": LIMIT}
    http_channel = HTTPChannelStandIn()
    protocol, sock = _upgraded(http_channel)
    assert sock.producer is protocol and sock.streamingProducer
    _fill_the_transport(protocol)
    sock.read_all()
    assert protocol.transport_full is False  # paused, then resumed once the transport held nothing
    assert http_channel.calls == []  # its reading pause no longer applies to the WebSocket


def test_frames_go_to_the_transport_until_it_is_full_then_wait_here_and_follow_in_order(connection):
    protocol, sock = connection
    went = _fill_the_transport(protocol)
    assert went * FRAME_BYTES > sock.bufferSize  # Twisted's own threshold, not a number of ours
    assert protocol.held_bytes == 0

    _send(protocol, text="held-1" + FRAME_TEXT[6:])
    assert protocol.held_bytes == FRAME_BYTES
    assert protocol.state == protocol.STATE_OPEN

    sock.read_all()
    expected = b"".join(_frame(f"{n:08d}" + FRAME_TEXT[8:]) for n in range(went)) + _frame("held-1" + FRAME_TEXT[6:])
    assert sock.delivered == expected
    assert protocol.held_bytes == 0


def test_at_the_limit_one_more_frame_is_still_held(connection):
    protocol, _sock = connection
    _fill_the_transport(protocol)
    _send(protocol)
    _send(protocol)  # LIMIT lies between one and two frames: the second still goes
    assert protocol.held_bytes == 2 * FRAME_BYTES
    assert protocol.state == protocol.STATE_OPEN


def test_past_the_limit_a_droppable_event_is_skipped_and_the_connection_stays_open(connection, caplog):
    protocol, sock = connection
    _fill_the_transport(protocol)
    _send(protocol)
    _send(protocol)
    _send(protocol, droppable=True)
    _send(protocol, droppable=True)

    assert protocol.held_bytes == 2 * FRAME_BYTES
    assert protocol.state == protocol.STATE_OPEN
    assert caplog.text.count("dropping droppable events") == 1  # once per slow spell, not per event

    # The client reads again: frames flow, droppable ones too.
    sock.read_all()
    delivered = len(sock.delivered)
    _send(protocol, droppable=True)
    sock.read_all()
    assert len(sock.delivered) - delivered == FRAME_BYTES  # written, not dropped
    assert protocol.dropped_while_slow == 0


def test_past_the_limit_any_other_frame_closes_1008_slow_consumer_and_nothing_more_is_written(connection):
    protocol, sock = connection
    _fill_the_transport(protocol)
    _send(protocol)
    _send(protocol)
    held = protocol.held_bytes

    _send(protocol)

    close_payload = struct.pack("!H", 1008) + b"slow consumer"
    close_frame = bytes([0x88, len(close_payload)]) + close_payload
    assert protocol.held_bytes == held + len(close_frame)
    assert protocol.held[-1] == close_frame  # behind what was held before it
    assert protocol.state == protocol.STATE_CLOSING

    # Daphne's answer to a send on a closing socket; the consumer takes it as its disconnect.
    with pytest.raises(Disconnected):
        _send(protocol)
    with pytest.raises(Disconnected):
        _send(protocol, droppable=True)
    assert protocol.held_bytes == held + len(close_frame)

    sock.read_all()
    assert sock.delivered.endswith(close_frame)


def test_a_slow_consumer_that_never_answers_the_close_is_aborted_which_lets_go_of_what_was_held(connection):
    protocol, sock = connection
    _fill_the_transport(protocol)
    _send(protocol)
    _send(protocol)
    _send(protocol)

    assert protocol.closeHandshakeTimeout == daphne_server.SLOW_CONSUMER_CLOSE_TIMEOUT_S
    assert protocol.closeHandshakeTimeoutCall is not None
    protocol.onCloseHandshakeTimeout()  # what the timer runs when the client never read the close
    assert sock.aborted
    assert (protocol.held_bytes, len(protocol.held)) == (0, 0)


def test_a_close_answered_while_frames_are_held_sends_them_and_the_answer_before_the_tcp_close(connection):
    protocol, sock = connection
    _fill_the_transport(protocol)
    _send(protocol, text="last")

    # What autobahn does when the client's close frame arrives at a server: answer it, then drop the TCP.
    protocol.sendCloseFrame(code=1000, isReply=True)
    protocol.dropConnection(abort=False)

    assert (protocol.held_bytes, len(protocol.held)) == (0, 0)
    assert sock.producer is None and sock.disconnecting
    sock.reading = True
    assert sock.doWrite() is main.CONNECTION_DONE  # all written, then closed
    assert sock.delivered.endswith(bytes([0x81, 4]) + b"last" + bytes([0x88, 2]) + struct.pack("!H", 1000))


def test_a_lost_connection_lets_go_of_what_was_held(connection):
    protocol, sock = connection
    _fill_the_transport(protocol)
    _send(protocol)
    sock.connectionLost(failure.Failure(main.CONNECTION_LOST))
    assert (protocol.held_bytes, len(protocol.held)) == (0, 0)


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

    publisher.run_sync(setup, what="setup")
    message = events.broadcast_message("sessions.changed", {"sessionKey": "k"}, drop_if_slow=True)
    publisher.run_sync(lambda: layer.group_send("gateway.sub.sessions", message), what="sessions.changed")

    async def drain() -> tuple[dict, dict]:
        return await layer.receive("conn!full"), await layer.receive("conn!free")

    kept, delivered = publisher.run_sync(drain, what="drain")
    assert kept["n"] == 0
    assert delivered["payload"] == {"sessionKey": "k"}
