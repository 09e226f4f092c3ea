"""Who receives which event: the pure decision every consumer applies (gateway/visibility.py)."""

from __future__ import annotations

import pytest

from gateway import scopes as sc
from gateway.registry import EventSpec, registry
from gateway.visibility import event_visible

TICK = EventSpec("tick", scope=None, operators_only=False)
PAIRING = EventSpec("device.pair.requested", scope=sc.PAIRING, operators_only=True)
SESSIONS = EventSpec("sessions.changed", scope=sc.READ, operators_only=True, subscription="sessions")
INVOKE = EventSpec("node.invoke.request", scope=None, operators_only=False)


def visible(spec, *, role="operator", scopes=(), subscriptions=(), direct=False) -> bool:
    return event_visible(spec, role=role, scopes=scopes, subscriptions=subscriptions, direct=direct)


def test_unknown_events_reach_nobody():
    assert not visible(None, scopes=[sc.ADMIN])


def test_unscoped_events_reach_every_connection():
    assert visible(TICK)
    assert visible(TICK, role="node")
    assert visible(INVOKE, role="node")


@pytest.mark.parametrize(
    ("scopes", "expected"),
    [
        ([], False),
        ([sc.READ], False),
        ([sc.PAIRING], True),
        ([sc.ADMIN], True),  # admin implies every operator scope
    ],
)
def test_scoped_events_need_the_scope_or_one_that_implies_it(scopes, expected):
    assert visible(PAIRING, scopes=scopes) is expected


def test_operator_events_never_reach_nodes_whatever_their_scopes():
    assert not visible(PAIRING, role="node", scopes=[sc.ADMIN])


def test_subscription_events_reach_subscribers_only():
    assert not visible(SESSIONS, scopes=[sc.READ])
    assert visible(SESSIONS, scopes=[sc.READ], subscriptions={"sessions"})
    assert visible(SESSIONS, scopes=[sc.WRITE], subscriptions={"sessions"})  # write implies read
    assert not visible(SESSIONS, scopes=[], subscriptions={"sessions"})


def test_a_direct_copy_is_dropped_for_subscribers_so_nobody_receives_it_twice():
    # The connection that sent a turn gets its stream directly ...
    assert visible(SESSIONS, scopes=[sc.READ], direct=True)
    # ... unless it is subscribed, in which case the subscription group delivers the one copy.
    assert not visible(SESSIONS, scopes=[sc.READ], subscriptions={"sessions"}, direct=True)
    # A direct copy is still filtered by scope.
    assert not visible(SESSIONS, scopes=[], direct=True)


def test_the_registered_specs_are_what_consumers_decide_with():
    chat = registry.events["chat"]
    assert chat.subscription == "sessions" and chat.scope == sc.READ
    assert visible(chat, scopes=[sc.READ], direct=True)
    assert not visible(chat, scopes=[sc.READ])
