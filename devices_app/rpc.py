"""Methods of devices and nodes: device and node pairing, device tokens, the node catalog, node events."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from gateway import invoke
from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.exceptions import FrameRejected, InvalidRequest, NotFound
from gateway.protocol import decode_frame
from gateway.registry import registry
from gateway.selectors import now_ms

from . import selectors
from .schemas import (
    DeviceIdParams,
    NodeEventParams,
    NodeHostStatsPayload,
    NodeIdParams,
    NodePluginToolsUpdateParams,
    NodeRenameParams,
    NodeSkillsUpdateParams,
    RequestIdParams,
    TokenRevokeParams,
    TokenRotateParams,
)
from .services import connections, declarations, pairing, tokens

method = registry.method


# --- device pairing -------------------------------------------------------------------------


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
    device = pairing.pairing_request_approve(request_id=params.requestId, actor=ctx.actor())
    return {"requestId": params.requestId, "device": selectors.paired_device_shape(device, connected=False)}


@method("device.pair.reject", params=RequestIdParams, scope=sc.PAIRING)
def device_pair_reject_rpc(ctx: RpcContext, params: RequestIdParams) -> dict:
    request = pairing.pairing_request_reject(request_id=params.requestId, actor=ctx.actor())
    return {"requestId": params.requestId, "deviceId": request.device_id}


@method("device.pair.remove", params=DeviceIdParams, scope=sc.PAIRING)
def device_pair_remove_rpc(ctx: RpcContext, params: DeviceIdParams) -> dict:
    own = _restricted_to_own_device(ctx)
    if own is not None and own != params.deviceId:
        raise InvalidRequest("device pairing removal denied")
    pairing.paired_device_remove(device_id=params.deviceId, actor=ctx.actor())
    return {"deviceId": params.deviceId}


@method("device.token.rotate", params=TokenRotateParams, scope=sc.PAIRING)
def device_token_rotate_rpc(ctx: RpcContext, params: TokenRotateParams) -> dict:
    own = _restricted_to_own_device(ctx)
    if own is not None and own != params.deviceId:
        raise InvalidRequest("device token rotation denied")
    return tokens.device_token_rotate(
        device_id=params.deviceId, role=params.role, scopes=params.scopes, actor=ctx.actor()
    )


@method("device.token.revoke", params=TokenRevokeParams, scope=sc.PAIRING)
def device_token_revoke_rpc(ctx: RpcContext, params: TokenRevokeParams) -> dict:
    own = _restricted_to_own_device(ctx)
    if own is not None and own != params.deviceId:
        raise InvalidRequest("device token revocation denied")
    return tokens.device_token_revoke(device_id=params.deviceId, role=params.role, actor=ctx.actor())


# --- node pairing (backed by device pairing of role "node") ---------------------------------


@method("node.pair.list", scope=sc.PAIRING)
def node_pair_list_rpc(ctx: RpcContext, params) -> dict:
    return selectors.node_pair_list()


@method("node.pair.approve", params=RequestIdParams, scope=sc.PAIRING)
def node_pair_approve_rpc(ctx: RpcContext, params: RequestIdParams) -> dict:
    device = pairing.pairing_request_approve(request_id=params.requestId, actor=ctx.actor(), role=sc.ROLE_NODE)
    return {"requestId": params.requestId, "node": selectors.paired_node_shape(device)}


@method("node.pair.reject", params=RequestIdParams, scope=sc.PAIRING)
def node_pair_reject_rpc(ctx: RpcContext, params: RequestIdParams) -> dict:
    request = pairing.pairing_request_reject(request_id=params.requestId, actor=ctx.actor(), role=sc.ROLE_NODE)
    return {"requestId": params.requestId, "nodeId": request.device_id}


@method("node.pair.remove", params=NodeIdParams, scope=sc.PAIRING)
async def node_pair_remove_rpc(ctx: RpcContext, params: NodeIdParams) -> dict:
    # In a pool thread: the removal may wait on the node (told to delete its files) and on worker teardowns,
    # which must not hold the one thread every other request's database work goes through.
    await database_sync_to_async(pairing.node_pair_remove, thread_sensitive=False)(
        node_id=params.nodeId, actor=ctx.actor()
    )
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


async def _node_catalog() -> list[dict]:
    # This process's memo of the catalog, when it is fresh, without a database hop (nothing to wait for).
    nodes = selectors.node_catalog_memoized()
    if nodes is None:
        nodes = await database_sync_to_async(selectors.node_catalog_snapshot)()
    return nodes


@method("node.list", scope=sc.READ)
async def node_list_rpc(ctx: RpcContext, params) -> dict:
    nodes = [shown for node in await _node_catalog() if (shown := _visible(ctx, node)) is not None]
    return {"ts": now_ms(), "nodes": nodes}


@method("node.describe", params=NodeIdParams, scope=sc.READ)
async def node_describe_rpc(ctx: RpcContext, params: NodeIdParams) -> dict:
    node_id = params.nodeId.strip()
    node = next((node for node in await _node_catalog() if node["nodeId"] == node_id), None)
    shown = _visible(ctx, node) if node is not None else None
    if shown is None:
        raise NotFound("unknown nodeId")
    return {"ts": now_ms(), **shown}


@method("node.rename", params=NodeRenameParams, scope=sc.PAIRING)
def node_rename_rpc(ctx: RpcContext, params: NodeRenameParams) -> dict:
    device = pairing.node_rename(node_id=params.nodeId, display_name=params.displayName, actor=ctx.actor())
    return {"nodeId": device.device_id, "displayName": device.operator_label}


# --- what a node host declares of itself -----------------------------------------------------


# Up to maxPayload: 64 skills of up to 64 KiB each may take more than a control frame before the stored bound
# (512 KiB of content in all) is checked, and refused with its own message.
@method("node.skills.update", params=NodeSkillsUpdateParams, role="node", max_frame_bytes=None)
def node_skills_update_rpc(ctx: RpcContext, params: NodeSkillsUpdateParams) -> dict:
    skills = declarations.node_skills_update(node_id=ctx.node_id, skills=params.skills)
    return {"nodeId": ctx.node_id, "skills": skills}


@method("node.pluginTools.update", params=NodePluginToolsUpdateParams, role="node", max_frame_bytes=None)
def node_plugin_tools_update_rpc(ctx: RpcContext, params: NodePluginToolsUpdateParams) -> dict:
    tools = declarations.node_plugin_tools_update(
        node_id=ctx.node_id, tools=params.tools, allowed_commands=ctx.commands
    )
    return {"nodeId": ctx.node_id, "tools": tools}


NODE_HOST_STATS_EVENT = "node.host.stats"


def _node_host_stats(ctx: RpcContext, payload: Any) -> dict:
    """OpenClaw's answers: a payload that is not a valid sample is ``invalid_payload`` and changes nothing; a
    node no longer paired is ``stale_connection``."""
    try:
        stats = NodeHostStatsPayload.model_validate(payload)
    except ValueError:
        return {"handled": False, "reason": "invalid_payload"}
    if declarations.node_host_stats_record(node_id=ctx.node_id, stats=stats) is None:
        return {"handled": False, "reason": "stale_connection"}
    return {"handled": True, "reason": "updated"}


registry.node_event_handlers[NODE_HOST_STATS_EVENT] = _node_host_stats


# A worker's progress (its turns' steps and tool output) comes this way: bounded by maxPayload only.
@method("node.event", params=NodeEventParams, role="node", max_frame_bytes=None)
async def node_event_rpc(ctx: RpcContext, params: NodeEventParams) -> dict:
    if params.event == invoke.PROGRESS_EVENT:
        # On the event loop, without a thread hop: a worker's reply streams through here.
        return {"ok": True, "event": params.event, **await invoke.forward_progress(ctx, _event_payload(params))}
    return await database_sync_to_async(_node_event)(ctx, params)


def _event_payload(params: NodeEventParams) -> Any:
    if params.payload is None and params.payloadJSON:
        try:
            return decode_frame(params.payloadJSON)
        except FrameRejected as rejected:
            raise InvalidRequest(f"invalid node.event params: payloadJSON: {rejected.reason}") from None
    return params.payload


def _node_event(ctx: RpcContext, params: NodeEventParams) -> dict:
    if params.event == "node.presence.alive":
        persisted = connections.node_presence_touch(node_id=ctx.node_id, reason="alive")
        return {
            "ok": True,
            "event": params.event,
            "handled": persisted,
            "reason": "persisted" if persisted else "not-paired",
        }
    handler = registry.node_event_handlers.get(params.event)
    if handler is None:
        return {"ok": True, "event": params.event, "handled": False, "reason": "unknown-event"}
    return {"ok": True, "event": params.event, **handler(ctx, _event_payload(params))}
