"""Gateway methods of sessions_app: sessions.*, chat.*, agent.wait."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from channels.db import database_sync_to_async
from django.conf import settings
from pydantic import Field

from openclaw_site.gateway import scopes as sc
from openclaw_site.gateway.context import RpcContext
from openclaw_site.gateway.exceptions import InvalidRequest, NotFound
from openclaw_site.gateway.protocol import ClosedModel
from openclaw_site.gateway.registry import registry

from . import keys, selectors, services, workspace
from .providers import default_model
from .waiters import run_waiters

method = registry.method

WORKTREE_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"


def _key(key: str, agent_id: str | None) -> str:
    return keys.canonical_key(key, agent_id)


def _provider_name() -> str:
    return settings.OPENCLAW_MODEL["PROVIDER"]


def _resolved(session) -> dict:
    return {"modelProvider": session.model_provider or _provider_name(), "model": session.model or default_model()}


def session_defaults(ctx: RpcContext | None = None) -> dict:
    return {
        "defaultAgentId": keys.DEFAULT_AGENT_ID,
        "mainKey": keys.MAIN_KEY,
        "mainSessionKey": keys.main_key(),
        "modelProvider": _provider_name(),
        "model": default_model(),
    }


registry.snapshot_provider(lambda ctx: {"sessionDefaults": session_defaults(ctx)})


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


@method("sessions.create", params=SessionsCreateParams, scope=sc.WRITE)
def sessions_create_rpc(ctx: RpcContext, params: SessionsCreateParams) -> dict:
    agent_id = keys.normalize_agent_id(params.agentId)
    plan = workspace.plan_session_workspace(
        cwd=params.cwd,
        worktree=bool(params.worktree),
        worktree_base_ref=params.worktreeBaseRef,
        worktree_name=params.worktreeName,
        exec_node=params.execNode,
    )
    key = _key(params.key, agent_id) if params.key else keys.dashboard_key(agent_id)
    spec = services.SessionSpec(
        key=key,
        agent_id=keys.agent_of(key),
        label=(params.label or "").strip(),
        display_name=(params.displayName or "").strip(),
        model=(params.model or "").strip(),
        parent_session_key=_key(params.parentSessionKey, agent_id)
        if params.parentSessionKey
        else keys.main_key(agent_id),
        cwd=plan.cwd,
    )
    session, worktree = workspace.create_session_with_workspace(spec=spec, plan=plan)
    result: dict[str, Any] = {
        "ok": True,
        "key": session.key,
        "sessionId": session.session_id,
        "entry": selectors.session_row(session),
        "runStarted": False,
        "resolved": _resolved(session),
    }
    if worktree is not None:
        result["worktree"] = {"id": worktree["id"], "path": worktree["path"], "branch": worktree["branch"]}
    if params.message is not None:
        run_id = params.idempotencyKey or f"create-{session.session_id}"
        submitted = services.run_submit(session_key=session.key, message=params.message, idempotency_key=run_id)
        result.update(runStarted=True, runId=submitted.run.run_id)
    return result


class SessionsListParams(ClosedModel):
    limit: int = Field(default=100, ge=1, le=1000)
    offset: int = Field(default=0, ge=0)
    agentId: str | None = None
    label: str | None = None
    search: str | None = Field(default=None, max_length=200)
    archived: bool | Literal["all"] = False


@method("sessions.list", params=SessionsListParams, scope=sc.READ)
def sessions_list_rpc(ctx: RpcContext, params: SessionsListParams) -> dict:
    sessions, has_more = selectors.sessions_page(
        limit=params.limit,
        offset=params.offset,
        agent_id=keys.normalize_agent_id(params.agentId) if params.agentId else None,
        label=params.label,
        search=params.search,
        archived=params.archived,
    )
    return {
        "ts": int(time.time() * 1000),
        "count": len(sessions),
        "limitApplied": params.limit,
        "offset": params.offset,
        "nextOffset": params.offset + len(sessions) if has_more else None,
        "hasMore": has_more,
        "defaults": session_defaults(ctx),
        "sessions": [selectors.session_row(s) for s in sessions],
    }


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
    if not changes:
        raise InvalidRequest("sessions.patch needs at least one change")
    session = services.session_patch(
        key=_key(params.key, params.agentId),
        changes=changes,
        expected_session_id=params.expectedSessionId,
        expected_lifecycle_revision=params.expectedLifecycleRevision,
    )
    return {"ok": True, "key": session.key, "entry": selectors.session_row(session), "resolved": _resolved(session)}


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
    return {"ok": True, "key": session.key, "entry": selectors.session_row(session)}


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
    ctx.subscriptions.add("sessions")
    return {"subscribed": True}


@method("sessions.unsubscribe", scope=sc.READ)
async def sessions_unsubscribe_rpc(ctx: RpcContext, params) -> dict:
    ctx.subscriptions.discard("sessions")
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


def _session_for_turn(session_key: str, agent_id: str | None):
    key = _key(session_key, agent_id)
    session = selectors.session_get(key)
    if session is None and keys.is_main_key(key):
        session = services.session_ensure_main(agent_id=keys.agent_of(key))
    if session is None:
        raise NotFound(f"session not found: {key}")
    return session


@method("chat.send", params=ChatSendParams, scope=sc.WRITE)
def chat_send_rpc(ctx: RpcContext, params: ChatSendParams) -> dict:
    session = _session_for_turn(params.sessionKey, params.agentId)
    if params.sessionId is not None and params.sessionId != session.session_id:
        raise InvalidRequest(f"sessionId does not match the current session of {session.key}")
    submitted = services.run_submit(
        session_key=session.key, message=params.message, idempotency_key=params.idempotencyKey
    )
    run = submitted.run
    if submitted.created:
        return {"runId": run.run_id, "status": "started"}
    if not run.is_terminal:
        return {"runId": run.run_id, "status": "in_flight"}
    if run.status == "ok":
        return {"runId": run.run_id, "status": "ok"}
    return {"runId": run.run_id, "status": "error", "summary": run.error or run.status}


class ChatHistoryParams(ClosedModel):
    sessionKey: str = Field(min_length=1)
    agentId: str | None = None
    limit: int = Field(default=200, ge=1, le=1000)
    maxChars: int | None = Field(default=None, ge=1)


@method("chat.history", params=ChatHistoryParams, scope=sc.READ)
def chat_history_rpc(ctx: RpcContext, params: ChatHistoryParams) -> dict:
    key = _key(params.sessionKey, params.agentId)
    session = selectors.session_get(key)
    if session is None:
        raise NotFound(f"session not found: {key}")
    return selectors.chat_history(session, limit=params.limit)


class ChatAbortParams(ClosedModel):
    sessionKey: str = Field(min_length=1)
    agentId: str | None = None
    runId: str | None = None


@method("chat.abort", params=ChatAbortParams, scope=sc.WRITE)
def chat_abort_rpc(ctx: RpcContext, params: ChatAbortParams) -> dict:
    run_ids = services.run_abort(session_key=_key(params.sessionKey, params.agentId), run_id=params.runId)
    return {"ok": True, "aborted": bool(run_ids), "runIds": run_ids}


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
