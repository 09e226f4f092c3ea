"""Gateway methods of sessions_app: sessions.*, chat.*, agent.wait, and the clients' start-up reads of agents,
models and commands (agents.list, agent.identity.get, models.list, models.authStatus, commands.list,
chat.metadata), the sessions' part of status, and diagnostics.lanes."""

from __future__ import annotations

from channels.db import database_sync_to_async

from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.registry import registry

from . import agents, history, keys, model_catalog, selectors, summary
from .commands import chat_metadata_payload, commands_list_payload
from .schemas import (
    MESSAGE_FRAME_BYTES,
    AgentIdentityParams,
    AgentWaitParams,
    ChatAbortParams,
    ChatHistoryParams,
    ChatMetadataParams,
    ChatSendParams,
    CommandsListParams,
    ModelsAuthStatusParams,
    ModelsListParams,
    SessionsAdoptParams,
    SessionsCreateParams,
    SessionsDeleteParams,
    SessionsDescribeParams,
    SessionsForkParams,
    SessionsListParams,
    SessionsPatchParams,
    SessionsResetParams,
)
from .services import commands, creation, forks, runs, sessions
from .waiters import wait_for_run

method = registry.method

registry.snapshot_provider(lambda ctx: {"sessionDefaults": selectors.session_defaults()})
registry.status_provider(summary.status_sessions)


def _key(key: str, agent_id: str | None) -> str:
    return keys.canonical_key(key, agent_id)


# --- sessions.* -----------------------------------------------------------------------------


@method(
    "sessions.create",
    params=SessionsCreateParams,
    scope=sc.WRITE,
    max_frame_bytes=MESSAGE_FRAME_BYTES,
    params_scope=SessionsCreateParams.required_scope,
)
def sessions_create_rpc(ctx: RpcContext, params: SessionsCreateParams) -> dict:
    created = creation.session_create_requested(request=params)
    return selectors.session_created_payload(created.session, worktree=created.worktree, run=created.run)


@method("sessions.list", params=SessionsListParams, scope=sc.READ)
def sessions_list_rpc(ctx: RpcContext, params: SessionsListParams) -> dict:
    return selectors.sessions_list_payload(params)


@method("sessions.describe", params=SessionsDescribeParams, scope=sc.READ)
def sessions_describe_rpc(ctx: RpcContext, params: SessionsDescribeParams) -> dict:
    row = selectors.session_described(
        _key(params.key, params.agentId),
        derived_title=bool(params.includeDerivedTitles),
        last_message=bool(params.includeLastMessage),
    )
    return {"session": row}


@method("sessions.patch", params=SessionsPatchParams, scope=sc.WRITE, params_scope=SessionsPatchParams.required_scope)
def sessions_patch_rpc(ctx: RpcContext, params: SessionsPatchParams) -> dict:
    key = _key(params.key, params.agentId)
    if params.sets_only_settings_not_kept():
        # Accepted with no effect (docs/gateway-protocol.md, "OpenClaw's params"): the session as it is.
        return selectors.session_entry_payload(selectors.session_require(key), resolved=True)
    session = sessions.session_patch(
        key=key,
        changes=params.changes(),
        expected_session_id=params.expectedSessionId,
        expected_lifecycle_revision=params.expectedLifecycleRevision,
        expected_revision=params.expectedRevision,
    )
    return selectors.session_entry_payload(session, resolved=True)


@method("sessions.reset", params=SessionsResetParams, scope=sc.ADMIN)
def sessions_reset_rpc(ctx: RpcContext, params: SessionsResetParams) -> dict:
    session = sessions.session_reset(
        key=_key(params.key, params.agentId),
        reason=params.reason,
        expected_session_id=params.expectedSessionId,
        expected_lifecycle_revision=params.expectedLifecycleRevision,
        expected_revision=params.expectedRevision,
    )
    return selectors.session_entry_payload(session)


@method(
    "sessions.delete", params=SessionsDeleteParams, scope=sc.ADMIN, params_scope=SessionsDeleteParams.required_scope
)
def sessions_delete_rpc(ctx: RpcContext, params: SessionsDeleteParams) -> dict:
    key = _key(params.key, params.agentId)
    deleted = sessions.session_delete(
        key=key,
        archived_only=bool(params.archivedOnly),
        expected_session_id=params.expectedSessionId,
        expected_lifecycle_revision=params.expectedLifecycleRevision,
        expected_revision=params.expectedRevision,
        expected_updated_at_ms=params.expectedSessionUpdatedAt,
    )
    return {"ok": True, "key": key, "deleted": deleted, "archived": []}


