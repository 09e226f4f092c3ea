"""A node's connect refused only because its pairing waits for an operator is held open for a few seconds, and
answered with ``hello-ok`` as soon as an operator approves it.

OpenClaw's node host retries a refused pairing with its own backoff (1 s doubling to 30 s): approved between two
tries, it would connect only at the next one. Holding its ``connect`` unanswered sends it nothing it does not know
(the answer is the usual ``hello-ok`` or the usual ``NOT_PAIRED``, only later), and it waits for that answer up
to 15 s. Each process wakes the connects it holds when the pairing's ``device.pair.resolved`` broadcast arrives
(``lifecycle``'s process listener), whichever process recorded the decision.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .conf import gateway_setting

# The broadcast every pairing decision publishes (a node's too, beside its ``node.pair.resolved``).
RESOLVED_EVENT = "device.pair.resolved"

_held: dict[str, set[asyncio.Future[str]]] = {}


def hold_seconds() -> float:
    """How long a pending node's connect is held (``OPENCLAW_PAIRING_HOLD_MS``; 0 answers at once)."""
    return gateway_setting("PAIRING_HOLD_MS") / 1000


def notice(message: dict[str, Any]) -> None:
    """A broadcast reached this process: a pairing decision wakes the connects held for that device."""
    if message.get("event") != RESOLVED_EVENT:
        return
    payload = message.get("payload") or {}
    for decided in _held.get(payload.get("deviceId") or "", ()):
        if not decided.done():
            decided.set_result(str(payload.get("decision") or ""))


@contextmanager
def held(device_id: str) -> Iterator[asyncio.Future[str]]:
    """While inside: the future that a pairing decision on ``device_id`` resolves (``approved``, ``rejected``, …).
    A decision committed before entering is not in it: the holder decides the connect again once inside."""
    decided: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    _held.setdefault(device_id, set()).add(decided)
    try:
        yield decided
    finally:
        waiting = _held.get(device_id, set())
        waiting.discard(decided)
        if not waiting:
            _held.pop(device_id, None)


async def outcome(decided: asyncio.Future[str], timeout_s: float) -> str | None:
    """The decision ``decided`` receives within ``timeout_s``; None if none does."""
    try:
        async with asyncio.timeout(timeout_s):
            return await decided
    except TimeoutError:
        return None
