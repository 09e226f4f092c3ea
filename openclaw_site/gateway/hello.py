"""The ``hello-ok`` payload and presence broadcasts."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.core.cache import cache

from . import counters, state
from .conf import auth_mode, gateway_setting
from .context import RpcContext
from .events import BROADCAST_GROUP, broadcast_message
from .handshake import ConnectContext, ConnectOutcome, authenticate_connect
from .health import last_health
from .protocol import SERVER_VERSION, ConnectParams
from .registry import EVENT_PRESENCE, registry
from .selectors import presence_entries

PRESENCE_VERSION_KEY = "gateway:state:presence"
HEALTH_VERSION_KEY = "gateway:state:health"


def state_version(*, presence: int | None = None) -> dict[str, int]:
    keys = [HEALTH_VERSION_KEY] if presence is not None else [PRESENCE_VERSION_KEY, HEALTH_VERSION_KEY]
    values = cache.get_many(keys)
    return {
        "presence": presence if presence is not None else int(values.get(PRESENCE_VERSION_KEY) or 0),
        "health": int(values.get(HEALTH_VERSION_KEY) or 0),
    }


def presence_snapshot(*, bump: bool) -> tuple[list[dict], dict[str, int]]:
    presence_version = counters.bump(PRESENCE_VERSION_KEY) if bump else None
    return presence_entries(), state_version(presence=presence_version)


def accept_connect(
    params: ConnectParams, connect_ctx: ConnectContext, protocol: int
) -> tuple[RpcContext, dict, tuple[list, dict]]:
    """The whole accepted-connect database work in one hop: decide, register, build ``hello-ok``."""
    outcome = authenticate_connect(params, connect_ctx)
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
    hello, presence = build_hello(ctx, outcome, protocol)
    return ctx, hello, presence


def build_hello(ctx: RpcContext, outcome: ConnectOutcome, protocol: int) -> tuple[dict, tuple[list, dict]]:
    presence, version = presence_snapshot(bump=True)
    snapshot: dict[str, Any] = {
        "presence": presence,
        "health": last_health() or {},
        "stateVersion": version,
        "uptimeMs": state.uptime_ms(),
        "authMode": auth_mode(),
    }
    for provider in registry.snapshot_providers:
        snapshot.update(provider(ctx))
    auth: dict[str, Any] = {"method": outcome.auth_method, "role": outcome.role, "scopes": outcome.scopes}
    if outcome.device_token:
        auth["deviceToken"] = outcome.device_token
        if outcome.device_token_issued_at_ms:
            auth["issuedAtMs"] = outcome.device_token_issued_at_ms
    hello = {
        "type": "hello-ok",
        "protocol": protocol,
        "server": {"version": SERVER_VERSION, "connId": ctx.conn_id, "bootId": state.BOOT_ID},
        "features": {"methods": registry.method_names(), "events": registry.event_names(), "capabilities": []},
        "snapshot": snapshot,
        "auth": auth,
        "policy": {
            "maxPayload": gateway_setting("MAX_PAYLOAD_BYTES"),
            "maxBufferedBytes": gateway_setting("MAX_BUFFERED_BYTES"),
            "tickIntervalMs": gateway_setting("TICK_INTERVAL_MS"),
        },
    }
    return hello, (presence, version)


async def presence_changed(snapshot: tuple[list, dict] | None) -> None:
    """Broadcast presence to every connection of every process."""
    if snapshot is None:
        snapshot = await database_sync_to_async(presence_snapshot)(bump=True)
    presence, version = snapshot
    await get_channel_layer().group_send(
        BROADCAST_GROUP, broadcast_message(EVENT_PRESENCE, {"presence": presence}, state_version=version)
    )