@method("sessions.subscribe", params=SessionsListParams, scope=sc.READ)
async def sessions_subscribe_rpc(ctx: RpcContext, params: SessionsListParams) -> dict:
    """OpenClaw's: with sessions.list's params it also answers that list (``list``)."""
    await ctx.subscribe("sessions")
    if not params.model_fields_set:
        return {"subscribed": True}
    return {"subscribed": True, "list": await database_sync_to_async(selectors.sessions_list_payload)(params)}


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
    submitted = commands.chat_submit(
        session_key=_key(params.sessionKey, params.agentId),
        message=params.message,
        idempotency_key=params.idempotencyKey,
        expected_session_id=params.sessionId,
        origin_channel=ctx.channel_name,
        scopes=ctx.scopes,
        interpret_commands=not params.suppressCommandInterpretation,
    )
    return selectors.chat_send_payload(submitted.run, created=submitted.created)


@method("chat.history", params=ChatHistoryParams, scope=sc.READ)
def chat_history_rpc(ctx: RpcContext, params: ChatHistoryParams) -> dict:
    session = history.session_for_page(_key(params.sessionKey, params.agentId))
    if session is None:
        return history.empty_main_page(params.sessionKey)
    return history.chat_history_payload(session, params)


@method("chat.abort", params=ChatAbortParams, scope=sc.WRITE)
def chat_abort_rpc(ctx: RpcContext, params: ChatAbortParams) -> dict:
    run_ids = runs.run_abort(session_key=_key(params.sessionKey, params.agentId), run_id=params.runId)
    return selectors.chat_abort_payload(run_ids)


@method("agent.wait", params=AgentWaitParams, scope=sc.WRITE)
async def agent_wait_rpc(ctx: RpcContext, params: AgentWaitParams) -> dict:
    return await wait_for_run(params.runId, params.timeoutMs, ctx)


# --- agents, models, commands: what OpenClaw's clients read at start ---------------------------------
# Every valid agent id is usable here (all share the gateway's provider), so an agent id is checked, not looked up.


@method("agents.list", scope=sc.READ)
def agents_list_rpc(ctx: RpcContext, params) -> dict:
    return agents.agents_list_payload()


@method("agent.identity.get", params=AgentIdentityParams, scope=sc.READ)
async def agent_identity_get_rpc(ctx: RpcContext, params: AgentIdentityParams) -> dict:
    if params.agentId is not None:
        agent_id = keys.normalize_agent_id(params.agentId)
    elif params.sessionKey:
        agent_id = keys.agent_of(_key(params.sessionKey, None))
    else:
        agent_id = keys.DEFAULT_AGENT_ID
    return agents.agent_identity_payload(agent_id)


def _check_target(agent_id: str | None, session_key: str | None) -> None:
    """An agent id and session key a read names must be valid ones (the read does not depend on them)."""
    if agent_id is not None:
        keys.normalize_agent_id(agent_id)
    if session_key is not None:
        _key(session_key, agent_id)


@method("models.list", params=ModelsListParams, scope=sc.READ)
async def models_list_rpc(ctx: RpcContext, params: ModelsListParams) -> dict:
    _check_target(params.agentId, params.sessionKey)
    return model_catalog.models_list_payload(params)


@method("models.authStatus", params=ModelsAuthStatusParams, scope=sc.READ)
async def models_auth_status_rpc(ctx: RpcContext, params: ModelsAuthStatusParams) -> dict:
    _check_target(params.agentId or None, None)
    return model_catalog.models_auth_status_payload()


@method("commands.list", params=CommandsListParams, scope=sc.READ)
async def commands_list_rpc(ctx: RpcContext, params: CommandsListParams) -> dict:
    _check_target(params.agentId, params.sessionKey)
    return commands_list_payload(params)


@method("chat.metadata", params=ChatMetadataParams, scope=sc.READ)
def chat_metadata_rpc(ctx: RpcContext, params: ChatMetadataParams) -> dict:
    _check_target(params.agentId, None)
    session = selectors.session_get(_key(params.sessionKey, params.agentId)) if params.sessionKey else None
    return chat_metadata_payload(session)


@method("diagnostics.lanes", scope=sc.READ)
def diagnostics_lanes_rpc(ctx: RpcContext, params) -> dict:
    return summary.session_lanes()
