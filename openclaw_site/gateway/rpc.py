"""Gateway-core methods: health, status, device and node pairing, device tokens, nodes."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from pydantic import Field

from . import idempotency, runtime, selectors, services
from . import scopes as sc
from .conf import gateway_setting
from .context import RpcContext
from .exceptions import InvalidRequest, NotFound, PermissionDenied, Unavailable
from .protocol import SERVER_VERSION, ClosedModel
from .registry import registry

method = registry.method


# --- health and status ----------------------------------------------------------------------


def _probe_health() -> dict:
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {
        "ok": True,
        "durationMs": round((time.perf_counter() - started) * 1000, 3),
        "probedAtMs": selectors.now_ms(),
        "database": {"ok": True, "vendor": connection.vendor},
    }


@method("health", scope=None)
async def health_rpc(ctx: RpcContext, params) -> dict:
    try:
        probe = await runtime.health_snapshot(_probe_health)
    except Exception as exc:
        raise Unavailable(f"health probe failed: {type(exc).__name__}: {exc}", retryable=True) from exc
    return {**probe, "ts": selectors.now_ms(), "version": SERVER_VERSION, "uptimeMs": runtime.uptime_ms()}


def _rss_bytes() -> int | None:
    try:
        with open(f"/proc/{os.getpid()}/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@method("status", scope=sc.READ)
def status_rpc(ctx: RpcContext, params) -> dict:
    from .models import GatewayProcess

    live_processes = GatewayProcess.objects.filter(heartbeat_at__gte=selectors.process_stale_before())
    return {
        "runtimeVersion": SERVER_VERSION,
        "pid": os.getpid(),
        "bootId": runtime.BOOT_ID,
        "uptimeMs": runtime.uptime_ms(),
        "processMemory": {"rssBytes": _rss_bytes()},
        "gatewayProcesses": [
            {
                "bootId": str(p.boot_id),
                "hostname": p.hostname,
                "pid": p.pid,
                "heartbeatAtMs": selectors.to_ms(p.heartbeat_at),
            }
            for p in live_processes
        ],
        "connections": {**selectors.connection_counts(), "local": len(runtime.local_connections)},
    }


# --- device pairing -------------------------------------------------------------------------


class RequestIdParams(ClosedModel):
    requestId: str = Field(min_length=1)


class DeviceIdParams(ClosedModel):
    deviceId: str = Field(min_length=1)


class NodeIdParams(ClosedModel):
    nodeId: str = Field(min_length=1)


def _restricted_to_own_device(ctx: RpcContext) -> str | None:
    """Non-admin callers authenticated by a device token manage only their own device."""
    if ctx.is_admin or ctx.auth_method != "device-token":
        return None
    return ctx.device_id


@method("device.pair.list", scope=sc.PAIRING)
def device_pair_list_rpc(ctx: RpcContext, params) -> dict:
    return selectors.device_pair_list(only_device_id=_restricted_to_own_device(ctx))


@method("device.pair.approve", params=RequestIdParams, scope=sc.PAIRING)
def device_pair_approve_rpc(ctx: RpcContext, params: RequestIdParams) -> dict:
    device = services.pairing_request_approve(request_id=params.requestId, actor=ctx.actor())
    return {"requestId": params.requestId, "device": selectors.paired_device_shape(device, connected=False)}


@method("device.pair.reject", params=RequestIdParams, scope=sc.PAIRING)
def device_pair_reject_rpc(ctx: RpcContext, params: RequestIdParams) -> dict:
    request = services.pairing_request_reject(request_id=params.requestId, actor=ctx.actor())
    return {"requestId": params.requestId, "deviceId": request.device_id}


@method("device.pair.remove", params=DeviceIdParams, scope=sc.PAIRING)
def device_pair_remove_rpc(ctx: RpcContext, params: DeviceIdParams) -> dict:
    own = _restricted_to_own_device(ctx)
    if own is not None and own != params.deviceId:
        raise InvalidRequest("device pairing removal denied")
    services.paired_device_remove(device_id=params.deviceId, actor=ctx.actor())
    return {"deviceId": params.deviceId}


class TokenRotateParams(ClosedModel):
    deviceId: str = Field(min_length=1)
    role: str = Field(min_length=1)
    scopes: list[str] | None = None


class TokenRevokeParams(ClosedModel):
    deviceId: str = Field(min_length=1)
    role: str = Field(min_length=1)


@method("device.token.rotate", params=TokenRotateParams, scope=sc.PAIRING)
def device_token_rotate_rpc(ctx: RpcContext, params: TokenRotateParams) -> dict:
    own = _restricted_to_own_device(ctx)
    if own is not None and own != params.deviceId:
        raise InvalidRequest("device token rotation denied")
    return services.device_token_rotate(
        device_id=params.deviceId, role=params.role, scopes=params.scopes, actor=ctx.actor()
    )


@method("device.token.revoke", params=TokenRevokeParams, scope=sc.PAIRING)
def device_token_revoke_rpc(ctx: RpcContext, params: TokenRevokeParams) -> dict:
    own = _restricted_to_own_device(ctx)
    if own is not None and own != params.deviceId:
        raise InvalidRequest("device token revocation denied")
    return services.device_token_revoke(device_id=params.deviceId, role=params.role, actor=ctx.actor())


# --- node pairing (backed by device pairing of role "node") ---------------------------------


@method("node.pair.list", scope=sc.PAIRING)
def node_pair_list_rpc(ctx: RpcContext, params) -> dict:
    return selectors.node_pair_list()


@method("node.pair.approve", params=RequestIdParams, scope=sc.PAIRING)
def node_pair_approve_rpc(ctx: RpcContext, params: RequestIdParams) -> dict:
    device = services.pairing_request_approve(request_id=params.requestId, actor=ctx.actor(), role=sc.ROLE_NODE)
    return {"requestId": params.requestId, "node": selectors.paired_node_shape(device)}


@method("node.pair.reject", params=RequestIdParams, scope=sc.PAIRING)
def node_pair_reject_rpc(ctx: RpcContext, params: RequestIdParams) -> dict:
    request = services.pairing_request_reject(request_id=params.requestId, actor=ctx.actor(), role=sc.ROLE_NODE)
    return {"requestId": params.requestId, "nodeId": request.device_id}


@method("node.pair.remove", params=NodeIdParams, scope=sc.PAIRING)
def node_pair_remove_rpc(ctx: RpcContext, params: NodeIdParams) -> dict:
    services.node_remove(node_id=params.nodeId, actor=ctx.actor())
    return {"nodeId": params.nodeId}


# --- nodes ----------------------------------------------------------------------------------


def _sees_pending(ctx: RpcContext) -> bool:
    return ctx.has_scope(sc.PAIRING) or ctx.has_scope(sc.ADMIN)


def _visible(ctx: RpcContext, node: dict) -> dict | None:
    if _sees_pending(ctx):
        return node
    if not (node.get("paired") or node.get("connected")):
        return None
    return selectors.strip_pending_fields(node)


@method("node.list", scope=sc.READ)
def node_list_rpc(ctx: RpcContext, params) -> dict:
    nodes = [shown for node in selectors.node_catalog_snapshot() if (shown := _visible(ctx, node)) is not None]
    return {"ts": selectors.now_ms(), "nodes": nodes}


@method("node.describe", params=NodeIdParams, scope=sc.READ)
def node_describe_rpc(ctx: RpcContext, params: NodeIdParams) -> dict:
    node = selectors.node_describe(params.nodeId.strip())
    shown = _visible(ctx, node) if node is not None else None
    if shown is None:
        raise NotFound("unknown nodeId")
    return {"ts": selectors.now_ms(), **shown}


class NodeRenameParams(ClosedModel):
    nodeId: str = Field(min_length=1)
    displayName: str = Field(min_length=1, max_length=200)


@method("node.rename", params=NodeRenameParams, scope=sc.PAIRING)
def node_rename_rpc(ctx: RpcContext, params: NodeRenameParams) -> dict:
    device = services.node_rename(node_id=params.nodeId, display_name=params.displayName, actor=ctx.actor())
    return {"nodeId": device.device_id, "displayName": device.operator_label}


class NodeInvokeParams(ClosedModel):
    nodeId: str
    command: str
    params: Any = None
    timeoutMs: int | None = Field(default=None, ge=0)
    idempotencyKey: str = Field(min_length=1)
    sessionKey: str | None = None
    turnSourceChannel: str | None = None
    turnSourceTo: str | None = None
    turnSourceAccountId: str | None = None
    turnSourceThreadId: str | None = None


def _invoke_target(node_id: str) -> tuple[str, str, list[str]] | None:
    conn = selectors.live_node_connection(node_id)
    if conn is None:
        return None
    return conn.channel_name, str(conn.conn_id), list(conn.commands)


def _invoke_payload(result: dict[str, Any]) -> tuple[Any, str | None]:
    payload_json = result.get("payloadJSON")
    if isinstance(payload_json, str):
        try:
            return json.loads(payload_json), payload_json
        except json.JSONDecodeError:
            return {"payloadJSON": payload_json}, payload_json
    return result.get("payload"), None


@method("node.invoke", params=NodeInvokeParams, scope=sc.WRITE)
async def node_invoke_rpc(ctx: RpcContext, params: NodeInvokeParams) -> dict:
    node_id, command = params.nodeId.strip(), params.command.strip()
    if not node_id or not command:
        raise InvalidRequest("nodeId and command required")
    if command in ("system.execApprovals.get", "system.execApprovals.set"):
        raise InvalidRequest("use exec.approvals.node.get/set for node exec approvals")
    if command == "browser.proxy" and not ctx.has_scope(sc.ADMIN):
        raise PermissionDenied(f"missing scope: {sc.ADMIN}")
    target = await database_sync_to_async(_invoke_target)(node_id)
    if target is None:
        raise Unavailable("node not connected", details={"code": "NOT_CONNECTED"})
    channel_name, conn_id, commands = target
    if not commands:
        raise InvalidRequest(
            f'node did not declare commands; "{command}" cannot be invoked',
            details={"reason": "node did not declare commands", "command": command},
        )
    if command not in commands:
        raise InvalidRequest(
            f'node command "{command}" is not declared by the node or not in its approved command surface',
            details={"reason": "command not declared by node", "command": command},
        )
    timeout_ms = params.timeoutMs if params.timeoutMs else gateway_setting("NODE_INVOKE_TIMEOUT_MS")
    # A retried invoke (same caller, node and key) within 5 minutes gets the first outcome instead
    # of running the command twice.
    claimed = await idempotency.claim(
        "node.invoke",
        f"{ctx.device_id or ctx.auth_method}:{node_id}",
        params.idempotencyKey,
        in_flight_ttl_s=timeout_ms / 1000 + 5,
    )
    if claimed.recorded is not None:
        return _replay(claimed.recorded)
    try:
        result = await _invoke_node(ctx, params, node_id, command, channel_name, conn_id, timeout_ms)
    except BaseException:
        # Not delivered or not answered: the node may not have run it, so a retry may.
        await idempotency.release(claimed)
        raise
    if result.get("ok"):
        payload, payload_json = _invoke_payload(result)
        response = {"ok": True, "nodeId": node_id, "command": command, "payload": payload}
        if payload_json is not None:
            response["payloadJSON"] = payload_json
        await idempotency.record(claimed, {"ok": True, "payload": response})
        return response
    error = result.get("error") or {}
    code = error.get("code") or "UNAVAILABLE"
    message = error.get("message") or "node invoke failed"
    details: dict[str, Any] = {"nodeError": {"code": code, "message": message}}
    failure = Unavailable(message, details=details)
    if code == "NOT_CONNECTED":
        details["code"] = "NOT_CONNECTED"
        await idempotency.release(claimed)
    else:
        await idempotency.record(claimed, {"ok": False, "error": failure.to_shape()})
    raise failure


def _replay(recorded: dict[str, Any]) -> dict:
    if recorded["ok"]:
        return recorded["payload"]
    shape = recorded["error"]
    raise Unavailable(shape["message"], details=shape.get("details"), code=shape["code"])


async def _invoke_node(
    ctx: RpcContext,
    params: NodeInvokeParams,
    node_id: str,
    command: str,
    channel_name: str,
    conn_id: str,
    timeout_ms: int,
) -> dict[str, Any]:
    """Route one invoke to the node's connection (on whichever process) and wait for its result."""
    invoke_id = str(uuid.uuid4())
    future = runtime.invoke_broker.create(invoke_id)
    try:
        await get_channel_layer().send(
            channel_name,
            {
                "type": "gateway.invoke.request",
                "id": invoke_id,
                "nodeId": node_id,
                "connId": conn_id,
                "command": command,
                "paramsJSON": json.dumps(params.params) if params.params is not None else None,
                "timeoutMs": timeout_ms,
                "idempotencyKey": params.idempotencyKey,
                "replyChannel": ctx.channel_name,
            },
        )
        try:
            return await asyncio.wait_for(future, timeout_ms / 1000)
        except TimeoutError:
            raise Unavailable(
                "node invoke timed out",
                details={"nodeError": {"code": "TIMEOUT", "message": "node invoke timed out"}},
            ) from None
    finally:
        runtime.invoke_broker.discard(invoke_id)


