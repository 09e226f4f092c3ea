"""Slow request heads: each head has a deadline (408, or a silent close when nothing of it came), a client address
may hold only so many first heads still incomplete a second after accept (429 beyond), and nothing of it touches a
request whose head is complete, nor an upgraded WebSocket.

The channels are built by Daphne's own HTTP factory with the gateway's classes installed from the settings; they run
on Twisted's test transport and clock, so when they answer and close is Twisted's real behaviour at a time the test
sets. A request that reaches Daphne is answered through Daphne's ``handle_reply``, as the application would.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools

import pytest
from daphne.http_protocol import HTTPFactory
from daphne.server import Server
from daphne.ws_protocol import WebSocketFactory
from prometheus_client import REGISTRY
from twisted.internet import main
from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python import failure

from gateway import daphne_server
from tests.support.daphne_wire import open_wire

PARTIAL_HEAD = b"GET /api/gateway/health HTTP/1.1\r\nHost: gateway\r\nX-a: "
# A complete head whose body has not come yet: the channel waits for the body and Daphne sees nothing.
HEAD_BEFORE_BODY = b"POST /api/gateway/nothing HTTP/1.1\r\nHost: gateway\r\nContent-Length: 5\r\n\r\n"
REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


def too_many_requests(retry_after_s: int) -> bytes:
    return (
        b"HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\nRetry-After: %d\r\nContent-Length: 0\r\n\r\n"
        % retry_after_s
    )


async def _application(scope, receive, send) -> None:
    # The test answers through Daphne's handle_reply, in the application's place.
    await asyncio.Event().wait()


class Gateway:
    """Daphne's server and HTTP factory with the gateway's classes installed, on a test clock."""

    def __init__(self):
        self.server = Server(application=_application, endpoints=["tcp:port=0:interface=127.0.0.1"])
        self.server.connections = {}  # what Server.run() sets up before it builds the factories
        self.server.http_factory = HTTPFactory(self.server)
        self.server.ws_factory = WebSocketFactory(self.server, server="daphne")
        daphne_server.install_gateway_protocols(self.server)
        self.clock = MemoryReactorClock()
        # HTTPFactory's documented reactor: its channels' timers run on it.
        self.server.http_factory.reactor = self.clock
        self.ports = itertools.count(40000)

    def connect(self, host: str = "127.0.0.1") -> Connection:
        peer = IPv4Address("TCP", host, next(self.ports))
        channel = self.server.http_factory.buildProtocol(peer)
        transport = StringTransport(peerAddress=peer)
        channel.makeConnection(transport)
        return Connection(channel, transport)


class Connection:
    def __init__(self, channel: daphne_server.GatewayHTTPChannel, transport: StringTransport):
        self.channel = channel
        self.transport = transport

    def send(self, data: bytes) -> None:
        self.channel.dataReceived(data)

    def answer(self) -> bytes:
        return self.transport.value()

    @property
    def closing(self) -> bool:
        return self.transport.disconnecting

    def client_leaves(self) -> None:
        self.channel.connectionLost(failure.Failure(main.CONNECTION_DONE))

    def respond(self, status: int = 200, body: bytes = b"ok") -> None:
        """Daphne's request answered as the application would, through ``handle_reply``."""
        request = self.channel.requests[0]
        request.handle_reply({"type": "http.response.start", "status": status, "headers": []})
        request.handle_reply({"type": "http.response.body", "body": body})


@pytest.fixture
def event_loop_for_daphne():
    # Daphne starts an application instance on the current event loop; it never runs here.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    asyncio.set_event_loop(None)


@pytest.fixture
def configure(settings, event_loop_for_daphne):
    """``configure(HTTP_HEAD_TIMEOUT_MS=…, …)``: a gateway with those OPENCLAW_GATEWAY settings."""

    def build(**overrides) -> Gateway:
        settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, **overrides}
        return Gateway()

    return build


