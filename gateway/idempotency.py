"""Deduplication of side-effecting calls by ``idempotencyKey`` (OpenClaw keeps 5 minutes).

Kept in Django's cache (Redis in production), so a retry that lands on another gateway process is
still recognised. ``cache.add`` is the atomic claim: one caller runs the work, a concurrent
duplicate is told to retry, a later duplicate gets the recorded outcome.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache

from .exceptions import Conflict

DEDUPE_TTL_S = 5 * 60
# Outcomes bigger than this are not kept: a duplicate then runs again instead of filling the cache.
MAX_RECORDED_BYTES = 1024 * 1024
_IN_FLIGHT = "in-flight"


@dataclass(frozen=True)
class Claim:
    key: str
    recorded: dict[str, Any] | None  # the earlier outcome when this call is a duplicate


def _cache_key(method: str, scope: str, idempotency_key: str) -> str:
    digest = hashlib.sha256(f"{method}\0{scope}\0{idempotency_key}".encode()).hexdigest()
    return f"gateway:idem:{digest}"


async def claim(method: str, scope: str, idempotency_key: str, *, in_flight_ttl_s: float) -> Claim:
    """Claim the key or return the recorded outcome; a duplicate of a running call is a Conflict."""
    key = _cache_key(method, scope, idempotency_key)
    for _attempt in range(2):
        if await cache.aadd(key, _IN_FLIGHT, timeout=in_flight_ttl_s):
            return Claim(key=key, recorded=None)
        recorded = await cache.aget(key)
        if recorded is None:
            continue  # expired between add and get
        if recorded == _IN_FLIGHT:
            break
        return Claim(key=key, recorded=json.loads(recorded))
    raise Conflict(
        f"{method} with this idempotencyKey is still in flight",
        details={"code": "IDEMPOTENCY_IN_FLIGHT"},
        retryable=True,
        retry_after_ms=500,
    )


async def record(claimed: Claim, outcome: dict[str, Any]) -> None:
    encoded = json.dumps(outcome)
    if len(encoded) > MAX_RECORDED_BYTES:
        await cache.adelete(claimed.key)
    else:
        await cache.aset(claimed.key, encoded, timeout=DEDUPE_TTL_S)


async def release(claimed: Claim) -> None:
    """Forget a claim whose call did not run (transient failure): a retry may run it."""
    await cache.adelete(claimed.key)
