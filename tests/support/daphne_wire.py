"""A WebSocket upgraded by Daphne over a real loopback TCP connection, in this process, driven by hand.

Daphne's server object, its HTTP and WebSocket factories with the gateway's classes installed
(``install_gateway_protocols``), Twisted's TCP transport over the accepted socket and the kernel's own buffers are
the real ones; only the reactor is a clock the test turns: ``read_request`` is the reactor seeing the socket
readable, ``deliver`` the client reading while the reactor writes what Twisted holds.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
from dataclasses import dataclass, field

from daphne.http_protocol import HTTPFactory
from daphne.server import Server
from daphne.ws_protocol import WebSocketFactory
from twisted.internet import tcp
from twisted.internet.testing import MemoryReactorClock

from gateway import daphne_server

# Small kernel buffers, so that a client that stops reading is felt after a few frames.
KERNEL_BUFFER_BYTES = 4096


async def _application(scope, receive, send) -> None:
    # The consumer's side is the test's: it plays Daphne's calls of the protocol's handle_reply.
    await asyncio.Event().wait()


@dataclass
class Wire:
    """One upgraded connection: ``protocol`` on the gateway's side, ``client`` the peer's raw socket."""

    protocol: daphne_server.GatewayWebSocketProtocol
    transport: tcp.Server
    client: socket.socket
    clock: MemoryReactorClock
    loop: asyncio.AbstractEventLoop
    # Whether the opening handshake's answer, the connection's first write, waited for the reactor.
    first_write_waited: bool = False
    received: bytearray = field(default_factory=bytearray)

    def transport_waits_to_write(self) -> bool:
        return self.transport in self.clock.getWriters()

    def deliver(self) -> bytes:
        """The client reads whatever reaches it, while the reactor writes what the transport holds; returns it."""
        start = len(self.received)
        while True:
            self._read_available()
            if not self.transport_waits_to_write():
                break
            if self.transport.doWrite() is not None:  # the transport is done: closed after its last bytes
                self._read_available()
                break
        return bytes(self.received[start:])

    def arrived(self) -> bytes:
        """What reached the client without the reactor writing anything."""
        start = len(self.received)
        self._read_available()
        return bytes(self.received[start:])

    def _read_available(self) -> None:
        while True:
            try:
                chunk = self.client.recv(1 << 20)
            except BlockingIOError:
                return
            if not chunk:
                return
            self.received += chunk

    def close(self) -> None:
        self.client.close()
        if not self.transport.disconnected:
            self.transport.socket.close()
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()
        asyncio.set_event_loop(None)


def open_wire(*, max_buffered_bytes: int, settings) -> Wire:
    """A client connected, upgraded and accepted, with the 101 answer read; ``settings`` is pytest-django's."""
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "MAX_BUFFERED_BYTES": max_buffered_bytes}
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # where Daphne starts the application instance
    clock = MemoryReactorClock()
    server = Server(application=_application, endpoints=["tcp:port=0:interface=127.0.0.1"])
    server.connections = {}  # what Server.run() sets up before it builds the factories
    server.http_factory = HTTPFactory(server)
    server.ws_factory = WebSocketFactory(server, server="daphne")
    server.ws_factory.setProtocolOptions(allowNullOrigin=True)
    daphne_server.install_gateway_protocols(server)
    server.http_factory.reactor = clock

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, KERNEL_BUFFER_BYTES)
        client.connect(listener.getsockname())
        accepted, address = listener.accept()
    accepted.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, KERNEL_BUFFER_BYTES)
    client.setblocking(False)

    channel = server.http_factory.buildProtocol(address)
    transport = tcp.Server(accepted, channel, address, None, 0, clock)
    channel.makeConnection(transport)
    key = base64.b64encode(os.urandom(16)).decode()
    client.sendall(
        f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    for _ in range(10):  # the reactor reading the request: Daphne upgrades the connection
        if transport.protocol is not channel:
            break
        transport.doRead()
    assert transport.protocol is not channel, "Daphne did not upgrade the connection"
    protocol = transport.protocol
    protocol.handle_reply({"type": "websocket.accept"})
    wire = Wire(protocol=protocol, transport=transport, client=client, clock=clock, loop=loop)
    wire.first_write_waited = wire.transport_waits_to_write()
    answer = wire.deliver()
    assert answer.startswith(b"HTTP/1.1 101 "), answer
    assert protocol.state == protocol.STATE_OPEN
    return wire


def server_frames(data: bytes) -> list[tuple[int, bytes]]:
    """(opcode, payload) of each unmasked frame in ``data`` (what a server sends), whole frames only."""
    frames = []
    at = 0
    while at + 2 <= len(data):
        opcode, length = data[at] & 0x0F, data[at + 1] & 0x7F
        at += 2
        if length == 126:
            (length,) = struct.unpack("!H", data[at : at + 2])
            at += 2
        elif length == 127:
            (length,) = struct.unpack("!Q", data[at : at + 8])
            at += 8
        frames.append((opcode, data[at : at + length]))
        at += length
    return frames
