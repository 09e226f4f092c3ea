"""OpenClaw's own node host (``openclaw node run`` from the workplace's ``openclaw-cli`` tool), unmodified, as a worker
host of the gateway under test: started with worker runs enabled in a HOME of its own, through any URL (a TCP proxy,
so a test can drop and re-open the same process's connection), approved, and watched from the gateway's side — its
connection, its declaration, the bundle downloads the gateway served it — since its own state is OpenClaw's.

    host = OpenClawNodeHost.start(gateway, port=proxy.port)
    host.approve()                          # the pairing request it made, approved as an operator would
    host.gateway_folder() / "bundles"       # <home>/.openclaw/node-host/<gatewayNamespace>/…
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

from django.db import connections

from devices_app.models import DevicePairingRequest
from devices_app.services import pairing
from gateway.audit import Actor
from gateway.models import GatewayConnection
from workers_app.models import NodeWorkerHost

from .openclaw_node_process import OpenClawNodeProcess

WAIT_S = 90.0


def closing_connections[T](fn: Callable[..., T]) -> Callable[..., T]:
    """A read that a scenario runs in a worker thread (``asyncio.to_thread``): that thread's database connection is
    closed after it (left open, it would keep the test database from being dropped)."""

    @functools.wraps(fn)
    def read(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            if threading.current_thread() is not threading.main_thread():
                connections.close_all()

    return read


def wait_for(predicate, timeout: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout} s")
        time.sleep(0.1)


class OpenClawNodeHost(OpenClawNodeProcess):
    def approve(self) -> str:
        """Approve the pairing request it made; its node id once it is connected and declared a worker host."""
        wait_for(
            lambda: DevicePairingRequest.objects.filter(role="node", status="pending").exists(),
            what="OpenClaw's node host's pairing request",
        )
        request = DevicePairingRequest.objects.get(role="node", status="pending")
        pairing.pairing_request_approve(request_id=str(request.pk), actor=Actor.system("test"))
        self.node_id = request.device_id
        wait_for(lambda: self.connection() is not None, what="OpenClaw's node host's worker-host declaration")
        return self.node_id

    @closing_connections
    def connection(self) -> str | None:
        """The id of its live connection once that connection declared a worker host (None until then)."""
        live = GatewayConnection.objects.filter(role="node", node_id=self.node_id).values_list("conn_id", flat=True)
        conn_ids = {str(conn_id) for conn_id in live}
        host = NodeWorkerHost.objects.filter(node_id=self.node_id, conn_id__in=conn_ids).first()
        return host.conn_id if host is not None and host.bundle_status else None

    @closing_connections
    def wait_reconnected(self, previous: str | None, timeout: float = WAIT_S) -> str:
        """Its next connection after ``previous``, once that one declared and answered the retain."""
        wait_for(lambda: self.connection() not in (None, previous), timeout, "OpenClaw's node host's reconnect")
        return self.connection() or ""

    @closing_connections
    def wait_for_workers_idle(self, timeout: float = WAIT_S) -> None:
        """Every slot free in what it last declared (OpenClaw's node host declares again when capacity changes)."""

        def idle() -> bool:
            host = NodeWorkerHost.objects.filter(node_id=self.node_id).first()
            capacity = (host.worker_host or {}).get("capacity") if host is not None else None
            return bool(capacity) and capacity["available"] == capacity["total"]

        wait_for(idle, timeout, "OpenClaw's node host's idle workers")
