"""Events the gateway core publishes, built server-side and sent only after commit.

Every authenticated connection of every gateway process is in the ``gateway.broadcast`` group;
each consumer filters by role and scope and stamps its own ``seq``.
"""

from __future__ import annotations

import hashlib
import logging
from concurrent.futures import Future
from typing import Any

from channels.layers import get_channel_layer
from django.db import transaction

from . import publisher
from .protocol import DROP_IF_SLOW_KEY
from .registry import registry

logger = logging.getLogger(__name__)

BROADCAST_GROUP = "gateway.broadcast"
# A notification riding on an event message, handled by each connection after it sent the event to
# its client (state.on_delivered). Never part of the frame a client receives.
FOLLOW_UP_KEY = "followUp"


# The exact subscription an event was published to, when that is one member of a family (one session's
# messages): a connection receives it only while it holds that subscription, so what was already on its way
# when it unsubscribed is dropped.
SUBSCRIPTION_KEY = "subscription"


def subscription_group(subscription: str) -> str:
    """Connections that opted in to an event family (e.g. ``sessions``) join this group."""
    return f"gateway.sub.{subscription}"


def keyed_subscription(family: str, key: str) -> str:
    """The subscription to one member of a family (``session.messages`` of one session key): hashed, since a
    group name takes only ``[a-zA-Z0-9._-]``, under 100 characters, and a key may be 300 of any."""
    return f"{family}.{hashlib.sha256(key.encode('utf-8')).hexdigest()[:32]}"


def event_group(event: str) -> str:
    spec = registry.events.get(event)
    if spec is not None and spec.subscription is not None:
        return subscription_group(spec.subscription)
    return BROADCAST_GROUP


# Targeted at one node connection, never broadcast; listed so hello-ok advertises it.
EVENT_NODE_INVOKE_REQUEST = registry.event("node.invoke.request", scope=None, operators_only=False)


def broadcast_message(
    event: str,
    payload: Any,
    *,
    state_version: dict | None = None,
    drop_if_slow: bool = False,
    follow_up: dict | None = None,
) -> dict:
    """``drop_if_slow``: a connection past ``maxBufferedBytes`` skips this event (its ``seq`` is
    spent, so the client sees a gap and refetches) instead of being closed as a slow consumer.
    ``follow_up``: a notification each receiving connection handles once it sent the event
    (:data:`FOLLOW_UP_KEY`; only events that are not dropped when slow, and not broadcasts)."""
    message = {"type": "gateway.event", "event": event, "payload": payload}
    if state_version is not None:
        message["stateVersion"] = state_version
    if drop_if_slow:
        message[DROP_IF_SLOW_KEY] = True
    if follow_up is not None:
        if drop_if_slow or event_group(event) == BROADCAST_GROUP:
            raise ValueError("a follow-up rides only on subscription or direct events that are never dropped")
        message[FOLLOW_UP_KEY] = follow_up
    return message


def publish_rollback_unsafe(
    event: str,
    payload: Any,
    *,
    state_version: dict | None = None,
    drop_if_slow: bool = False,
    follow_up: dict | None = None,
) -> None:
    """Send now, whatever the surrounding transaction does. Prefer :func:`publish_on_commit`."""
    message = broadcast_message(
        event, payload, state_version=state_version, drop_if_slow=drop_if_slow, follow_up=follow_up
    )
    group = event_group(event)
    publisher.post(lambda: get_channel_layer().group_send(group, message), what=event)


def send_direct_rollback_unsafe(
    channel_name: str, event: str, payload: Any, *, drop_if_slow: bool = False, follow_up: dict | None = None
) -> None:
    """An event for one connection (the one that asked for the work), besides its subscribers.

    A connection that is subscribed anyway drops the direct copy, so nobody receives it twice.
    """
    message = {**broadcast_message(event, payload, drop_if_slow=drop_if_slow, follow_up=follow_up), "direct": True}
    publisher.post(lambda: get_channel_layer().send(channel_name, message), what=f"{event} to {channel_name}")


class PublicationBatch:
    """Publications sent together, in order: events to their groups, direct copies, control messages.

    One lane entry (and one future to wait on) for the lot; the order of delivery is the order of
    the calls, as if each had been posted on its own.
    """

    def __init__(self) -> None:
        self.items: list[tuple[str, str, dict]] = []

    def publish(self, event: str, payload: Any, *, drop_if_slow: bool = False, follow_up: dict | None = None) -> None:
        message = broadcast_message(event, payload, drop_if_slow=drop_if_slow, follow_up=follow_up)
        self.items.append(("group", event_group(event), message))

    def send_direct(
        self, channel_name: str, event: str, payload: Any, *, drop_if_slow: bool = False, follow_up: dict | None = None
    ) -> None:
        message = broadcast_message(event, payload, drop_if_slow=drop_if_slow, follow_up=follow_up)
        self.items.append(("channel", channel_name, {**message, "direct": True}))

    def publish_to_subscription(self, subscription: str, event: str, payload: Any) -> None:
        """An event for the holders of one keyed subscription (:func:`keyed_subscription`) only."""
        self.items.append(
            ("group", subscription_group(subscription), subscription_message(subscription, event, payload))
        )

    def group_send(self, group: str, message: dict) -> None:
        self.items.append(("group", group, message))

    def post(self, *, what: str) -> Future:
        items = list(self.items)
        self.items.clear()
        return publisher.post(lambda: send_batch(get_channel_layer(), items), what=what)


async def send_batch(layer: Any, items: list[tuple[str, str, dict]]) -> None:
    """Deliver ``(kind, target, message)`` items in order ("group" or "channel"). Every item is
    attempted; the first failure is raised after the rest went out (as separate posts would).

    In order because each is stored before the next is sent: channels_redis scores a message with
    the sender's clock and a receiver pops the lowest score first; the in-memory layer appends.
    """
    failure: Exception | None = None
    for kind, target, message in items:
        try:
            if kind == "group":
                await layer.group_send(target, message)
            else:
                await layer.send(target, message)
        except Exception as error:
            failure = failure or error
    if failure is not None:
        raise failure


def subscription_message(subscription: str, event: str, payload: Any) -> dict:
    return {**broadcast_message(event, payload), SUBSCRIPTION_KEY: subscription}


def publish_to_subscription_rollback_unsafe(subscription: str, event: str, payload: Any) -> None:
    """Send now to the holders of one keyed subscription, whatever the surrounding transaction does."""
    message = subscription_message(subscription, event, payload)
    group = subscription_group(subscription)
    publisher.post(lambda: get_channel_layer().group_send(group, message), what=event)


def publish_on_commit(
    event: str, payload: Any, *, state_version: dict | None = None, drop_if_slow: bool = False
) -> None:
    transaction.on_commit(
        lambda: publish_rollback_unsafe(event, payload, state_version=state_version, drop_if_slow=drop_if_slow)
    )


def send_to_channels_on_commit(channel_names: list[str], message: dict) -> None:
    """Deliver a control message (close, invoke routing) to specific connections after commit."""
    if not channel_names:
        return

    def send() -> None:
        layer = get_channel_layer()
        for name in channel_names:
            publisher.post(lambda name=name: layer.send(name, message), what=f"{message.get('type')} to {name}")

    transaction.on_commit(send)


def close_message(code: int, reason: str) -> dict:
    return {"type": "gateway.close", "code": code, "reason": reason}
