"""Live updates for the console's pages, over a WebSocket that a logged-in Django user opens.

Transport only: the consumer joins the gateway's ``sessions`` subscription group (the same events an
operator client subscribed with ``sessions.subscribe`` receives) and passes ``sessions.changed`` and
``chat`` on as ``{"event", "payload"}`` frames. It acts on nothing it receives.
"""

from __future__ import annotations

import json
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer

from openclaw_site.gateway.broadcast import EVENT_MESSAGE_TYPE
from openclaw_site.gateway.events import subscription_group

SESSIONS_GROUP = subscription_group("sessions")
FORWARDED_EVENTS = frozenset({"sessions.changed", "chat"})
# Closed before accept: the browser sees a failed connection; the code names why in the server's log.
CLOSE_NOT_LOGGED_IN = 4401


class ConsoleConsumer(AsyncWebsocketConsumer):
    joined = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_NOT_LOGGED_IN)
            return
        await self.channel_layer.group_add(SESSIONS_GROUP, self.channel_name)
        self.joined = True
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(SESSIONS_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The page has nothing to say; whatever it sends is ignored."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        if message.get("type") == EVENT_MESSAGE_TYPE:
            await self._forward(message)
            return
        await super().dispatch(message)  # the websocket.* messages

    async def _forward(self, message: dict[str, Any]) -> None:
        # A direct copy goes to the RPC connection that asked for the work; subscribers get their own.
        if message.get("direct") or message.get("event") not in FORWARDED_EVENTS:
            return
        await self.send(text_data=json.dumps({"event": message["event"], "payload": message.get("payload")}))
