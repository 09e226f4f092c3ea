"""Running Daphne for the gateway: close reasons, frames written at once, slow consumers, HTTP hardening, shutdown.

Daphne stays the server, used through ``daphne.server.Server`` and its parameters. Its ``run()`` builds the HTTP
and WebSocket factories and serves at once, with no hook in between; the ``ready_callable`` it runs before the
reactor accepts a first connection points them at the gateway's protocol classes
(:func:`install_gateway_protocols`), through documented factory attributes only.

Close reasons: Daphne 4 drops the ``reason`` of ``websocket.close`` (django/daphne#374); OpenClaw clients show it
(for example ``pairing required: … (requestId: …)``), so the protocol class sends it.

Writes: a frame goes to the kernel as it is sent (``ITCPTransport.getHandle()``: the connection's socket) when
Twisted's transport holds nothing before it, instead of waiting for the reactor's next turn: Twisted would
register the socket for writability, write on the next turn and unregister it, two ``epoll_ctl`` calls and a loop
turn per frame. What the kernel does not take goes to the transport, and the protocol, registered as the
transport's pull producer (``IConsumer.registerProducer``), holds the frames after it until Twisted calls
``resumeProducing``: its buffer is empty again.

Slow consumers (OpenClaw's policy, ``policy.maxBufferedBytes`` in hello-ok): past ``MAX_BUFFERED_BYTES`` held, a
frame published as droppable (``dropIfSlow``) is skipped, any other closes the connection with 1008 ``slow
consumer``. Nothing more is written to it, and the close handshake waits at most
:data:`SLOW_CONSUMER_CLOSE_TIMEOUT_S` before the TCP connection is aborted, which frees what was held.

Slow request heads: each request head (request line and headers) has a deadline, from accept for a connection's
first and from the end of the previous response for the next (408, or a silent close when nothing of it came), and
one client address may hold only so many first heads still incomplete a second after accept (429 beyond), see
:class:`GatewayHTTPChannel` and :class:`RequestHeads`; Twisted's own idle timeout restarts with every byte.

Before the reactor stops, every local connection receives the ``shutdown`` event.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import math
from collections import deque
from collections.abc import Sequence

from daphne import ws_protocol
from daphne.server import Server
from twisted.internet import interfaces
from twisted.internet.interfaces import IDelayedCall
from twisted.web import http

from . import lifecycle, metrics
from .conf import gateway_setting
from .protocol import DROP_IF_SLOW_KEY

logger = logging.getLogger(__name__)

MAX_CLOSE_REASON_BYTES = 123


def truncate_close_reason(reason: str) -> str:
    encoded = reason.encode("utf-8")
    if len(encoded) <= MAX_CLOSE_REASON_BYTES:
        return reason
    return encoded[: MAX_CLOSE_REASON_BYTES - 3].decode("utf-8", errors="ignore") + "..."


SLOW_CONSUMER_CLOSE_CODE = 1008
SLOW_CONSUMER_CLOSE_REASON = "slow consumer"
# How long a slow consumer has to read up to the close frame and answer it before the TCP connection
# is aborted; ws (OpenClaw's WebSocket library) waits 30 s for the peer's close frame as well.
SLOW_CONSUMER_CLOSE_TIMEOUT_S = 30


class GatewayWebSocketProtocol(ws_protocol.WebSocketProtocol):
    """Daphne's WebSocket protocol that sends close codes with their reason, writes frames at once and bounds what a
    slow client costs.

    Autobahn's ``sendClose`` only admits 1000 and 3000-4999 from applications, and the gateway closes with
    1008, 1002, 1009 and 1011 too: the close frame goes through ``sendCloseFrame``, as Daphne sends its own 1011.

    Every frame autobahn writes (data, ping, pong, close, the opening handshake's answer) passes through
    ``sendData``, and nothing else writes to the transport after the upgrade: while ``transport_busy`` (Twisted
    holds bytes) frames wait in ``held``, in order; otherwise they go to the kernel, and what it does not take to
    Twisted.
    """

    def connectionMade(self):
        self.max_buffered_bytes = gateway_setting("MAX_BUFFERED_BYTES")
        self.held: deque[bytes] = deque()
        self.held_bytes = 0
        self.dropped_while_slow = 0
        transport = self.transport
        tls = interfaces.ISSLTransport.providedBy(transport)
        self.socket = transport.getHandle() if interfaces.ITCPTransport.providedBy(transport) and not tls else None
        super().connectionMade()
        # The HTTP channel that read the upgrade request was the transport's producer until now.
        transport.unregisterProducer()
        transport.registerProducer(self, False)
        # Registering a pull producer calls resumeProducing at once, which says nothing about what the transport
        # holds: it may still be sending an earlier HTTP response of this connection. Its first write goes through
        # Twisted; its next call of resumeProducing says the transport is empty.
        self.transport_busy = False
        self.transport_empty = False

    # --- IPullProducer, as the transport sees this protocol ---------------------------------------------------

    def resumeProducing(self):
        """Twisted's transport has sent everything it was given."""
        self.transport_busy = False
        self.transport_empty = True
        # Without a socket to try first (TLS, a wrapping transport), everything held goes to the transport at once.
        while self.held and (not self.transport_busy or self.socket is None):
            data = self.held.popleft()
            self.held_bytes -= len(data)
            self._write(data)

    def stopProducing(self):
        # The connection is gone: what was held will never be sent.
        self.held.clear()
        self.held_bytes = 0

    # --- writing ----------------------------------------------------------------------------------------------

    def sendData(self, data, sync=False, chopsize=None):
        # Daphne never asks for autobahn's synchronous or chopped writes, which are for tests of autobahn itself.
        if self.transport_busy or self.held:
            self.held.append(data)
            self.held_bytes += len(data)
            return
        self._write(data)

    def _write(self, data: bytes) -> None:
        """``data`` with nothing held before it: to the kernel when Twisted's transport holds nothing either, the rest
        to the transport, which calls :meth:`resumeProducing` once it has sent it."""
        sent = 0
        if self.transport_empty and self.socket is not None and self.state != self.STATE_CLOSED:
            try:
                sent = self.socket.send(data)
            except OSError:
                # Full (EAGAIN, ENOBUFS) or gone: queued the usual way; Twisted's own write then finds out and
                # closes the connection if it is gone.
                sent = 0
        if sent < len(data):
            # Autobahn's own write (its traffic statistics, unused by Daphne, count only these bytes).
            super().sendData(data[sent:] if sent else data)
            self.transport_busy = True
            self.transport_empty = False

    def dropConnection(self, abort=False):
        if abort:
            self.stopProducing()
        else:
            # A TCP close after the close frame (autobahn answering the client's close): what waits here goes to
            # the transport first, which closes once it has sent it all.
            while self.held:
                data = self.held.popleft()
                self.held_bytes -= len(data)
                super().sendData(data)
        super().dropConnection(abort)

    # --- Daphne's ASGI messages -------------------------------------------------------------------------------

    def handle_reply(self, message):
        kind = message.get("type")
        if kind == "websocket.send" and self.state == self.STATE_OPEN and self._refuse_slow_consumer_frame(message):
            return
        if kind == "websocket.close" and self.state != self.STATE_CONNECTING:
            reason = message.get("reason") or ""
            self.sendCloseFrame(
                code=message.get("code") or 1000,
                reasonUtf8=truncate_close_reason(reason).encode("utf-8") if reason else None,
                isReply=False,
            )
            return
        super().handle_reply(message)

    def _refuse_slow_consumer_frame(self, message) -> bool:
        """True when the frame is not sent: dropped (``dropIfSlow``), or the connection is closing."""
        # The frame about to go is not counted: like OpenClaw, a connection at the limit still gets one more
        # frame, so what is held stays under the limit plus one frame.
        if self.held_bytes <= self.max_buffered_bytes:
            self.dropped_while_slow = 0
            return False
        if message.get(DROP_IF_SLOW_KEY):
            if not self.dropped_while_slow:
                logger.warning(
                    "WebSocket %s: %d bytes held for it (limit %d), dropping droppable events",
                    self.client_addr,
                    self.held_bytes,
                    self.max_buffered_bytes,
                )
            self.dropped_while_slow += 1
            return True
        logger.warning(
            "WebSocket %s: %d bytes held for it (limit %d), closing as a slow consumer",
            self.client_addr,
            self.held_bytes,
            self.max_buffered_bytes,
        )
        metrics.record_slow_consumer_disconnect()
        # The close frame queues behind what is held; a client that never reads it is cut off when the close
        # handshake times out (autobahn aborts the TCP connection, and what was held is let go).
        self.closeHandshakeTimeout = SLOW_CONSUMER_CLOSE_TIMEOUT_S
        self.sendCloseFrame(
            code=SLOW_CONSUMER_CLOSE_CODE, reasonUtf8=SLOW_CONSUMER_CLOSE_REASON.encode("utf-8"), isReply=False
        )
        return True


# Twisted's idle timeout (each byte resets it): the gap a request body may leave between two reads. Request heads
# have a deadline of their own (HTTP_HEAD_TIMEOUT_MS). Upgraded WebSockets are not affected: their channel no longer
# times out once the upgrade request arrived.
HTTP_IDLE_TIMEOUT_S = 10

# A client on a working network sends its request head within milliseconds of connecting. Only first heads still
# incomplete this long after accept count toward the per-address bound, so a burst of fresh connections from one
# address (a benchmark opening hundreds of sockets at once, a proxy's busy second) is never refused.
SLOW_HEAD_AFTER_S = 1.0

URI_TOO_LONG = b"414 URI Too Long"
HEADER_FIELDS_TOO_LARGE = b"431 Request Header Fields Too Large"
CONTENT_TOO_LARGE = b"413 Content Too Large"
# Raw bytes of a body past its cap that are still taken: a chunked body's framing, and the part of the next pipelined
# request a read may bring with the body's end.
BODY_FRAMING_SLACK_BYTES = 64 * 1024
# Path prefixes whose requests may carry larger bodies than OPENCLAW_MAX_PAYLOAD_BYTES (see allow_large_bodies).
_large_body_paths: list[tuple[bytes, int]] = []


def allow_large_bodies(path_prefix: str, max_bytes: int) -> None:
    """Requests whose path starts with ``path_prefix`` may carry bodies of up to ``max_bytes`` (every other request:
    ``OPENCLAW_MAX_PAYLOAD_BYTES``, Django's own limit too). Called where such a route is mounted."""
    _large_body_paths.append((path_prefix.encode("latin-1"), max_bytes))


REQUEST_TIMEOUT = b"408 Request Timeout"
TOO_MANY_REQUESTS = b"429 Too Many Requests"


def bodiless_answer(status: bytes, *headers: bytes) -> bytes:
    """A complete response the channel writes itself, before any request reached Daphne; the connection closes."""
    lines = [b"HTTP/1.1 " + status, b"Connection: close", *headers, b"Content-Length: 0"]
    return b"\r\n".join(lines) + b"\r\n\r\n"


class RequestHeads:
    """The request head deadline and the bound on slow first heads per client address, shared by one server's HTTP
    channels (all of it runs on the reactor's thread).

    ``slow`` counts, per address, the connections whose first request head is still incomplete
    :data:`SLOW_HEAD_AFTER_S` after accept. An address holding ``per_address`` of them gets ``429`` for every further
    connection, at accept, until one of them ends (its head completes, its deadline closes it, the client leaves).
    Addresses in ``exempt`` (a TCP-level proxy in front, which forwards every client's bytes as they come) are not
    counted.
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        per_address: int,
        exempt: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network] = (),
        max_body_bytes: int = 25 * 1024 * 1024,
        large_bodies: Sequence[tuple[bytes, int]] = (),
    ):
        self.timeout_s = timeout_s
        self.slow_after_s = min(SLOW_HEAD_AFTER_S, timeout_s / 2)
        self.per_address = per_address
        self.exempt = tuple(exempt)
        self.slow: dict[str, int] = {}
        self.retry_after = b"Retry-After: %d" % math.ceil(timeout_s)
        self.max_body_bytes = max_body_bytes
        self.large_bodies = tuple(large_bodies)

    @classmethod
    def from_settings(cls) -> RequestHeads:
        return cls(
            timeout_s=gateway_setting("HTTP_HEAD_TIMEOUT_MS") / 1000,
            per_address=gateway_setting("HTTP_SLOW_HEADS_PER_ADDRESS"),
            exempt=gateway_setting("HTTP_SLOW_HEADS_EXEMPT"),
            max_body_bytes=gateway_setting("MAX_PAYLOAD_BYTES"),
            large_bodies=_large_body_paths,
        )

    def body_limit(self, path: bytes) -> int:
        """The largest body a request for ``path`` may carry."""
        return max([self.max_body_bytes, *(limit for prefix, limit in self.large_bodies if path.startswith(prefix))])

    def bounded_address(self, peer) -> str | None:
        """The peer's IP address when its connections count toward the bound; None when exempt (or not IP)."""
        host = getattr(peer, "host", None)
        if not self.exempt:
            return host
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return None
        return None if any(address in network for network in self.exempt) else host

    def full(self, address: str) -> bool:
        return self.slow.get(address, 0) >= self.per_address

    def add_slow(self, address: str) -> bool:
        """Count one more slow head of ``address``; False, counting nothing, when it already holds the limit."""
        held = self.slow.get(address, 0)
        if held >= self.per_address:
            return False
        self.slow[address] = held + 1
        if held + 1 == self.per_address:
            logger.warning(
                "HTTP client %s holds %d request heads incomplete after %.1f s (the limit, "
                "OPENCLAW_HTTP_SLOW_HEADS_PER_ADDRESS): its further connections get 429 until one of them ends",
                address,
                self.per_address,
                self.slow_after_s,
            )
        return True

    def remove_slow(self, address: str) -> None:
        held = self.slow[address] - 1
        if held:
            self.slow[address] = held
        else:
            del self.slow[address]


class GatewayHTTPChannel(http.HTTPChannel):
    """Twisted's HTTP/1.1 channel, which Daphne's requests run on, with a deadline for request heads, a bound on slow
    ones per client address, and an answer for overlong lines.

    Twisted's idle timeout restarts with every byte: a client sending one byte of its headers every few seconds
    would hold the connection forever. Each request head must arrive within ``heads.timeout_s``: the first counted
    from accept, each next one on a kept-alive connection from the end of the previous response. At the deadline a
    connection that sent part of its head gets ``408 Request Timeout``; one that sent nothing (an idle kept-alive
    connection, a browser's preconnect) is closed without an answer. Both close as Twisted's idle timeout does
    (``timeoutConnection``: aborted if the peer does not read what it was sent). Once a head is complete nothing
    here runs until its response ends: a request's body has Twisted's idle timeout, and a WebSocket upgrade leaves
    the channel for good.

    Twisted drops the TCP connection when a line passes its 16 KiB limit; a client then learns nothing. An overlong
    request line gets ``414 URI Too Long``, an overlong header ``431``. (Twisted's default channel factory would
    pick HTTP/2 when TLS negotiates it; the gateway listens on plain TCP, where that never happens.)
    """

    def __init__(self, heads: RequestHeads):
        super().__init__()
        self.heads = heads
        self.awaiting_head = False
        # A byte of the awaited head arrived: its timeout answers 408 instead of closing silently.
        self.head_begun = False
        # The head's timer: at most one at a time (for a counted address the slow-head check, then the deadline).
        self.head_timer: IDelayedCall | None = None
        # The address whose count of slow heads includes this connection.
        self.counted_as_slow: str | None = None
        self.gone = False
        # The current request's body: its cap, the raw bytes taken so far (until its end), and whether it was refused.
        self.request_path = b""
        self.body_limit = 0
        self.body_taken: int | None = None
        self.body_refused = False

    def connectionMade(self):
        super().connectionMade()
        address = self.heads.bounded_address(self.transport.getPeer())
        if address is not None and self.heads.full(address):
            self.refuse(TOO_MANY_REQUESTS, "address-limit", self.heads.retry_after)
            return
        if address is None:
            self.await_head(self.heads.timeout_s)
        else:
            # A head complete within the second (nearly all) never needs the deadline's timer.
            self.await_head(self.heads.slow_after_s, self.head_is_slow, address)

    def dataReceived(self, data):
        if self.awaiting_head:
            self.head_begun = True
        super().dataReceived(data)

    def lineReceived(self, line):
        # A request line is the line that made the channel add a request: its target is kept for the body's cap.
        requests = len(self.requests)
        super().lineReceived(line)
        if len(self.requests) > requests:
            parts = line.split(None, 2)
            self.request_path = parts[1] if len(parts) == 3 else b""

    def allHeadersReceived(self):
        self.stop_awaiting_head()
        # Twisted spools a body past 100 kB to a temporary file and Daphne then queues all of it in memory, before
        # any route's own limit can look at it: a body over its cap is refused here, from its declared length before
        # a byte of it is taken, or (chunked) once it has passed the cap.
        self.body_limit = self.heads.body_limit(self.request_path)
        if self.length is not None and self.length > self.body_limit:
            self.refuse_body()
            return
        self.body_taken = 0
        super().allHeadersReceived()

    def rawDataReceived(self, data):
        if self.body_refused:
            return
        if self.body_taken is not None:
            self.body_taken += len(data)
            if self.body_taken > self.body_limit + BODY_FRAMING_SLACK_BYTES:
                self.refuse_body()
                return
        super().rawDataReceived(data)

    def allContentReceived(self):
        self.body_taken = None
        super().allContentReceived()

    def refuse_body(self) -> None:
        self.body_refused = True
        self.body_taken = None
        metrics.record_http_head_refused("body-too-large")
        self.transport.write(bodiless_answer(CONTENT_TOO_LARGE))
        # Nothing more is read: what the client still sends is not taken, and the 413 goes out before the close.
        self.transport.pauseProducing()
        self.loseConnection()

    def requestDone(self, request):
        # Kept alive: the next head's deadline starts now. Pipelined bytes the channel buffered meanwhile are parsed
        # inside super(), and may complete that head at once.
        if self.persistent and not self.gone:
            self.await_head(self.heads.timeout_s)
        super().requestDone(request)

    def connectionLost(self, reason):
        self.gone = True
        self.stop_awaiting_head()
        super().connectionLost(reason)

    def loseConnection(self):
        # Every way the channel ends a connection comes here (400, 414/431, 408, 429, a response with
        # ``Connection: close``): nothing awaits a head any more.
        self.stop_awaiting_head()
        super().loseConnection()

    def timeoutConnection(self):
        # The head deadline, or Twisted's idle timeout when it is shorter (OPENCLAW_HTTP_HEAD_TIMEOUT_MS above 10 s):
        # a head cut short gets 408 whichever ends it. Then Twisted's own ending of an idle connection: a clean close,
        # aborted after ``abortTimeout`` when the peer does not read what is left to send (the 408, a response to a
        # request it pipelined). One ending: the idle timeout must not fire again while the connection closes.
        self.setTimeout(None)
        if self.awaiting_head and self.head_begun:
            metrics.record_http_head_refused("timeout")
            self.transport.write(bodiless_answer(REQUEST_TIMEOUT))
        super().timeoutConnection()

    def lineLengthExceeded(self, line):
        # The channel holds a request from its request line until it is answered (the next one is parsed only
        # then), so none held means the overlong line is a request line.
        self.transport.write(bodiless_answer(HEADER_FIELDS_TOO_LARGE if self.requests else URI_TOO_LONG))
        self.loseConnection()

    # --- the head deadline and the per-address bound ------------------------------------------------------------

    def await_head(self, seconds: float, then=None, *args) -> None:
        """Await a head: ``then(*args)`` in ``seconds`` unless it is complete by then (default: the deadline)."""
        self.awaiting_head = True
        self.head_begun = False
        self.head_timer = self.callLater(seconds, then or self.timeoutConnection, *args)

    def head_is_slow(self, address: str) -> None:
        if not self.heads.add_slow(address):
            self.refuse(TOO_MANY_REQUESTS, "address-limit", self.heads.retry_after)
            return
        self.counted_as_slow = address
        # The deadline counts from accept, also when this check ran late (a busy reactor).
        accepted = self.head_timer.getTime() - self.heads.slow_after_s
        remaining = accepted + self.heads.timeout_s - self.factory.reactor.seconds()
        self.head_timer = self.callLater(max(0.0, remaining), self.timeoutConnection)

    def refuse(self, status: bytes, reason: str, *headers: bytes) -> None:
        metrics.record_http_head_refused(reason)
        self.transport.write(bodiless_answer(status, *headers))
        self.loseConnection()

    def stop_awaiting_head(self) -> None:
        self.awaiting_head = False
        if self.head_timer is not None and self.head_timer.active():
            self.head_timer.cancel()
        self.head_timer = None
        if self.counted_as_slow is not None:
            self.heads.remove_slow(self.counted_as_slow)
            self.counted_as_slow = None


def install_gateway_protocols(server: Server) -> None:
    """Point the factories ``server.run()`` has just built at the gateway's classes; documented attributes only:
    ``Factory.protocol`` (the callable ``buildProtocol`` calls for each connection), ``HTTPFactory.timeOut`` (the
    idle timeout) and autobahn's ``failByDrop`` protocol option."""
    server.ws_factory.protocol = GatewayWebSocketProtocol
    # Frames over the hard size limit get a 1009 close frame instead of a dropped TCP stream.
    server.ws_factory.setProtocolOptions(failByDrop=False)
    server.http_factory.protocol = functools.partial(GatewayHTTPChannel, RequestHeads.from_settings())
    server.http_factory.timeOut = HTTP_IDLE_TIMEOUT_S


def run_gateway_server(
    application,
    *,
    host: str,
    port: int,
    max_message_bytes: int,
    ready_callable=None,
    verbosity: int = 1,
) -> None:
    # Imported here: importing the reactor installs it, which must happen after Daphne chose one.
    from twisted.internet import defer, reactor

    def broadcast_shutdown():
        loop = asyncio.get_event_loop()
        future = asyncio.ensure_future(lifecycle.shutdown("gateway stopping"), loop=loop)
        return defer.Deferred.fromFuture(future)

    reactor.addSystemEventTrigger("before", "shutdown", broadcast_shutdown)

    def on_ready():
        # Server.run() calls this once its factories exist and its port is bound, before the reactor runs: no
        # connection was built yet. ``listening_addresses`` holds the bound (host, port): the real port of port 0.
        install_gateway_protocols(server)
        lifecycle.start_in_background(asyncio.get_event_loop())
        if ready_callable is not None:
            ready_callable(list(server.listening_addresses))

    host_part = host.replace(":", r"\:")
    server = Server(
        application=application,
        endpoints=[f"tcp:port={port}:interface={host_part}"],
        signal_handlers=True,
        websocket_timeout=-1,
        websocket_connect_timeout=20,
        websocket_handshake_timeout=10,
        # Frames up to twice maxPayload reach the consumer, which answers the ones above
        # maxPayload with INVALID_REQUEST and keeps the connection; beyond that Daphne closes 1009.
        websocket_max_message_size=max_message_bytes,
        websocket_max_frame_size=max_message_bytes,
        ping_interval=20,
        ping_timeout=30,
        application_close_timeout=10,
        ready_callable=on_ready,
        verbosity=verbosity,
    )
    server.run()