def refused(reason: str) -> float:
    return REGISTRY.get_sample_value("openclaw_gateway_http_heads_refused_total", {"reason": reason}) or 0.0


# --- the deadline ---------------------------------------------------------------------------------------------


def test_a_head_dribbled_a_byte_at_a_time_gets_408_at_its_deadline_though_each_byte_restarts_the_idle_timeout(
    configure,
):
    gateway = configure(HTTP_HEAD_TIMEOUT_MS=10_000)
    before = refused("timeout")
    connection = gateway.connect()
    connection.send(PARTIAL_HEAD)
    for _ in range(4):  # a byte every 2 s: Twisted's 10 s idle timeout alone would never end this
        gateway.clock.advance(2)
        connection.send(b"a")
    gateway.clock.advance(1.9)
    assert (connection.answer(), connection.closing) == (b"", False)

    gateway.clock.advance(0.1)  # 10 s from accept

    assert connection.answer() == REQUEST_TIMEOUT
    assert connection.closing
    assert refused("timeout") == before + 1


def test_a_connection_that_sends_nothing_is_closed_at_the_deadline_without_an_answer(configure):
    gateway = configure(HTTP_HEAD_TIMEOUT_MS=3_000)
    connection = gateway.connect()
    gateway.clock.advance(2.9)
    assert not connection.closing
    gateway.clock.advance(0.1)
    assert connection.closing
    assert connection.answer() == b""


def test_a_head_cut_short_by_the_idle_timeout_gets_408_too_when_the_deadline_is_longer(configure):
    gateway = configure(HTTP_HEAD_TIMEOUT_MS=30_000)
    connection = gateway.connect()
    connection.send(PARTIAL_HEAD)
    gateway.clock.advance(daphne_server.HTTP_IDLE_TIMEOUT_S)
    assert connection.answer() == REQUEST_TIMEOUT
    assert connection.closing


def test_a_complete_head_ends_the_deadline_and_its_body_has_the_idle_timeout(configure):
    gateway = configure(HTTP_HEAD_TIMEOUT_MS=2_000)
    connection = gateway.connect()
    connection.send(HEAD_BEFORE_BODY)
    for _ in range(4):  # past the head deadline, a body byte within each idle timeout
        gateway.clock.advance(daphne_server.HTTP_IDLE_TIMEOUT_S - 1)
        connection.send(b"b")
    assert (connection.answer(), connection.closing) == (b"", False)

    gateway.clock.advance(daphne_server.HTTP_IDLE_TIMEOUT_S)  # the body stalls

    assert connection.closing
    assert connection.answer() == b""  # a body cut short is Twisted's idle timeout: no 408


def test_each_head_on_a_kept_alive_connection_has_the_deadline_from_the_end_of_the_previous_response(configure):
    gateway = configure(HTTP_HEAD_TIMEOUT_MS=3_000)
    dribbler, idler = gateway.connect(), gateway.connect()
    gateway.clock.advance(2.5)  # the first heads come late, within their deadline
    for connection in (dribbler, idler):
        connection.send(b"GET /a HTTP/1.1\r\nHost: gateway\r\n\r\n")
    gateway.clock.advance(5)  # the application takes its time: no deadline while a request is handled
    for connection in (dribbler, idler):
        connection.respond()
        assert connection.answer().startswith(b"HTTP/1.1 200 OK\r\n")
        assert not connection.closing
        connection.transport.clear()

    dribbler.send(b"GET /b HTTP/1.1\r\n")
    gateway.clock.advance(2.9)
    assert not dribbler.closing and not idler.closing
    gateway.clock.advance(0.1)

    assert (dribbler.answer(), dribbler.closing) == (REQUEST_TIMEOUT, True)
    assert (idler.answer(), idler.closing) == (b"", True)  # an idle kept-alive connection just closes


