"""Running Daphne for the gateway: close reasons on the wire, slow consumers and a shutdown broadcast.

Daphne 4 drops the ``reason`` of ``websocket.close``; OpenClaw clients show it (for example
``pairing required: … (requestId: …)``), so the protocol class sends it. Before the reactor stops,
every local connection receives the ``shutdown`` event.

Frames go to the kernel as they are sent when nothing is queued before them (:func:`write_now`), instead
of waiting for the reactor's next turn: Twisted would register the socket for writability, write on the
next turn and unregister it, two ``epoll_ctl`` calls and a loop turn per frame (about a tenth of the
gateway's time per call under load).

Slow consumers (OpenClaw's policy, ``policy.maxBufferedBytes`` in hello-ok): Twisted keeps whatever
the socket did not take in a buffer of its own, which grows for as long as a client does not read.
Before each frame the protocol looks at that buffer; past ``MAX_BUFFERED_BYTES`` a frame published
as droppable (``dropIfSlow``) is skipped, any other closes the connection with 1008 ``slow
consumer``. Nothing more is written to it, and the close handshake waits at most
:data:`SLOW_CONSUMER_CLOSE_TIMEOUT_S` before the TCP connection is aborted, which frees the buffer.
"""

from __future__ import annotations

import asyncio
import logging

from daphne import server as daphne_server
from daphne import ws_protocol
from daphne.http_protocol import HTTPFactory
from daphne.server import Server
from twisted.internet import abstract

from . import lifecycle
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


def unsent_bytes(transport) -> int:
    """Bytes written to ``transport`` that the kernel has not accepted yet (Twisted's own buffer).

    Protocol wrappers (``twisted.protocols.policies``) hold the real transport in ``.transport``; the
    file descriptor at the bottom keeps ``dataBuffer`` (from ``offset`` on) and the writes queued
    since its last flush. A transport that is gone (``None``) holds nothing.
    """
    while transport is not None and not isinstance(transport, abstract.FileDescriptor):
        transport = getattr(transport, "transport", None)
    if transport is None:
        return 0
    return len(transport.dataBuffer) - transport.offset + transport._tempDataLen


def write_now(transport, data: bytes) -> bool:
    """Hand ``data`` to the kernel now, queuing only what it does not take; False when the caller must
    write the usual way (not a plain TCP transport, data already queued, closing, its producer paused).

    Order is kept: the fast path is taken only when nothing written earlier is still queued. Flow control
    too: what the kernel does not take is queued by ``transport.write``, which pauses the producer (the
    upgraded HTTP channel: reading from the client) when the queue grows, as for any write.
    """
    if not isinstance(transport, abstract.FileDescriptor) or getattr(transport, "TLS", True):
        return False
    if (
        not transport.connected
        or transport.disconnecting
        or transport._writeDisconnecting
        or transport._writeDisconnected
        or transport.producerPaused
        or len(transport.dataBuffer) - transport.offset
        or transport._tempDataLen
    ):
        return False
    sent = transport.writeSomeData(data)
    if isinstance(sent, Exception) or sent < 0:
        # The connection is gone: queued the usual way, Twisted's next write finds out and closes it.
        transport.write(data)
    elif sent < len(data):
        transport.write(data[sent:])
    return True


def over_buffer_limit(unsent: int, limit: int) -> bool:
    # The frame about to go is not counted: like OpenClaw, a connection at the limit still gets one
    # more frame, so the buffer stays under the limit plus one frame.
    return unsent > limit