class NodeInvokeError(ClosedModel):
    code: str | None = None
    message: str | None = None


class NodeInvokeResultParams(ClosedModel):
    id: str = Field(min_length=1)
    nodeId: str = Field(min_length=1)
    ok: bool
    payload: Any = None
    payloadJSON: Any = None
    error: NodeInvokeError | None = None


@method("node.invoke.result", params=NodeInvokeResultParams, role="node")
async def node_invoke_result_rpc(ctx: RpcContext, params: NodeInvokeResultParams) -> dict:
    if params.nodeId != ctx.node_id:
        raise InvalidRequest("nodeId mismatch")
    pending = ctx.pending_invokes.pop(params.id, None)
    if pending is None:
        return {"ok": True, "ignored": True}
    reply_channel, _command = pending
    payload, payload_json = params.payload, params.payloadJSON
    if payload_json is not None and not isinstance(payload_json, str):
        payload, payload_json = payload_json, None
    message: dict[str, Any] = {"type": "gateway.invoke.result", "id": params.id, "ok": params.ok, "payload": payload}
    if payload_json is not None:
        message["payloadJSON"] = payload_json
    if params.error is not None:
        message["error"] = params.error.model_dump(exclude_none=True)
    await get_channel_layer().send(reply_channel, message)
    return {"ok": True}


class NodeEventParams(ClosedModel):
    event: str = Field(min_length=1)
    payload: Any = None
    payloadJSON: str | None = None


@method("node.event", params=NodeEventParams, role="node")
def node_event_rpc(ctx: RpcContext, params: NodeEventParams) -> dict:
    if params.event == "node.presence.alive":
        persisted = services.node_presence_touch(node_id=ctx.node_id, reason="alive")
        return {
            "ok": True,
            "event": params.event,
            "handled": persisted,
            "reason": "persisted" if persisted else "not-paired",
        }
    handler = registry.node_event_handlers.get(params.event)
    if handler is None:
        return {"ok": True, "event": params.event, "handled": False, "reason": "unknown-event"}
    payload = params.payload
    if payload is None and params.payloadJSON:
        try:
            payload = json.loads(params.payloadJSON)
        except json.JSONDecodeError:
            raise InvalidRequest("invalid node.event params: payloadJSON is not valid JSON") from None
    return {"ok": True, "event": params.event, **handler(ctx, payload)}