def test_a_second_request_in_time_is_served_on_the_same_connection(configure):
    gateway = configure(HTTP_HEAD_TIMEOUT_MS=3_000)
    connection = gateway.connect()
    connection.send(b"GET /a HTTP/1.1\r\nHost: gateway\r\n\r\n")
    connection.respond(body=b"first")
    gateway.clock.advance(2.9)
    connection.send(b"GET /b HTTP/1.1\r\nHost: gateway\r\n\r\n")
    gateway.clock.advance(60)  # handled: the deadline is over for this head
    connection.respond(body=b"second")

    answers = connection.answer()
    assert answers.count(b"HTTP/1.1 200 OK\r\n") == 2 and b"\r\nsecond\r\n" in answers
    assert not connection.closing


def test_an_upgraded_websocket_outlives_every_head_deadline(settings):
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "HTTP_HEAD_TIMEOUT_MS": 1_000}
    wire = open_wire(max_buffered_bytes=1 << 20, settings=settings)
    try:
        wire.clock.advance(3600)  # the clock the HTTP channel's timers run on
        assert wire.protocol.state == wire.protocol.STATE_OPEN
        assert not wire.transport.disconnecting
        assert wire.deliver() == b""
    finally:
        wire.close()


# --- slow heads per address -------------------------------------------------------------------------------------


def test_an_address_holding_the_limit_of_slow_heads_gets_429_until_one_of_them_ends(configure):
    gateway = configure(HTTP_HEAD_TIMEOUT_MS=4_000, HTTP_SLOW_HEADS_PER_ADDRESS=2)
    before = refused("address-limit")
    held = [gateway.connect() for _ in range(2)]
    extra = gateway.connect()
    neighbour = gateway.connect("127.0.0.2")
    for connection in (*held, extra, neighbour):
        connection.send(PARTIAL_HEAD)

    gateway.clock.advance(1)  # the heads are slow now; two fit within the limit

    assert not any(connection.closing for connection in (*held, neighbour))
    assert (extra.answer(), extra.closing) == (too_many_requests(4), True)
    at_accept = gateway.connect()
    assert (at_accept.answer(), at_accept.closing) == (too_many_requests(4), True)
    assert not gateway.connect("127.0.0.2").closing  # another address is not concerned
    assert refused("address-limit") == before + 2

    held[0].client_leaves()
    replacement = gateway.connect()
    assert not replacement.closing

    gateway.clock.advance(3)  # the deadline of the first ones
    assert (held[1].answer(), held[1].closing) == (REQUEST_TIMEOUT, True)
    assert not gateway.connect().closing


def test_a_head_that_completes_frees_its_place(configure):
    gateway = configure(HTTP_HEAD_TIMEOUT_MS=4_000, HTTP_SLOW_HEADS_PER_ADDRESS=1)
    slow = gateway.connect()
    slow.send(HEAD_BEFORE_BODY[:20])
    gateway.clock.advance(1)
    assert gateway.connect().closing

    slow.send(HEAD_BEFORE_BODY[20:])

    assert not gateway.connect().closing


def test_a_burst_of_fresh_connections_from_one_address_is_not_refused(configure):
    gateway = configure(HTTP_HEAD_TIMEOUT_MS=4_000, HTTP_SLOW_HEADS_PER_ADDRESS=2)
    burst = [gateway.connect() for _ in range(50)]  # accepted together, before any of them sent a byte
    gateway.clock.advance(0.5)
    for connection in burst:
        connection.send(HEAD_BEFORE_BODY)
    gateway.clock.advance(2)
    assert not any(connection.closing for connection in burst)
    assert all(connection.answer() == b"" for connection in burst)


def test_exempt_addresses_are_not_counted_and_still_have_the_deadline(configure):
    gateway = configure(
        HTTP_HEAD_TIMEOUT_MS=4_000,
        HTTP_SLOW_HEADS_PER_ADDRESS=1,
        HTTP_SLOW_HEADS_EXEMPT=(ipaddress.ip_network("127.0.0.0/8"),),
    )
    proxied = [gateway.connect("127.0.0.1") for _ in range(5)]
    counted = [gateway.connect("192.0.2.7") for _ in range(2)]  # a documentation address: no traffic goes anywhere
    for connection in (*proxied, *counted):
        connection.send(PARTIAL_HEAD)

    gateway.clock.advance(1)

    assert not any(connection.closing for connection in proxied)
    assert [connection.closing for connection in counted] == [False, True]
    gateway.clock.advance(3)
    assert all(connection.answer() == REQUEST_TIMEOUT for connection in proxied)


