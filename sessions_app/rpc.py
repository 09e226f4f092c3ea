"""Gateway methods of sessions_app: sessions.*, chat.*, agent.wait."""

from __future__ import annotations

import asyncio
from typing import Literal

from channels.db import database_sync_to_async
from pydantic import Field

from openclaw_site.gateway import scopes as sc
from openclaw_site.gateway.context import RpcContext
from openclaw_site.gateway.protocol import ClosedModel
from openclaw_site.gateway.registry import registry

from . import forks, keys, selectors, services
from .waiters import run_waiters

method = registry.method

WORKTREE_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"


def _key(key: str, agent_id: str | None) -> str:
    return keys.canonical_key(key, agent_id)


registry.snapshot_provider(lambda ctx: {"sessionDefaults": selectors.session_defaults()})


# --- sessions.* -----------------------------------------------------------------------------


class SessionsCreateParams(ClosedModel):
    key: str | None = None
    idempotencyKey: str | None = None
    agentId: str | None = None
    label: str | None = Field(default=None, max_length=200)
    displayName: str | None = Field(default=None, max_length=200)
    category: str | None = Field(default=None, max_length=100)
    model: str | None = Field(default=None, max_length=200)
    parentSessionKey: str | None = None
    message: str | None = None
    worktree: bool | None = None
    worktreeBaseRef: str | None = Field(default=None, max_length=200)
    worktreeName: str | None = Field(default=None, pattern=WORKTREE_NAME_PATTERN)
    cwd: str | None = None
    execNode: str | None = None


def create_from_params(params: SessionsCreateParams) -> dict:
    """sessions.create for the RPC method and the JSON API (which accepts the same body)."""
    created = services.session_create_requested(
        key=params.key,
        agent_id=params.agentId,
        label=params.label,
        category=params.category,
        display_name=params.displayName,
        model=params.model,
        parent_session_key=params.parentSessionKey,
        worktree=bool(params.worktree),
        worktree_base_ref=params.worktreeBaseRef,
        worktree_name=params.worktreeName,
        cwd=params.cwd,
        exec_node=params.execNode,
        message=params.message,
        idempotency_key=params.idempotencyKey,
    )
    return selectors.session_created_payload(created)


@method("sessions.create", params=SessionsCreateParams, scope=sc.WRITE)
def sessions_create_rpc(ctx: RpcContext, params: SessionsCreateParams) -> dict:
    return create_from_params(params)


class SessionsListParams(ClosedModel):
    limit: int = Field(default=100, ge=1, le=1000)
    offset: int = Field(default=0, ge=0)
    agentId: str | None = None
    label: str | None = None
    search: str | None = Field(default=None, max_length=200)
    archived: bool | Literal["all"] = False


@method("sessions.list", params=SessionsListParams, scope=sc.READ)
def sessions_list_rpc(ctx: RpcContext, params: SessionsListParams) -> dict:
    return selectors.sessions_list_payload(
        limit=params.limit,
        offset=params.offset,
        agent_id=params.agentId,
        label=params.label,
        search=params.search,
        archived=params.archived,
    )


class SessionKeyParams(ClosedModel):
    key: str = Field(min_length=1)
    agentId: str | None = None


@method("sessions.describe", params=SessionKeyParams, scope=sc.READ)
def sessions_describe_rpc(ctx: RpcContext, params: SessionKeyParams) -> dict:
    session = selectors.session_get(_key(params.key, params.agentId))
    return {"session": selectors.session_row(session) if session is not None else None}


class SessionsPatchParams(ClosedModel):
    key: str = Field(min_length=1)
    agentId: str | None = None
    label: str | None = Field(default=None, max_length=200)
    displayName: str | None = Field(default=None, max_length=200)
    category: str | None = Field(default=None, max_length=100)
    archived: bool | None = None
    pinned: bool | None = None
    model: str | None = Field(default=None, max_length=200)
    expectedSessionId: str | None = None
    expectedLifecycleRevision: str | None = None


@method("sessions.patch", params=SessionsPatchParams, scope=sc.ADMIN)
def sessions_patch_rpc(ctx: RpcContext, params: SessionsPatchParams) -> dict:
    changes = params.model_dump(
        exclude_unset=True, exclude={"key", "agentId", "expectedSessionId", "expectedLifecycleRevision"}
    )
    session = services.session_patch(
        key=_key(params.key, params.agentId),
        changes=changes,
        expected_session_id=params.expectedSessionId,
        expected_lifecycle_revision=params.expectedLifecycleRevision,
    )
    return selectors.session_entry_payload(session, resolved=True)


class SessionsResetParams(ClosedModel):
    key: str = Field(min_length=1)
    agentId: str | None = None
    reason: Literal["new", "reset"] = "reset"
    expectedSessionId: str | None = None
    expectedLifecycleRevision: str | None = None


