"""Daphne through its public interface: the factories ``Server.run()`` builds pointed at the gateway's classes, close
frames that carry their reason, and the HTTP channel's answers to overlong lines (its deadlines: test_request_heads.py).

The factories are Daphne's own, built as ``Server.run()`` builds them. Close frames are read by a client over real
loopback TCP (``tests/support/daphne_wire.py``); the HTTP channel runs on Twisted's test transport and clock, so
what it writes and when it gives up are Twisted's real behaviour.
"""

from __future__ import annotations

import struct

import pytest
from daphne.http_protocol import HTTPFactory
from daphne.server import Server
from daphne.ws_protocol import WebSocketFactory
from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport

from gateway import daphne_server
from tests.support.daphne_wire import open_wire, server_frames

PEER = IPv4Address("TCP", "127.0.0.1", 50000)
CLOSE = 8


@pytest.fixture
def server() -> Server:
    """A Daphne server with the factories and connection table ``run()`` makes, and the gateway's classes installed."""
    daphne = Server(application=None, endpoints=["tcp:port=0:interface=127.0.0.1"])
    daphne.connections = {}
    daphne.http_factory = HTTPFactory(daphne)
    daphne.ws_factory = WebSocketFactory(daphne, server="daphne")
    daphne_server.install_gateway_protocols(daphne)
    return daphne


# --- installing -----------------------------------------------------------------------------------


def test_the_factories_build_the_gateways_protocols_with_the_documented_options(server):
    channel = server.http_factory.buildProtocol(PEER)
    websocket = server.ws_factory.buildProtocol(PEER)
    assert isinstance(channel, daphne_server.GatewayHTTPChannel)
    assert channel.timeOut == daphne_server.HTTP_IDLE_TIMEOUT_S
    assert channel.factory is server.http_factory  # where Daphne's requests find their server
    assert isinstance(websocket, daphne_server.GatewayWebSocketProtocol)
    assert server.ws_factory.failByDrop is False


# --- close frames ---------------------------------------------------------------------------------


@pytest.fixture
def wire(settings):
    wire = open_wire(max_buffered_bytes=1 << 20, settings=settings)
    yield wire
    wire.close()


@pytest.mark.parametrize("code", [1008, 1002, 1009, 1011, 1000, 4000])
def test_a_close_carries_its_code_and_reason_also_where_autobahns_sendclose_refuses_the_code(wire, code):
    reason = "pairing required: device is not approved yet (requestId: 1234)"
    wire.protocol.handle_reply({"type": "websocket.close", "code": code, "reason": reason})
    assert server_frames(wire.deliver()) == [(CLOSE, struct.pack("!H", code) + reason.encode())]
    assert wire.protocol.state == wire.protocol.STATE_CLOSING


def test_a_close_without_a_reason_sends_the_code_alone(wire):
    wire.protocol.handle_reply({"type": "websocket.close", "code": 1008})
    assert server_frames(wire.deliver()) == [(CLOSE, struct.pack("!H", 1008))]


def test_a_close_without_a_code_is_1000(wire):
    wire.protocol.handle_reply({"type": "websocket.close"})
    assert server_frames(wire.deliver()) == [(CLOSE, struct.pack("!H", 1000))]


def test_a_second_close_writes_nothing_more(wire):
    wire.protocol.handle_reply({"type": "websocket.close", "code": 1008, "reason": "first"})
    wire.protocol.handle_reply({"type": "websocket.close", "code": 1011, "reason": "second"})
    assert server_frames(wire.deliver()) == [(CLOSE, struct.pack("!H", 1008) + b"first")]


def test_a_reason_longer_than_a_close_frame_holds_is_cut_on_a_character_boundary():
    reason = "é" * 100  # 200 bytes of UTF-8
    cut = daphne_server.truncate_close_reason(reason)
    assert len(cut.encode()) <= daphne_server.MAX_CLOSE_REASON_BYTES
    assert cut.endswith("...") and cut[:-3] == "é" * 60
    assert daphne_server.truncate_close_reason("short") == "short"


# --- the HTTP channel -----------------------------------------------------------------------------


def _channel(server) -> tuple[daphne_server.GatewayHTTPChannel, StringTransport, MemoryReactorClock]:
    clock = MemoryReactorClock()
    server.http_factory.reactor = clock  # HTTPFactory's documented reactor: its channels' timeouts run on it
    channel = server.http_factory.buildProtocol(PEER)
    transport = StringTransport(peerAddress=PEER)
    channel.makeConnection(transport)
    return channel, transport, clock


def test_an_overlong_request_line_gets_414_and_the_connection_closes(server):
    channel, transport, _clock = _channel(server)
    channel.dataReceived(b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert transport.value().startswith(b"HTTP/1.1 414 URI Too Long\r\n")
    assert transport.disconnecting


def test_an_overlong_line_without_an_end_is_a_request_line_too(server):
    channel, transport, _clock = _channel(server)
    channel.dataReceived(b"\x00" * 20_000)
    assert transport.value().startswith(b"HTTP/1.1 414 URI Too Long\r\n")
    assert transport.disconnecting


def test_an_overlong_header_gets_431_and_the_connection_closes(server):
    channel, transport, _clock = _channel(server)
    channel.dataReceived(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n")
    assert transport.value().startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert transport.disconnecting


def test_lines_within_the_limit_are_not_refused(server):
    channel, transport, _clock = _channel(server)
    channel.dataReceived(b"GET /" + b"a" * 8_000 + b" HTTP/1.1\r\nX-Big: " + b"b" * 8_000 + b"\r\n")
    assert transport.value() == b""
    assert not transport.disconnecting
