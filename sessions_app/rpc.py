"""Gateway methods of sessions_app: sessions.*, chat.*, agent.wait."""

from __future__ import annotations

from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.registry import registry

from . import keys, selectors
from .schemas import (
    MESSAGE_FRAME_BYTES,
    AgentWaitParams,
    ChatAbortParams,
    ChatHistoryParams,
    ChatSendParams,
    SessionRef,
    SessionsAdoptParams,
    SessionsCreateParams,
    SessionsDeleteParams,
    SessionsForkParams,
    SessionsListParams,
    SessionsPatchParams,
    SessionsResetParams,
)
from .services import creation, forks, runs, sessions
from .waiters import wait_for_run

method = registry.method

registry.snapshot_provider(lambda ctx: {"sessionDefaults": selectors.session_defaults()})


def _key(key: str, agent_id: str | None) -> str:
    return keys.canonical_key(key, agent_id)


# --- sessions.* -----------------------------------------------------------------------------


@method("sessions.create", params=SessionsCreateParams, scope=sc.WRITE, max_frame_bytes=MESSAGE_FRAME_BYTES)
def sessions_create_rpc(ctx: RpcContext, params: SessionsCreateParams) -> dict:
    created = creation.session_create_requested(request=params)
    return selectors.session_created_payload(created.session, worktree=created.worktree, run=created.run)


@method("sessions.list", params=SessionsListParams, scope=sc.READ)
def sessions_list_rpc(ctx: RpcContext, params: SessionsListParams) -> dict:
    return selectors.sessions_list_payload(params)


@method("sessions.describe", params=SessionRef, scope=sc.READ)
def sessions_describe_rpc(ctx: RpcContext, params: SessionRef) -> dict:
    return {"session": selectors.session_row_of(_key(params.key, params.agentId))}


@method("sessions.patch", params=SessionsPatchParams, scope=sc.ADMIN)
def sessions_patch_rpc(ctx: RpcContext, params: SessionsPatchParams) -> dict:
    session = sessions.session_patch(
        key=_key(params.key, params.agentId),
        changes=params.changes(),
        expected_session_id=params.expectedSessionId,
        expected_lifecycle_revision=params.expectedLifecycleRevision,
    )
    return selectors.session_entry_payload(session, resolved=True)


@method("sessions.reset", params=SessionsResetParams, scope=sc.ADMIN)
def sessions_reset_rpc(ctx: RpcContext, params: SessionsResetParams) -> dict:
    session = sessions.session_reset(
        key=_key(params.key, params.agentId),
        reason=params.reason,
        expected_session_id=params.expectedSessionId,
        expected_lifecycle_revision=params.expectedLifecycleRevision,
    )
    return selectors.session_entry_payload(session)


@method("sessions.delete", params=SessionsDeleteParams, scope=sc.ADMIN)
def sessions_delete_rpc(ctx: RpcContext, params: SessionsDeleteParams) -> dict:
    key = _key(params.key, params.agentId)
    deleted = sessions.session_delete(
        key=key,
        expected_session_id=params.expectedSessionId,
        expected_lifecycle_revision=params.expectedLifecycleRevision,
    )
    return {"ok": True, "key": key, "deleted": deleted, "archived": []}


@method("sessions.subscribe", scope=sc.READ)
async def sessions_subscribe_rpc(ctx: RpcContext, params) -> dict:
    await ctx.subscribe("sessions")
    return {"subscribed": True}


@method("sessions.unsubscribe", scope=sc.READ)
async def sessions_unsubscribe_rpc(ctx: RpcContext, params) -> dict:
    await ctx.unsubscribe("sessions")
    return {"subscribed": False}


@method("sessions.fork", params=SessionsForkParams, scope=sc.WRITE)
def sessions_fork_rpc(ctx: RpcContext, params: SessionsForkParams) -> dict:
    return forks.session_fork(session_key=_key(params.sessionKey, params.agentId), entry_id=params.entryId)


@method("sessions.adopt", params=SessionsAdoptParams, scope=sc.WRITE)
def sessions_adopt_rpc(ctx: RpcContext, params: SessionsAdoptParams) -> dict:
    session = forks.session_adopt_requested(request=params)
    return selectors.session_adopted_payload(session)


# --- chat.* and agent.wait ------------------------------------------------------------------


@method("chat.send", params=ChatSendParams, scope=sc.WRITE, max_frame_bytes=MESSAGE_FRAME_BYTES)
def chat_send_rpc(ctx: RpcContext, params: ChatSendParams) -> dict:
    submitted = runs.chat_send(
        session_key=_key(params.sessionKey, params.agentId),
        message=params.message,
        idempotency_key=params.idempotencyKey,
        expected_session_id=params.sessionId,
        origin_channel=ctx.channel_name,
    )
    return selectors.chat_send_payload(submitted.run, created=submitted.created)


@method("chat.history", params=ChatHistoryParams, scope=sc.READ)
def chat_history_rpc(ctx: RpcContext, params: ChatHistoryParams) -> dict:
    session = selectors.session_require(_key(params.sessionKey, params.agentId))
    return selectors.chat_history(session, limit=params.limit)


@method("chat.abort", params=ChatAbortParams, scope=sc.WRITE)
def chat_abort_rpc(ctx: RpcContext, params: ChatAbortParams) -> dict:
    run_ids = runs.run_abort(session_key=_key(params.sessionKey, params.agentId), run_id=params.runId)
    return selectors.chat_abort_payload(run_ids)


@method("agent.wait", params=AgentWaitParams, scope=sc.WRITE)
async def agent_wait_rpc(ctx: RpcContext, params: AgentWaitParams) -> dict:
    return await wait_for_run(params.runId, params.timeoutMs, ctx)
