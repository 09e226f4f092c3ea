"""The held connects of nodes waiting for pairing: a pairing decision broadcast wakes those of its device only;
other events, other devices and a hold that runs out leave them be (the refusal then goes out as before)."""

from __future__ import annotations

import asyncio

from gateway import pairing_wait
from gateway.events import broadcast_message

NODE, OTHER = "a" * 64, "b" * 64


async def decision(device_id: str, timeout_s: float) -> str | None:
    with pairing_wait.held(device_id) as decided:
        return await pairing_wait.outcome(decided, timeout_s)


def resolved(device_id: str, decision: str) -> dict:
    return broadcast_message(
        "device.pair.resolved", {"requestId": "r", "deviceId": device_id, "decision": decision, "ts": 1}
    )


def test_the_decision_on_the_device_wakes_its_held_connects_and_nothing_else_does():
    async def scenario():
        first = asyncio.ensure_future(decision(NODE, 5))
        second = asyncio.ensure_future(decision(NODE, 5))
        other = asyncio.ensure_future(decision(OTHER, 0.2))
        await asyncio.sleep(0)
        pairing_wait.notice(broadcast_message("node.pair.resolved", {"nodeId": NODE, "decision": "approved"}))
        pairing_wait.notice(broadcast_message("presence", {"presence": []}))
        await asyncio.sleep(0)
        woken_early = first.done()
        pairing_wait.notice(resolved(NODE, "approved"))
        return woken_early, await first, await second, await other

    woken_early, first, second, other = asyncio.run(scenario())

    assert not woken_early  # only device.pair.resolved, which every pairing decision publishes
    assert (first, second, other) == ("approved", "approved", None)
    assert pairing_wait._held == {}  # nothing left behind


def test_a_rejection_is_passed_on_as_such_and_a_hold_without_decision_ends_with_none():
    async def scenario():
        rejected = asyncio.ensure_future(decision(NODE, 5))
        await asyncio.sleep(0)
        pairing_wait.notice(resolved(NODE, "rejected"))
        return await rejected, await decision(OTHER, 0.05)

    assert asyncio.run(scenario()) == ("rejected", None)
    assert pairing_wait._held == {}


def test_a_decision_without_anyone_waiting_or_with_a_malformed_payload_changes_nothing():
    pairing_wait.notice(resolved(NODE, "approved"))
    pairing_wait.notice({"type": "gateway.event", "event": "device.pair.resolved", "payload": None})

    assert pairing_wait._held == {}
