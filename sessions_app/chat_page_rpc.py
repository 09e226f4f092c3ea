"""Gateway methods of OpenClaw's Control UI chat page: ``chat.startup``, ``sessions.resolve`` (not advertised,
as in OpenClaw) and ``sessions.messages.subscribe`` / ``unsubscribe``. All need ``operator.read`` (OpenClaw's
method-scope table)."""

from __future__ import annotations

from channels.db import database_sync_to_async

from approvals_app.session_events import session_approval_replay
from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.exceptions import InvalidRequest
from gateway.registry import registry

from . import keys, message_subscriptions, startup
from .resolve import session_resolve
from .schemas import (
    ChatStartupParams,
    SessionsMessagesSubscribeParams,
    SessionsMessagesUnsubscribeParams,
    SessionsResolveParams,
)

method = registry.method


@method("chat.startup", params=ChatStartupParams, scope=sc.READ)
async def chat_startup_rpc(ctx: RpcContext, params: ChatStartupParams) -> dict:
    if params.shortId is not None:
        # As OpenClaw's: a chat page opened by its link follows the session list from then on.
        await ctx.subscribe("sessions")
    return await database_sync_to_async(startup.chat_startup)(params)


@method("sessions.resolve", params=SessionsResolveParams, scope=sc.READ, advertise=False)
def sessions_resolve_rpc(ctx: RpcContext, params: SessionsResolveParams) -> dict:
    return session_resolve(params).payload()


def may_review_approvals(ctx: RpcContext) -> bool:
    """OpenClaw's ``canReviewOperatorApproval``: an admin, or a paired device holding ``operator.approvals``."""
    return sc.ADMIN in ctx.scopes or (sc.APPROVALS in ctx.scopes and bool(ctx.device_id))


@method("sessions.messages.subscribe", params=SessionsMessagesSubscribeParams, scope=sc.READ)
async def sessions_messages_subscribe_rpc(ctx: RpcContext, params: SessionsMessagesSubscribeParams) -> dict:
    """Follow one session's messages (and, with ``includeApprovals``, its exec approvals) on this connection
    until it unsubscribes or closes. A session that does not exist yet may be followed: its first messages
    come as it is created (OpenClaw subscribes by key alike)."""
    key = keys.canonical_key(params.key, params.agentId)
    include_approvals = params.includeApprovals is True
    if include_approvals and not may_review_approvals(ctx):
        raise InvalidRequest(
            f"sessions.messages.subscribe includeApprovals requires a paired device and gateway scope: {sc.APPROVALS}"
        )
    # Subscribed before the replay is read: an approval requested meanwhile is in the replay or comes as an event.
    await message_subscriptions.subscribe(ctx, key, include_approvals=include_approvals)
    payload: dict = {"subscribed": True, "key": key}
    if include_approvals:
        payload["approvalReplay"] = await database_sync_to_async(session_approval_replay)(key)
    return payload


@method("sessions.messages.unsubscribe", params=SessionsMessagesUnsubscribeParams, scope=sc.READ)
async def sessions_messages_unsubscribe_rpc(ctx: RpcContext, params: SessionsMessagesUnsubscribeParams) -> dict:
    """Stop following a session; answered alike whether or not this connection followed it (OpenClaw's)."""
    key = keys.canonical_key(params.key, params.agentId)
    await message_subscriptions.unsubscribe(ctx, key)
    return {"subscribed": False, "key": key}