def test_the_limit_needs_the_head_to_be_slow_a_second_or_half_a_short_deadline(configure):
    gateway = configure(HTTP_HEAD_TIMEOUT_MS=1_000, HTTP_SLOW_HEADS_PER_ADDRESS=1)
    first, second = gateway.connect(), gateway.connect()
    gateway.clock.advance(0.5)
    assert (first.closing, second.closing) == (False, True)


# --- bodies over their cap ------------------------------------------------------------------------------------

CONTENT_TOO_LARGE = b"HTTP/1.1 413 Content Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
CAP = 100_000


def post_head(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: gateway", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_a_declared_body_over_the_cap_is_refused_413_before_a_byte_of_it_is_taken(configure):
    gateway = configure(MAX_PAYLOAD_BYTES=CAP)
    before = refused("body-too-large")
    connection = gateway.connect()

    connection.send(post_head("/api/sessions/", f"Content-Length: {CAP + 1}") + b"x" * 1000)

    assert connection.answer() == CONTENT_TOO_LARGE
    assert connection.closing and connection.transport.producerState == "paused"
    assert refused("body-too-large") == before + 1
    request = connection.channel.requests[0]
    assert request.content is None  # no temporary file, nothing for Daphne
    connection.send(b"y" * 10_000)  # what the client still sends is not taken
    assert request.content is None and connection.answer() == CONTENT_TOO_LARGE


def test_a_chunked_body_is_refused_once_it_passes_the_cap(configure):
    gateway = configure(MAX_PAYLOAD_BYTES=CAP)
    connection = gateway.connect()
    connection.send(post_head("/api/sessions/", "Transfer-Encoding: chunked"))
    piece = b"z" * 16_000
    sent = 0
    while sent <= CAP + daphne_server.BODY_FRAMING_SLACK_BYTES - len(piece):
        connection.send(chunk(piece))
        sent += len(piece)
        assert connection.answer() == b"" and not connection.closing

    connection.send(chunk(piece) * 2)

    assert connection.answer() == CONTENT_TOO_LARGE
    assert connection.closing


def test_a_body_within_the_cap_reaches_the_application_and_the_next_request_is_counted_anew(configure):
    gateway = configure(MAX_PAYLOAD_BYTES=CAP)
    connection = gateway.connect()
    body = b"b" * (CAP - 10)

    connection.send(post_head("/api/sessions/", f"Content-Length: {len(body)}") + body)
    connection.respond()

    assert connection.answer().startswith(b"HTTP/1.1 200 OK\r\n") and not connection.closing
    connection.transport.clear()
    connection.send(post_head("/api/sessions/", f"Content-Length: {len(body)}") + body)
    assert connection.answer() == b"" and not connection.closing


def test_a_path_allowed_large_bodies_takes_one_over_the_general_cap(configure, monkeypatch):
    monkeypatch.setattr(daphne_server, "_large_body_paths", [(b"/__big__/", 10 * CAP)])
    gateway = configure(MAX_PAYLOAD_BYTES=CAP)
    allowed, elsewhere, past = gateway.connect(), gateway.connect(), gateway.connect()

    allowed.send(post_head("/__big__/upload", f"Content-Length: {5 * CAP}") + b"u" * CAP)
    elsewhere.send(post_head("/__big", f"Content-Length: {5 * CAP}"))
    past.send(post_head("/__big__/upload", f"Content-Length: {10 * CAP + 1}"))

    assert allowed.answer() == b"" and not allowed.closing
    assert elsewhere.answer() == CONTENT_TOO_LARGE
    assert past.answer() == CONTENT_TOO_LARGE