@method("sessions.reset", params=SessionsResetParams, scope=sc.ADMIN)
def sessions_reset_rpc(ctx: RpcContext, params: SessionsResetParams) -> dict:
    session = services.session_reset(
        key=_key(params.key, params.agentId),
        reason=params.reason,
        expected_session_id=params.expectedSessionId,
        expected_lifecycle_revision=params.expectedLifecycleRevision,
    )
    return selectors.session_entry_payload(session)


class SessionsDeleteParams(ClosedModel):
    key: str = Field(min_length=1)
    agentId: str | None = None
    deleteTranscript: bool | None = None
    expectedSessionId: str | None = None
    expectedLifecycleRevision: str | None = None


@method("sessions.delete", params=SessionsDeleteParams, scope=sc.ADMIN)
def sessions_delete_rpc(ctx: RpcContext, params: SessionsDeleteParams) -> dict:
    key = _key(params.key, params.agentId)
    deleted = services.session_delete(
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


# --- chat.* and agent.wait ------------------------------------------------------------------


class ChatSendParams(ClosedModel):
    sessionKey: str = Field(min_length=1)
    message: str
    idempotencyKey: str = Field(min_length=1, max_length=200)
    agentId: str | None = None
    sessionId: str | None = None
    thinking: str | None = None
    timeoutMs: int | None = Field(default=None, ge=0)
    deliver: bool | None = None


@method("chat.send", params=ChatSendParams, scope=sc.WRITE)
def chat_send_rpc(ctx: RpcContext, params: ChatSendParams) -> dict:
    submitted = services.chat_send(
        session_key=_key(params.sessionKey, params.agentId),
        message=params.message,
        idempotency_key=params.idempotencyKey,
        expected_session_id=params.sessionId,
        origin_channel=ctx.channel_name,
    )
    return selectors.chat_send_payload(submitted)


class ChatHistoryParams(ClosedModel):
    sessionKey: str = Field(min_length=1)
    agentId: str | None = None
    limit: int = Field(default=200, ge=1, le=1000)
    maxChars: int | None = Field(default=None, ge=1)


@method("chat.history", params=ChatHistoryParams, scope=sc.READ)
def chat_history_rpc(ctx: RpcContext, params: ChatHistoryParams) -> dict:
    session = selectors.session_require(_key(params.sessionKey, params.agentId))
    return selectors.chat_history(session, limit=params.limit)


class ChatAbortParams(ClosedModel):
    sessionKey: str = Field(min_length=1)
    agentId: str | None = None
    runId: str | None = None


@method("chat.abort", params=ChatAbortParams, scope=sc.WRITE)
def chat_abort_rpc(ctx: RpcContext, params: ChatAbortParams) -> dict:
    run_ids = services.run_abort(session_key=_key(params.sessionKey, params.agentId), run_id=params.runId)
    return selectors.chat_abort_payload(run_ids)


class AgentWaitParams(ClosedModel):
    runId: str = Field(min_length=1)
    timeoutMs: int = Field(default=30_000, ge=0, le=24 * 3600 * 1000)


# Re-read the run at least this often even without a wake-up (a lost notification only delays).
WAIT_RECHECK_S = 5.0


async def wait_for_run(run_id: str, timeout_ms: int) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000
    while True:
        woken = run_waiters.add(run_id)  # before reading: a finish between read and wait still wakes us
        try:
            run = await database_sync_to_async(selectors.run_get)(run_id)
            if run is not None and run.is_terminal:
                return selectors.run_wait_payload(run)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return {"runId": run_id, "status": "timeout"}
            try:
                await asyncio.wait_for(woken, min(remaining, WAIT_RECHECK_S))
            except TimeoutError:
                pass
        finally:
            run_waiters.discard(run_id, woken)


@method("agent.wait", params=AgentWaitParams, scope=sc.WRITE)
async def agent_wait_rpc(ctx: RpcContext, params: AgentWaitParams) -> dict:
    return await wait_for_run(params.runId, params.timeoutMs)


class SessionsForkParams(ClosedModel):
    sessionKey: str = Field(min_length=1)
    agentId: str | None = None
    entryId: str = Field(min_length=1)


@method("sessions.fork", params=SessionsForkParams, scope=sc.WRITE)
def sessions_fork_rpc(ctx: RpcContext, params: SessionsForkParams) -> dict:
    return forks.session_fork(session_key=_key(params.sessionKey, params.agentId), entry_id=params.entryId)


class SessionsAdoptParams(ClosedModel):
    threadId: str = Field(min_length=1)
    harness: str = "native"
    agentId: str | None = None
    key: str | None = None
    label: str | None = Field(default=None, max_length=200)


@method("sessions.adopt", params=SessionsAdoptParams, scope=sc.WRITE)
def sessions_adopt_rpc(ctx: RpcContext, params: SessionsAdoptParams) -> dict:
    return forks.session_adopt_requested(
        thread_id=params.threadId,
        harness_id=params.harness,
        agent_id=params.agentId,
        key=params.key,
        label=params.label,
    )
