"""Live updates for the console's pages, over a WebSocket that a logged-in Django user opens.

Transport only: the consumer joins the gateway's ``sessions`` subscription group (the same events an
operator client subscribed with ``sessions.subscribe`` receives) and passes ``sessions.changed``, ``chat``
and the ``agent`` events of stream ``tool`` (a tool call starting, its result) on as ``{"event",
"payload"}`` frames. It acts on nothing it receives.

A page asks for its topics in the query string (``?topics=pairing,approvals``; none means ``sessions``).
Each topic is joined only with the scope an operator client needs for those events (the user's, from their
Django permissions): ``sessions`` with ``operator.read``; ``pairing``, the ``device.pair.*`` and ``node.pair.*``
events, with ``operator.pairing``; ``approvals``, the ``exec.approval.requested|resolved`` events, with
``operator.approvals``; ``nodes``, the ``presence`` event (a connection came or went: a node connecting after its
approval), with ``operator.read``. The last three join the gateway's broadcast group.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from autobahn.exception import Disconnected
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from gateway import scopes as sc
from gateway.broadcast import EVENT_MESSAGE_TYPE
from gateway.events import BROADCAST_GROUP, subscription_group
from gateway.user_scopes import user_scopes

SESSIONS_GROUP = subscription_group("sessions")
FORWARDED_EVENTS = frozenset({"sessions.changed", "chat", "agent"})
PAIRING_EVENTS = frozenset(
    {"device.pair.requested", "device.pair.resolved", "node.pair.requested", "node.pair.resolved"}
)
APPROVAL_EVENTS = frozenset({"exec.approval.requested", "exec.approval.resolved"})
NODE_EVENTS = frozenset({"presence"})
# Of a turn's ``agent`` events, the page needs the tool steps only (its text comes with ``chat``).
AGENT_STREAMS = frozenset({"tool"})
# Closed before accept: the browser sees a failed connection; the code names why in the server's log.
CLOSE_NOT_LOGGED_IN = 4401


def _topics(scope: dict[str, Any]) -> set[str]:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    asked = {topic for value in query.get("topics", []) for topic in value.split(",") if topic}
    return asked or {"sessions"}


class ConsoleConsumer(AsyncWebsocketConsumer):
    joined = False
    groups_joined: tuple[str, ...] = ()
    forwarded: frozenset[str] = frozenset()

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_NOT_LOGGED_IN)
            return
        topics = _topics(self.scope)
        held = await database_sync_to_async(user_scopes)(user)
        groups: list[str] = []
        forwarded: set[str] = set()
        if "sessions" in topics and sc.scope_satisfied(held, sc.READ):
            groups.append(SESSIONS_GROUP)
            forwarded |= FORWARDED_EVENTS
        if "pairing" in topics and sc.scope_satisfied(held, sc.PAIRING):
            forwarded |= PAIRING_EVENTS
        if "approvals" in topics and sc.scope_satisfied(held, sc.APPROVALS):
            forwarded |= APPROVAL_EVENTS
        if "nodes" in topics and sc.scope_satisfied(held, sc.READ):
            forwarded |= NODE_EVENTS
        if forwarded & (PAIRING_EVENTS | APPROVAL_EVENTS | NODE_EVENTS):
            groups.append(BROADCAST_GROUP)
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined, self.forwarded = tuple(groups), frozenset(forwarded)
        self.joined = True
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.joined:
            for group in self.groups_joined:
                await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The page has nothing to say; whatever it sends is ignored."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        if message.get("type") == EVENT_MESSAGE_TYPE:
            await self._forward(message)
            return
        await super().dispatch(message)  # the websocket.* messages

    async def _forward(self, message: dict[str, Any]) -> None:
        # A direct copy goes to the RPC connection that asked for the work; subscribers get their own.
        if message.get("direct") or message.get("event") not in self.forwarded:
            return
        if message["event"] == "agent" and (message.get("payload") or {}).get("stream") not in AGENT_STREAMS:
            return
        try:
            await self.send(text_data=json.dumps({"event": message["event"], "payload": message.get("payload")}))
        except Disconnected:
            # The page went away before its disconnect reached this consumer (an event got there first): nothing
            # is wrong, and the disconnect that follows leaves the groups.
            pass
