"""Broadcast events cost one channel-layer message per gateway process, not one per connection.

Each gateway process subscribes one process-level channel to :data:`events.BROADCAST_GROUP` (the
channel that also receives :data:`state.PROCESS_GROUP` notifications, see ``lifecycle.py``). The
process encodes a broadcast once and hands it to every local connection, which applies its own
scope gate (``visibility.event_visible``, as for a copy that came through the channel layer) and
stamps its own ``seq``. Subscription-group and direct events still travel per connection.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

from . import state
from .protocol import DROP_IF_SLOW_KEY, EncodedEvent

logger = logging.getLogger(__name__)

# The channel-layer message type of events (``events.broadcast_message``).
EVENT_MESSAGE_TYPE = "gateway.event"


class BroadcastReceiver(Protocol):
    async def send_broadcast(self, encoded: EncodedEvent) -> None: ...


def is_broadcast(message: dict[str, Any]) -> bool:
    return message.get("type") == EVENT_MESSAGE_TYPE


async def fan_out(message: dict[str, Any], connections: Iterable[BroadcastReceiver] | None = None) -> int:
    """Deliver one broadcast-group message to this process's connections; returns how many were offered it.

    A connection that fails (or closed meanwhile) does not keep the event from the others.
    """
    encoded = EncodedEvent.of(
        message["event"],
        message["payload"],
        state_version=message.get("stateVersion"),
        drop_if_slow=bool(message.get(DROP_IF_SLOW_KEY)),
    )
    offered = 0
    for consumer in state.local_connections if connections is None else connections:
        offered += 1
        try:
            await consumer.send_broadcast(encoded)
        except Exception:
            logger.exception("failed to deliver %s to a local connection", encoded.event)
    return offered
