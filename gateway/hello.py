"""The ``hello-ok`` payload and presence broadcasts."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.core.cache import cache
from django.db import connection

from . import counters, state
from .conf import auth_mode, gateway_setting
from .context import RpcContext
from .events import BROADCAST_GROUP, broadcast_message
from .handshake import ConnectContext, ConnectOutcome
from .health import last_health
from .ports import connection_authority
from .protocol import SERVER_VERSION, ConnectParams
from .registry import EVENT_PRESENCE, registry
from .selectors import presence_entries, presence_rows_from_sql, presence_snapshot_sql, result_sets

logger = logging.getLogger(__name__)

Snapshot = tuple[list, dict]

# What a node reads in hello-ok to shape its worker-host declaration (OpenClaw's gateway capabilities;
# node-worker-dialect.md §1.0). Portal streams are not served, so their capability is not listed.
GATEWAY_CAPABILITIES = (
    "node-worker-bundle-retention-v1",
    "node-worker-bundle-status-v1",
    "node-worker-captured-exec-policy",
    "node-worker-environment-session-v1",
)
PRESENCE_VERSION_KEY = "gateway:state:presence"
HEALTH_VERSION_KEY = "gateway:state:health"


def _health_version() -> int:
    return int(cache.get(HEALTH_VERSION_KEY) or 0)


def presence_snapshot() -> Snapshot:
    """The presence version raised by one, then the presence list (with the health version).

    The version is raised before the entries are read: a change after this read raises it again, so
    a newer list never goes out under an older or equal version (clients keep the highest).
    """
    if connection.vendor == "postgresql":
        sql, params = presence_snapshot_sql()
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            version_rows, rows = result_sets(cursor)
        version = {"presence": version_rows[0][0], "health": _health_version()}
        return presence_entries(presence_rows_from_sql(rows)), version
    presence, health = counters.bump_and_read(PRESENCE_VERSION_KEY, HEALTH_VERSION_KEY)
    return presence_entries(), {"presence": presence, "health": health}


# The health version (Redis) is read beside the connect's database hop: it depends on nothing the
# connect does, and read in line it added a Redis round trip to every handshake.
_side_reads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gateway-hello")


def health_version_soon() -> Callable[[], int]:
    """Start reading the health version; the returned function waits for it."""
    if counters.uses_redis():
        return _side_reads.submit(_health_version).result
    return _health_version


def accept_connect(
    params: ConnectParams,
    connect_ctx: ConnectContext,
    protocol: int,
    health_version: Callable[[], int] | None = None,
) -> tuple[RpcContext, dict, tuple[list, dict]]:
    """The whole accepted-connect database work in one hop: decide, register, build ``hello-ok``.

    On PostgreSQL the presence snapshot of ``hello-ok`` (version raised, list read after the
    registration committed) comes back with the registration, in its round trip.
    ``health_version``: from :func:`health_version_soon`, started before the hop.
    """
    health_version = health_version or health_version_soon()
    then = presence_snapshot_sql(registered=connect_ctx.conn_id) if connection.vendor == "postgresql" else None
    outcome = connection_authority().authenticate_connect(params, connect_ctx, then=then)
    ctx = RpcContext(
        conn_id=connect_ctx.conn_id,
        channel_name=connect_ctx.channel_name,
        role=outcome.role,
        scopes=outcome.scopes,
        auth_method=outcome.auth_method,
        client_id=params.client.id,
        client_mode=params.client.mode,
        remote_ip=connect_ctx.remote_ip,
        device_id=outcome.device_id,
        node_id=outcome.node_id,
        commands=outcome.commands,
    )
    if outcome.then_rows is not None and outcome.then_rows[0]:
        version_rows, rows = outcome.then_rows
        snapshot = (
            presence_entries(presence_rows_from_sql(rows)),
            {
                "presence": version_rows[0][0],
                "health": health_version(),
            },
        )
    else:
        snapshot = presence_snapshot()
    hello = build_hello(ctx, outcome, protocol, snapshot)
    return ctx, hello, snapshot


def build_hello(ctx: RpcContext, outcome: ConnectOutcome, protocol: int, snapshot: Snapshot) -> dict:
    presence, version = snapshot
    snapshot_payload: dict[str, Any] = {
        "presence": presence,
        "health": last_health() or {},
        "stateVersion": version,
        "uptimeMs": state.uptime_ms(),
        "authMode": auth_mode(),
    }
    for provider in registry.snapshot_providers:
        snapshot_payload.update(provider(ctx))
    auth: dict[str, Any] = {"method": outcome.auth_method, "role": outcome.role, "scopes": outcome.scopes}
    if outcome.device_token:
        auth["deviceToken"] = outcome.device_token
        if outcome.device_token_issued_at_ms:
            auth["issuedAtMs"] = outcome.device_token_issued_at_ms
    hello = {
        "type": "hello-ok",
        "protocol": protocol,
        "server": {"version": SERVER_VERSION, "connId": ctx.conn_id, "bootId": state.BOOT_ID},
        "features": {
            "methods": registry.method_names(),
            "events": registry.event_names(),
            "capabilities": list(GATEWAY_CAPABILITIES),
        },
        "snapshot": snapshot_payload,
        "auth": auth,
        "policy": {
            "maxPayload": gateway_setting("MAX_PAYLOAD_BYTES"),
            "maxBufferedBytes": gateway_setting("MAX_BUFFERED_BYTES"),
            "tickIntervalMs": gateway_setting("TICK_INTERVAL_MS"),
        },
    }
    return hello


# How often one process broadcasts presence at most. A join storm of N connections would otherwise
# send N full lists to every connection (O(N²) frames); coalesced, the latest list wins. Each
# broadcast is a frame of up to 100 entries (~35 KB) per local connection, for the gateway to write
# and every client to parse, so the interval grows by 1 ms per local connection (1.25 s at 1,000):
# about 1,000 frames a second at most, whatever the number of connections (up to 2,000).
PRESENCE_BROADCAST_MIN_INTERVAL_S = 0.25
PRESENCE_BROADCAST_INTERVAL_PER_CONNECTION_S = 0.001
PRESENCE_BROADCAST_MAX_INTERVAL_S = 2.25


def presence_broadcast_interval_s() -> float:
    return min(
        PRESENCE_BROADCAST_MAX_INTERVAL_S,
        PRESENCE_BROADCAST_MIN_INTERVAL_S + PRESENCE_BROADCAST_INTERVAL_PER_CONNECTION_S * len(state.local_connections),
    )


class PresenceBroadcaster:
    """Coalesces this process's presence changes into at most one broadcast per interval.

    1. The first change after a quiet interval goes out at once (a connect's with the snapshot
       its ``hello-ok`` carried, so no extra database hop).
    2. Changes while a broadcast is in flight or within the interval after it only mark presence
       dirty; one broadcast follows at the end of the interval with a snapshot read then — the
       final list and version once the changes stop, so every connection converges.
    3. One broadcast is in flight at a time. Every snapshot read here bumps the presence version
       before it reads the list (a connect's ``hello-ok`` snapshot bumped it too): two different lists
       never carry the same version, even when a change lands while a read is under way.
    """

    def __init__(
        self,
        *,
        interval_s: Callable[[], float],
        read_snapshot: Callable[[], Awaitable[Snapshot]],
        publish: Callable[[Snapshot], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._read_snapshot = read_snapshot
        self._publish = publish
        self._clock = clock
        self._dirty = False
        self._snapshot: Snapshot | None = None
        self._last_broadcast_at: float | None = None
        self._task: asyncio.Task | None = None

    def changed(self, snapshot: Snapshot | None = None) -> None:
        """A connection came (with its ``hello-ok`` snapshot) or went (None)."""
        task = self._task
        # (A task of another event loop is a finished test's, never this process's.)
        idle = task is None or task.done() or task.get_loop() is not asyncio.get_running_loop()
        # Only a change that finds nothing pending or in flight may go out with its own snapshot:
        # any other reads a fresh one, so an older list never follows a newer one from here.
        self._snapshot = snapshot if idle else None
        self._dirty = True
        if idle:
            self._task = asyncio.get_running_loop().create_task(self._broadcast_until_clean())

    async def _broadcast_until_clean(self) -> None:
        while self._dirty:
            if self._last_broadcast_at is not None:
                wait_s = self._last_broadcast_at + self.interval_s() - self._clock()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
            snapshot = self._snapshot
            self._dirty, self._snapshot = False, None
            self._last_broadcast_at = self._clock()
            try:
                await self._publish(snapshot if snapshot is not None else await self._read_snapshot())
            except Exception:
                # Like any lost event: clients refetch on a seq gap, and the next change broadcasts again.
                logger.exception("failed to broadcast presence")


async def _read_presence_snapshot() -> Snapshot:
    return await database_sync_to_async(presence_snapshot)()


async def _publish_presence(snapshot: Snapshot) -> None:
    """To every connection of every process (each process fans it out to its own, broadcast.py)."""
    presence, version = snapshot
    await get_channel_layer().group_send(
        BROADCAST_GROUP,
        broadcast_message(EVENT_PRESENCE, {"presence": presence}, state_version=version, drop_if_slow=True),
    )


presence_broadcaster = PresenceBroadcaster(
    interval_s=presence_broadcast_interval_s, read_snapshot=_read_presence_snapshot, publish=_publish_presence
)


def presence_changed(snapshot: Snapshot | None) -> None:
    """Presence changed in this process (a connect with its ``hello-ok`` snapshot, or a disconnect)."""
    presence_broadcaster.changed(snapshot)