class ReasonCarryingWebSocketProtocol(ws_protocol.WebSocketProtocol):
    """Sends protocol close codes (1008, 1002, 1009, …) with their reason, and closes slow consumers.

    Autobahn's ``sendClose`` only admits 1000 and 3000-4999 from applications, so the close frame
    is sent the way Daphne itself sends 1011.
    """

    def _connectionMade(self):
        super()._connectionMade()
        # Frames over the hard size limit get a 1009 close frame instead of a dropped TCP stream.
        self.failByDrop = False
        self.max_buffered_bytes = gateway_setting("MAX_BUFFERED_BYTES")
        self.dropped_while_slow = 0

    def sendData(self, data, sync=False, chopsize=None):
        if sync or chopsize or self.send_queue or not write_now(self.transport, data):
            super().sendData(data, sync, chopsize)
            return
        # What autobahn counts after its own write.
        if self.state == self.STATE_OPEN:
            self.trafficStats.outgoingOctetsWireLevel += len(data)
        elif self.state in (self.STATE_CONNECTING, self.STATE_PROXY_CONNECTING):
            self.trafficStats.preopenOutgoingOctetsWireLevel += len(data)
        if self.logOctets:
            self.logTxOctets(data, False)

    def handle_reply(self, message):
        if message.get("type") == "websocket.send" and self.state == self.STATE_OPEN:
            if self._refuse_slow_consumer_frame(message):
                return
        if message.get("type") == "websocket.close" and self.state != self.STATE_CONNECTING:
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
        unsent = unsent_bytes(self.transport)
        if not over_buffer_limit(unsent, self.max_buffered_bytes):
            self.dropped_while_slow = 0
            return False
        if message.get(DROP_IF_SLOW_KEY):
            if not self.dropped_while_slow:
                logger.warning(
                    "WebSocket %s: %d bytes unsent (limit %d), dropping droppable events",
                    self.client_addr,
                    unsent,
                    self.max_buffered_bytes,
                )
            self.dropped_while_slow += 1
            return True
        logger.warning(
            "WebSocket %s: %d bytes unsent (limit %d), closing as a slow consumer",
            self.client_addr,
            unsent,
            self.max_buffered_bytes,
        )
        # The close frame queues behind what is buffered; a client that never reads it is cut off
        # when the close handshake times out (autobahn aborts the TCP connection, freeing the buffer).
        self.closeHandshakeTimeout = SLOW_CONSUMER_CLOSE_TIMEOUT_S
        self.sendCloseFrame(
            code=SLOW_CONSUMER_CLOSE_CODE, reasonUtf8=SLOW_CONSUMER_CLOSE_REASON.encode("utf-8"), isReply=False
        )
        return True


# A connection that has not sent a complete request line and headers within this many seconds
# (garbage, a port scanner, a stalled client) is closed, instead of Twisted's 60 s. Upgraded
# WebSockets are not affected: their channel no longer times out once the upgrade request arrived.
HTTP_IDLE_TIMEOUT_S = 10


class GatewayHTTPFactory(HTTPFactory):
    """Daphne's HTTP side with a short idle timeout and an answer for overlong request lines.

    Twisted drops the TCP connection when a line passes its 16 KiB limit; a client then learns
    nothing. An overlong request line gets ``414 URI Too Long``, an overlong header ``431``.
    """

    def __init__(self, server):
        super().__init__(server)
        self.timeOut = HTTP_IDLE_TIMEOUT_S

    def buildProtocol(self, addr):
        protocol = super().buildProtocol(addr)
        # The generic (HTTP/1.1 or HTTP/2) wrapper holds the HTTP/1.1 channel that parses lines.
        channel = getattr(protocol, "_channel", protocol)
        channel.lineLengthExceeded = lambda line, channel=channel: _line_too_long(channel)
        return protocol


def _line_too_long(channel) -> None:
    # Twisted's channel still waits for its request line while its private first-line flag is set.
    if getattr(channel, "_HTTPChannel__first_line", 0):
        status = b"414 URI Too Long"
    else:
        status = b"431 Request Header Fields Too Large"
    channel.transport.write(b"HTTP/1.1 " + status + b"\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    channel.transport.loseConnection()


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

    ws_protocol.WebSocketFactory.protocol = ReasonCarryingWebSocketProtocol
    # Daphne builds its HTTP factory inside Server.run(); this is the class it looks up.
    daphne_server.HTTPFactory = GatewayHTTPFactory

    def broadcast_shutdown():
        loop = asyncio.get_event_loop()
        future = asyncio.ensure_future(lifecycle.shutdown("gateway stopping"), loop=loop)
        return defer.Deferred.fromFuture(future)

    reactor.addSystemEventTrigger("before", "shutdown", broadcast_shutdown)

    def on_ready():
        lifecycle.start_in_background(asyncio.get_event_loop())
        if ready_callable is not None:
            ready_callable()

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
