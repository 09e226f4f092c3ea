"""Running Daphne for the gateway: close reasons on the wire and a shutdown broadcast.

Daphne 4 drops the ``reason`` of ``websocket.close``; OpenClaw clients show it (for example
``pairing required: … (requestId: …)``), so the protocol class sends it. Before the reactor stops,
every local connection receives the ``shutdown`` event.
"""

from __future__ import annotations

import asyncio
import logging

from daphne import ws_protocol
from daphne.server import Server

from . import lifecycle

logger = logging.getLogger(__name__)

MAX_CLOSE_REASON_BYTES = 123


def truncate_close_reason(reason: str) -> str:
    encoded = reason.encode("utf-8")
    if len(encoded) <= MAX_CLOSE_REASON_BYTES:
        return reason
    return encoded[: MAX_CLOSE_REASON_BYTES - 3].decode("utf-8", errors="ignore") + "..."


class ReasonCarryingWebSocketProtocol(ws_protocol.WebSocketProtocol):
    """Sends protocol close codes (1008, 1002, 1009, …) with their reason.

    Autobahn's ``sendClose`` only admits 1000 and 3000-4999 from applications, so the close frame
    is sent the way Daphne itself sends 1011.
    """

    def _connectionMade(self):
        super()._connectionMade()
        # Frames over the hard size limit get a 1009 close frame instead of a dropped TCP stream.
        self.failByDrop = False

    def handle_reply(self, message):
        if message.get("type") == "websocket.close" and self.state != self.STATE_CONNECTING:
            reason = message.get("reason") or ""
            self.sendCloseFrame(
                code=message.get("code") or 1000,
                reasonUtf8=truncate_close_reason(reason).encode("utf-8") if reason else None,
                isReply=False,
            )
            return
        super().handle_reply(message)


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
