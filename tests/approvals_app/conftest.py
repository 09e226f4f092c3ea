"""Personas and wires of the approvals tests.

* ``published``: what the services publish after commit, captured where it would leave for the channel
  layer (events for the broadcast group, notifications for the gateway processes).
* ``wire(ctx, method, params)``: a request through the gateway's own path (scope check, params validation,
  the handler, its database hop), answered with the ``res`` frame.
* ``operator_socket(scopes)``: a gateway consumer of an operator connection whose frames are recorded;
  ``deliver(published, sockets)`` fans the captured broadcasts out to them as a gateway process does.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from concurrent.futures import Future
from typing import Any

import pytest
from django.utils import timezone

from approvals_app import events as approval_events
from devices_app.models import PairedDevice
from gateway import broadcast
from gateway import scopes as sc
from gateway.audit import Actor
from gateway.consumers import GatewayConsumer
from gateway.context import RpcContext
from gateway.dispatch import run_request
from gateway.events import BROADCAST_GROUP, PublicationBatch
from gateway.protocol import RequestFrame

NODE_ID = "e" * 64
CWD = "/srv/work"


class Published(list):
    """``(kind, target, message)`` items in the order the services published them."""

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        return [(m["event"], m["payload"]) for kind, target, m in self if m.get("type") == "gateway.event"]

    def names(self) -> list[str]:
        return [event for event, _ in self.events()]

    def notifications(self) -> list[dict[str, Any]]:
        return [m for kind, target, m in self if m.get("type") == approval_events.APPROVAL_SETTLED]


@pytest.fixture
def published(monkeypatch) -> Published:
    sent = Published()

    class Recording(PublicationBatch):
        def post(self, *, what: str) -> Future:
            # Round-tripped through JSON, as the channel layer would carry them.
            sent.extend(json.loads(json.dumps(self.items)))
            self.items.clear()
            done: Future = Future()
            done.set_result(None)
            return done

    monkeypatch.setattr(approval_events, "PublicationBatch", Recording)
    return sent


def ctx(*scopes: str, conn_id: str = "conn-1", device_id: str | None = None) -> RpcContext:
    """An operator connection with these scopes (none given: operator.approvals)."""
    return RpcContext(
        conn_id=conn_id,
        channel_name=f"inmemory!{conn_id}",
        role=sc.ROLE_OPERATOR,
        scopes=list(scopes or [sc.APPROVALS]),
        auth_method="device-token" if device_id else "token",
        client_id="test",
        client_mode="test",
        device_id=device_id,
    )


def wire(context: RpcContext, method: str, params: Any = None) -> dict[str, Any]:
    frame = RequestFrame(type="req", id="r1", method=method, params=params if params is not None else {})
    return asyncio.run(run_request(context, frame))


def refusal(response: dict[str, Any]) -> tuple[str, str]:
    assert response["ok"] is False, response
    return response["error"]["code"], response["error"]["message"]


class RecordingSocket:
    """What a connection's client would receive (Daphne's side of a gateway consumer)."""

    def __init__(self, scopes: list[str], role: str = sc.ROLE_OPERATOR):
        consumer = GatewayConsumer()
        consumer.phase = "open"
        consumer.seq = 0
        consumer.conn_id = f"conn-{uuid.uuid4().hex[:8]}"
        consumer.ctx = RpcContext(
            conn_id=consumer.conn_id,
            channel_name=f"inmemory!{consumer.conn_id}",
            role=role,
            scopes=scopes,
            auth_method="token",
            client_id="test",
            client_mode="test",
        )
        self.consumer = consumer
        self.frames: list[dict[str, Any]] = []

        async def send(text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False) -> None:
            self.frames.append(json.loads(text_data))

        async def base_send(message: dict[str, Any]) -> None:
            # Events dropped for a slow client (drop_if_slow) go to Daphne's protocol with a marker.
            self.frames.append(json.loads(message["text"]))

        consumer.send = send
        consumer.base_send = base_send

    def events(self) -> list[str]:
        return [frame["event"] for frame in self.frames if frame.get("type") == "event"]


def operator_socket(*scopes: str, role: str = sc.ROLE_OPERATOR) -> RecordingSocket:
    return RecordingSocket(list(scopes), role=role)


def deliver(sent: Published, sockets: list[RecordingSocket]) -> None:
    """The captured broadcasts, fanned out to these connections as their gateway process would."""

    async def fan_out() -> None:
        for kind, target, message in sent:
            if kind == "group" and target == BROADCAST_GROUP:
                await broadcast.fan_out(message, [s.consumer for s in sockets])

    asyncio.run(fan_out())


@pytest.fixture
def node() -> PairedDevice:
    return PairedDevice.objects.create(
        device_id=NODE_ID,
        public_key="pk-node",
        display_name="Build node",
        roles=[sc.ROLE_NODE],
        approved_at=timezone.now(),
    )


@pytest.fixture
def operator_actor() -> Actor:
    return Actor(label="device:op", scopes=(sc.APPROVALS,), device_id="op", conn_id="conn-op")


def ask(**overrides: Any) -> dict[str, Any]:
    """Keyword arguments of ``exec_approval_request`` for a command the gateway runs."""
    fields: dict[str, Any] = dict(
        command="git push origin main",
        argv=None,
        cwd=CWD,
        host="gateway",
        node_id=None,
        agent_id="main",
        session_key="agent:main:main",
        session_id="window-1",
        run_id="run-1",
        tool_call_id="call-1",
        timeout_ms=None,
        requested_by=Actor(label="run:run-1", scopes=()),
        security="allowlist",
        ask="on-miss",
    )
    fields.update(overrides)
    return fields
