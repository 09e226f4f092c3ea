"""Who may receive which event: one pure decision, applied by every consumer to every event.

An event reaches a connection through the broadcast group, a subscription group, or directly
(the connection that asked for the work). The registry's :class:`EventSpec` says who may see it.
"""

from __future__ import annotations

from collections.abc import Collection

from .registry import EventSpec
from .scopes import ROLE_OPERATOR, scope_satisfied


def event_visible(
    spec: EventSpec | None,
    *,
    role: str,
    scopes: Collection[str],
    subscriptions: Collection[str],
    direct: bool = False,
    subscription: str | None = None,
) -> bool:
    """Whether a connection with this role, scopes and subscriptions receives one copy of the event.

    * Unknown event families are denied.
    * Operator-only events never reach nodes; scoped events need the scope (with its implications).
    * An event published to one keyed subscription (``subscription``: one session's messages) reaches only a
      connection that still holds it (one that unsubscribed meanwhile drops what was already on its way).
    * A subscription event reaches subscribers through their group; a direct copy (to the
      requesting connection) is dropped when that connection is subscribed anyway, so nobody
      receives it twice.
    """
    if spec is None:
        return False
    if spec.operators_only and role != ROLE_OPERATOR:
        return False
    if spec.scope is not None and not scope_satisfied(scopes, spec.scope):
        return False
    if subscription is not None:
        return subscription in subscriptions
    subscribed = spec.subscription is not None and spec.subscription in subscriptions
    if direct:
        return not subscribed
    return spec.subscription is None or subscribed
