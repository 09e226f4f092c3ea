"""The slow-consumer limit: Twisted's unsent bytes measured before each frame, droppable events
skipped past ``maxBufferedBytes``, anything else closing 1008 ``slow consumer``; and the events
marked droppable on their way from the publisher to the transport.

The transport here is Twisted's own file descriptor whose socket accepts nothing (or everything,
once the client reads again): the buffer arithmetic is the real one.
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
from twisted.internet import abstract
from twisted.internet.address import IPv4Address
from twisted.internet.protocol import Protocol
from twisted.internet.testing import MemoryReactorClock
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory

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
    """A connected descriptor whose peer reads nothing until ``reading`` is set."""

    def __init__(self) -> None:
        super().__init__(reactor=MemoryReactorClock())
        self.connected = 1
        self.reading = False
        self.delivered = 0
        self.aborted = False

    def getPeer(self):
        return IPv4Address("TCP", "127.0.0.1", 50000)

    def getHost(self):
        return IPv4Address("TCP", "127.0.0.1", 18789)

    def writeSomeData(self, data) -> int:
        if not self.reading:
            return 0
        self.delivered += len(data)
        return len(data)

    def abortConnection(self) -> None:
        self.aborted = True


class Server:
    """Daphne's server as the protocol sees it at connection time."""

    def protocol_connected(self, protocol) -> None:
        pass


# Frames written at once (plain TCP, `daphne_server.write_now`) or queued for the reactor's next turn (any
# other transport): the same arithmetic either way.
@pytest.fixture(params=["written-at-once", "queued"])
def connection(request, settings) -> tuple[daphne_server.ReasonCarryingWebSocketProtocol, Socket]:
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "MAX_BUFFERED_BYTES": LIMIT}
    factory = ws_protocol.WebSocketFactory(Server())
    factory.protocol = daphne_server.ReasonCarryingWebSocketProtocol
    protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
    sock = Socket()
    if request.param == "written-at-once":
        sock.TLS = False
    protocol.makeConnection(sock)
    # As after Daphne's accept (the opening handshake is not what these tests are about).
    protocol.state = protocol.STATE_OPEN
    protocol.client_addr = ["127.0.0.1", 50000]
    return protocol, sock


def _send(protocol, *, droppable: bool = False, text: str = FRAME_TEXT) -> None:
    message: dict[str, Any] = {"type": "websocket.send", "text": text}
    if droppable:
        message[DROP_IF_SLOW_KEY] = True
    protocol.handle_reply(message)


# --- measuring -----------------------------------------------------------------------------------


def test_unsent_bytes_counts_what_the_socket_did_not_take_and_nothing_once_it_did():
    sock = Socket()
    sock.write(b"a" * 300)
    sock.doWrite()  # moves the queued writes into dataBuffer; the peer takes none of it
    sock.write(b"b" * 200)
    assert daphne_server.unsent_bytes(sock) == 500

    sock.reading = True
    sock.doWrite()
    assert daphne_server.unsent_bytes(sock) == 0


def test_unsent_bytes_looks_through_protocol_wrappers_and_a_gone_transport_holds_nothing():
    sock = Socket()
    sock.write(b"a" * 42)
    wrapper = ProtocolWrapper(WrappingFactory(None), Protocol())
    wrapper.makeConnection(sock)
    assert daphne_server.unsent_bytes(wrapper) == 42
    assert daphne_server.unsent_bytes(None) == 0


def test_the_limit_is_passed_only_above_it():
    assert not daphne_server.over_buffer_limit(LIMIT, LIMIT)
    assert daphne_server.over_buffer_limit(LIMIT + 1, LIMIT)


# --- the protocol ---------------------------------------------------------------------------------


def test_frames_go_out_while_the_unsent_bytes_stay_within_the_limit(connection):
    protocol, sock = connection
    _send(protocol)
    assert daphne_server.unsent_bytes(sock) == FRAME_BYTES
    # At the limit (not past it) one more frame still goes: the buffer ends under limit + one frame.
    _send(protocol)
    assert daphne_server.unsent_bytes(sock) == 2 * FRAME_BYTES
    assert protocol.state == protocol.STATE_OPEN


def test_past_the_limit_a_droppable_event_is_skipped_and_the_connection_stays_open(connection, caplog):
    protocol, sock = connection
    _send(protocol)
    _send(protocol)
    _send(protocol, droppable=True)
    _send(protocol, droppable=True)

    assert daphne_server.unsent_bytes(sock) == 2 * FRAME_BYTES
    assert protocol.state == protocol.STATE_OPEN
    assert caplog.text.count("dropping droppable events") == 1  # once per slow spell, not per event

    # The client reads again: frames flow, droppable ones too.
    sock.reading = True
    sock.doWrite()
    delivered = sock.delivered
    _send(protocol, droppable=True)
    sock.doWrite()
    assert sock.delivered - delivered == FRAME_BYTES  # written, not dropped
    assert protocol.dropped_while_slow == 0


def test_past_the_limit_any_other_frame_closes_1008_slow_consumer_and_nothing_more_is_written(connection):
    protocol, sock = connection
    _send(protocol)
    _send(protocol)
    buffered = daphne_server.unsent_bytes(sock)

    _send(protocol)

    close_payload = struct.pack("!H", 1008) + b"slow consumer"
    close_frame = bytes([0x88, len(close_payload)]) + close_payload
    assert daphne_server.unsent_bytes(sock) == buffered + len(close_frame)
    assert b"".join(sock._tempDataBuffer).endswith(close_frame)
    assert protocol.state == protocol.STATE_CLOSING

    # Daphne's answer to a send on a closing socket; the consumer takes it as its disconnect.
    with pytest.raises(Disconnected):
        _send(protocol)
    with pytest.raises(Disconnected):
        _send(protocol, droppable=True)
    assert daphne_server.unsent_bytes(sock) == buffered + len(close_frame)


def test_a_slow_consumer_that_never_answers_the_close_is_aborted_which_frees_its_buffer(connection):
    protocol, sock = connection
    _send(protocol)
    _send(protocol)
    _send(protocol)

    assert protocol.closeHandshakeTimeout == daphne_server.SLOW_CONSUMER_CLOSE_TIMEOUT_S
    assert protocol.closeHandshakeTimeoutCall is not None
    protocol.onCloseHandshakeTimeout()  # what the timer runs when the client never read the close
    assert sock.aborted


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
