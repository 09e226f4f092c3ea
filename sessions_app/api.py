"""JSON API of sessions_app: sessions, chat turns and runs, over the same services as the RPC.

Payloads are the gateway methods' (``selectors.*_payload``), except that a missing session is a
404 here where the RPC answers ``null`` or ``deleted: false``. Session keys go in the path as they
are (``agent:main:main``; a bare key is placed under the default agent). The ``runs/`` routes are
registered before the ``{key}`` ones, so a session whose bare key is ``runs`` needs its full key.
"""

from __future__ import annotations

import uuid
from typing import Literal

from channels.db import database_sync_to_async
from django.http import HttpRequest
from ninja import Query, Router, Schema, Status
from pydantic import ConfigDict, Field

from openclaw_site.gateway.api import ErrorOut
from openclaw_site.gateway.exceptions import NotFound

from . import forks, keys, selectors, services
from .rpc import SessionsCreateParams, create_from_params, wait_for_run

router = Router(tags=["sessions"])

ERRORS = {400: ErrorOut, 404: ErrorOut, 409: ErrorOut, 503: ErrorOut}
MAX_WAIT_MS = 24 * 3600 * 1000  # as agent.wait


class ClosedSchema(Schema):
    """Request bodies refuse unknown fields, like the gateway methods' params."""

    model_config = ConfigDict(extra="forbid")


class SessionListQuery(Schema):
    limit: int = Field(default=100, ge=1, le=1000)
    offset: int = Field(default=0, ge=0)
    agentId: str | None = None
    label: str | None = None
    search: str | None = Field(default=None, max_length=200)
    archived: bool | Literal["all"] = False


class SessionCreateIn(SessionsCreateParams):
    """The body of POST /api/sessions/: the sessions.create params."""


class SessionPatchIn(ClosedSchema):
    label: str | None = Field(default=None, max_length=200)
    displayName: str | None = Field(default=None, max_length=200)
    category: str | None = Field(default=None, max_length=100)
    archived: bool | None = None
    pinned: bool | None = None
    model: str | None = Field(default=None, max_length=200)
    expectedSessionId: str | None = None
    expectedLifecycleRevision: str | None = None


class SessionDeleteQuery(Schema):
    expectedSessionId: str | None = None
    expectedLifecycleRevision: str | None = None


class HistoryQuery(Schema):
    limit: int = Field(default=200, ge=1, le=1000)


class MessageIn(ClosedSchema):
    message: str
    idempotencyKey: str | None = Field(default=None, min_length=1, max_length=200)
    wait: bool = True
    timeoutMs: int = Field(default=30_000, ge=0, le=MAX_WAIT_MS)


class AbortIn(ClosedSchema):
    runId: str | None = Field(default=None, min_length=1)


class RunOut(Schema):
    runId: str
    sessionKey: str
    status: Literal["queued", "running", "ok", "error", "aborted"]
    startedAt: int | None
    endedAt: int | None
    error: str | None
    outputText: str | None


def _key(key: str) -> str:
    return keys.canonical_key(key)


# --- runs (before the {key} routes) ---------------------------------------------------------


@router.get("/runs/{run_id}", response={200: RunOut, **ERRORS})
def run_detail(request: HttpRequest, run_id: str):
    run = selectors.run_get(run_id)
    if run is None:
        raise NotFound(f"run not found: {run_id}")
    return selectors.run_row(run)


# --- sessions -------------------------------------------------------------------------------


@router.get("/", response={200: dict, **ERRORS})
def session_list(request: HttpRequest, filters: Query[SessionListQuery]):
    return selectors.sessions_list_payload(
        limit=filters.limit,
        offset=filters.offset,
        agent_id=filters.agentId,
        label=filters.label,
        search=filters.search,
        archived=filters.archived,
    )


@router.post("/", response={201: dict, **ERRORS})
def session_create(request: HttpRequest, payload: SessionCreateIn):
    return Status(201, create_from_params(payload))


class AdoptIn(ClosedSchema):
    threadId: str = Field(min_length=1)
    harness: str = "native"
    agentId: str | None = None
    key: str | None = None
    label: str | None = Field(default=None, max_length=200)


@router.post("/adopt", response={201: dict, **ERRORS})
def session_adopt(request: HttpRequest, payload: AdoptIn):
    """A new locked session continuing an existing native thread of an agent harness."""
    return Status(
        201,
        forks.session_adopt_requested(
            thread_id=payload.threadId,
            harness_id=payload.harness,
            agent_id=payload.agentId,
            key=payload.key,
            label=payload.label,
        ),
    )


class ForkIn(ClosedSchema):
    entryId: str = Field(min_length=1)


@router.post("/{key}/fork", response={201: dict, **ERRORS})
def session_fork(request: HttpRequest, key: str, payload: ForkIn):
    """A new session from the history before one of the source's user messages."""
    return Status(201, forks.session_fork(session_key=_key(key), entry_id=payload.entryId))


@router.get("/{key}", response={200: dict, **ERRORS})
def session_describe(request: HttpRequest, key: str):
    return {"session": selectors.session_row(selectors.session_require(_key(key)))}


@router.patch("/{key}", response={200: dict, **ERRORS})
def session_patch(request: HttpRequest, key: str, payload: SessionPatchIn):
    session = services.session_patch(
        key=_key(key),
        changes=payload.model_dump(exclude_unset=True, exclude={"expectedSessionId", "expectedLifecycleRevision"}),
        expected_session_id=payload.expectedSessionId,
        expected_lifecycle_revision=payload.expectedLifecycleRevision,
    )
    return selectors.session_entry_payload(session, resolved=True)


@router.delete("/{key}", response={200: dict, **ERRORS})
def session_delete(request: HttpRequest, key: str, expected: Query[SessionDeleteQuery]):
    key = _key(key)
    deleted = services.session_delete(
        key=key,
        expected_session_id=expected.expectedSessionId,
        expected_lifecycle_revision=expected.expectedLifecycleRevision,
    )
    if not deleted:
        raise NotFound(f"session not found: {key}")
    return {"ok": True, "key": key, "deleted": True}


# --- chat -----------------------------------------------------------------------------------


@router.get("/{key}/history", response={200: dict, **ERRORS})
def session_history(request: HttpRequest, key: str, query: Query[HistoryQuery]):
    return selectors.chat_history(selectors.session_require(_key(key)), limit=query.limit)


@router.post("/{key}/messages", response={200: dict, **ERRORS})
async def session_send(request: HttpRequest, key: str, payload: MessageIn):
    """chat.send, then (``wait``) agent.wait: the run's outcome, or ``status: "timeout"``.

    The wait sleeps on the run-finished notification (re-reading the run on a slow timer in case
    one is lost), so a long wait costs no database polling.
    """
    submitted = await database_sync_to_async(services.chat_send)(
        session_key=_key(key),
        message=payload.message,
        idempotency_key=payload.idempotencyKey or str(uuid.uuid4()),
    )
    if not payload.wait:
        return selectors.chat_send_payload(submitted)
    return await wait_for_run(submitted.run.run_id, payload.timeoutMs)


@router.post("/{key}/abort", response={200: dict, **ERRORS})
def session_abort(request: HttpRequest, key: str, payload: AbortIn | None = None):
    run_ids = services.run_abort(session_key=_key(key), run_id=payload.runId if payload is not None else None)
    return selectors.chat_abort_payload(run_ids)
