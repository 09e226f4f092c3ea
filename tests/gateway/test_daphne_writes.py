"""Frames written at once: handed to the kernel when nothing is queued before them, the rest queued the
usual Twisted way, in order, with its flow control; the usual path wherever the fast one does not apply.

The transport is Twisted's own file descriptor over a fake socket that takes a set number of bytes per
write, so the buffer arithmetic and the reactor registrations are the real ones.
"""

from __future__ import annotations

from typing import Any

import pytest
from daphne import ws_protocol
from twisted.internet import abstract, main
from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock

from gateway import daphne_server


class PlainSocket(abstract.FileDescriptor):
    """A connected plain-TCP descriptor whose kernel takes up to ``takes`` bytes per write (None: all)."""

    TLS = False

    def __init__(self, takes: int | None = None) -> None:
        self.reactor = MemoryReactorClock()
        super().__init__(reactor=self.reactor)
        self.connected = 1
        self.takes = takes
        self.lost = False
        self.sent: list[bytes] = []

    def getPeer(self):
        return IPv4Address("TCP", "127.0.0.1", 50000)

    def getHost(self):
        return IPv4Address("TCP", "127.0.0.1", 18789)

    def writeSomeData(self, data) -> Any:
        if self.lost:
            return main.CONNECTION_LOST
        taken = bytes(data) if self.takes is None else bytes(data)[: self.takes]
        self.sent.append(taken)
        return len(taken)

    def waiting_to_write(self) -> bool:
        return self in self.reactor.getWriters()


def test_a_frame_with_nothing_queued_before_it_goes_to_the_kernel_without_a_reactor_turn():
    sock = PlainSocket()
    assert daphne_server.write_now(sock, b"frame")
    assert sock.sent == [b"frame"]
    assert daphne_server.unsent_bytes(sock) == 0
    assert not sock.waiting_to_write()  # no writability registration to make and undo


def test_what_the_kernel_does_not_take_is_queued_and_later_frames_queue_behind_it():
    sock = PlainSocket(takes=3)
    assert daphne_server.write_now(sock, b"first")
    assert sock.sent == [b"fir"]
    assert daphne_server.unsent_bytes(sock) == 2
    assert sock.waiting_to_write()

    # Something is queued: the next frame goes the usual way, behind it.
    assert not daphne_server.write_now(sock, b"second")
    sock.write(b"second")
    sock.takes = None
    sock.doWrite()
    assert b"".join(sock.sent) == b"firstsecond"
    assert daphne_server.unsent_bytes(sock) == 0
    assert not sock.waiting_to_write()


def test_a_lost_connection_queues_the_frame_for_twisted_to_find_out():
    sock = PlainSocket()
    sock.lost = True
    assert daphne_server.write_now(sock, b"frame")
    assert daphne_server.unsent_bytes(sock) == len(b"frame")
    assert sock.waiting_to_write()  # Twisted's own write then reports the loss and closes the connection


def test_the_queue_pauses_the_producer_as_any_write_does_and_a_paused_producer_takes_the_usual_path():
    class Producer:
        paused = 0

        def pauseProducing(self):
            self.paused += 1

        def resumeProducing(self):
            pass

        def stopProducing(self):
            pass

    sock = PlainSocket(takes=0)
    producer = Producer()
    sock.registerProducer(producer, True)  # as Twisted's HTTP channel is, on the upgraded connection
    assert daphne_server.write_now(sock, b"x" * (sock.bufferSize + 1))
    assert producer.paused == 1 and sock.producerPaused

    sock.dataBuffer, sock.offset, sock._tempDataBuffer, sock._tempDataLen = b"", 0, [], 0
    assert not daphne_server.write_now(sock, b"frame")  # still paused: nothing skips its resumption


@pytest.mark.parametrize("state", ["tls", "disconnecting", "write-disconnected", "not-connected", "no-descriptor"])
def test_the_fast_path_does_not_apply_and_writes_nothing(state):
    sock = PlainSocket()
    transport: Any = sock
    if state == "tls":
        sock.TLS = True
    elif state == "disconnecting":
        sock.disconnecting = True
    elif state == "write-disconnected":
        sock._writeDisconnected = True
    elif state == "not-connected":
        sock.connected = 0
    else:
        transport = object()
    assert not daphne_server.write_now(transport, b"frame")
    assert sock.sent == []


def test_the_protocol_sends_frames_at_once_and_counts_them_as_autobahn_does():
    factory = ws_protocol.WebSocketFactory(type("Server", (), {"protocol_connected": lambda self, p: None})())
    factory.protocol = daphne_server.ReasonCarryingWebSocketProtocol
    protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
    sock = PlainSocket()
    protocol.makeConnection(sock)
    protocol.state = protocol.STATE_OPEN
    protocol.client_addr = ["127.0.0.1", 50000]
    before = protocol.trafficStats.outgoingOctetsWireLevel

    protocol.handle_reply({"type": "websocket.send", "text": "hello"})

    assert sock.sent == [bytes([0x81, 5]) + b"hello"]  # one unmasked text frame, already on its way
    assert not sock.waiting_to_write()
    assert protocol.trafficStats.outgoingOctetsWireLevel == before + 7
