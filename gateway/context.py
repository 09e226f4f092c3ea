"""What an RPC handler knows about its caller."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from channels.layers import get_channel_layer

from . import scopes as sc
from .audit import Actor
from .events import subscription_group


@dataclass
class RpcContext:
    conn_id: str
    channel_name: str
    role: str
    scopes: list[str]
    auth_method: str
    client_id: str
    client_mode: str
    remote_ip: str | None = None
    device_id: str | None = None
    node_id: str | None = None
    commands: list[str] = field(default_factory=list)
    # node.invoke.request ids this node connection still owes a result for → (reply channel, command).
    pending_invokes: dict[str, tuple[str, str]] = field(default_factory=dict)
    # The latest progress forward of each of those invokes (frames of one connection are answered
    # concurrently: the result waits for it, so it never overtakes the progress sent before it).
    progress_forwards: dict[str, asyncio.Task] = field(default_factory=dict)
    # Opt-in event families of this connection (sessions.subscribe adds "sessions").
    subscriptions: set[str] = field(default_factory=set)

    @property
    def is_admin(self) -> bool:
        return self.role == sc.ROLE_OPERATOR and sc.ADMIN in self.scopes

    def has_scope(self, scope: str) -> bool:
        return sc.scope_satisfied(self.scopes, scope)

    async def subscribe(self, subscription: str) -> None:
        if subscription not in self.subscriptions:
            self.subscriptions.add(subscription)
            await get_channel_layer().group_add(subscription_group(subscription), self.channel_name)

    async def unsubscribe(self, subscription: str) -> None:
        if subscription in self.subscriptions:
            self.subscriptions.discard(subscription)
            await get_channel_layer().group_discard(subscription_group(subscription), self.channel_name)

    def actor(self) -> Actor:
        label = f"device:{self.device_id}" if self.device_id else f"conn:{self.conn_id}"
        return Actor(
            label=label,
            scopes=tuple(self.scopes),
            device_id=self.device_id,
            conn_id=self.conn_id,
        )
