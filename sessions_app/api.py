"""JSON API of sessions_app: sessions, chat turns and runs, over the same services as the RPC.

Payloads are the gateway methods' (``selectors.*_payload``), except that a missing session is a
404 here where the RPC answers ``null`` or ``deleted: false``. Session keys go in the path as they
are (``agent:main:main``; a bare key is placed under the default agent). The ``runs`` routes are
registered before the ``{key}`` ones, so a session whose bare key is ``runs`` needs its full key.
"""

from __future__ import annotations

import uuid

from channels.db import database_sync_to_async
from django.http import HttpRequest
from ninja import Path, Query, Router, Status

from gateway.exceptions import NotFound
from gateway.http_auth import request_actor
from gateway.schemas import error_responses

from . import history, keys, selectors
from .schemas import (
    AbortTarget,
    ChatAbortOut,
    ChatHistoryOut,
    ChatHistoryParams,
    DeleteGuards,
    ForkEntry,
    HistoryPage,
    MessageIn,
    MessageOut,
    ResetRequest,
    RunOut,
    RunRef,
    RunsListParams,
    RunsPageOut,
    SessionAdoptedOut,
    SessionChanges,
    SessionCreatedOut,
    SessionDeletedOut,
    SessionDescribeOut,
    SessionEntryOut,
    SessionForkOut,
    SessionsAdoptParams,
    SessionsCreateParams,
    SessionsListOut,
    SessionsPageQuery,
)
from .services import creation, forks, runs, sessions
from .waiters import wait_for_run

router = Router(tags=["sessions"])


def _key(key: str) -> str:
    return keys.canonical_key(key)


# --- runs (before the {key} routes) ---------------------------------------------------------


@router.get("/runs", response={200: RunsPageOut, **error_responses()}, summary="List runs")
def run_list(request: HttpRequest, query: Query[RunsListParams]):
    """Chat turns of every session (or of ``sessionKey``), newest first, optionally of one ``status``.
    Pass a page's ``nextCursor`` as ``cursor`` for the next page; it is null on the last."""
    return selectors.runs_list_payload(query)


@router.get("/runs/{runId}", response={200: RunOut, **error_responses(404)}, summary="Get a run")
def run_detail(request: HttpRequest, params: Path[RunRef]):
    """One chat turn by its id (the ``idempotencyKey`` it was sent with), with its reply once it ended."""
    run = selectors.run_get(params.runId)
    if run is None:
        raise NotFound(f"run not found: {params.runId}")
    return selectors.run_row(run)


# --- sessions -------------------------------------------------------------------------------


@router.get("/", response={200: SessionsListOut, **error_responses()}, summary="List sessions", exclude_unset=True)
@router.get(
    "", response={200: SessionsListOut, **error_responses()}, include_in_schema=False, exclude_unset=True
)  # /api/sessions, without the slash
def session_list(request: HttpRequest, filters: Query[SessionsPageQuery]):
    """``sessions.list``: newest first, ``limit``/``offset`` pages; unarchived ones unless ``archived``."""
    return selectors.sessions_list_payload(filters)


@router.post(
    "/",
    response={201: SessionCreatedOut, **error_responses(404, 409, 503)},
    summary="Create a session",
    exclude_unset=True,
)
@router.post(
    "",
    response={201: SessionCreatedOut, **error_responses(404, 409, 503)},
    include_in_schema=False,
    exclude_unset=True,
)  # /api/sessions, without the slash
def session_create(request: HttpRequest, payload: SessionsCreateParams):
    """``sessions.create``: the body is its params. With ``message``, the first turn starts at once."""
    created = creation.session_create_requested(request=payload)
    return Status(201, selectors.session_created_payload(created.session, worktree=created.worktree, run=created.run))


@router.post(
    "/adopt",
    response={201: SessionAdoptedOut, **error_responses(409, 503)},
    summary="Adopt a native thread",
    exclude_unset=True,
)
def session_adopt(request: HttpRequest, payload: SessionsAdoptParams):
    """``sessions.adopt``: a new locked session continuing an existing native thread of an agent harness."""
    session = forks.session_adopt_requested(request=payload)
    return Status(201, selectors.session_adopted_payload(session))


@router.post("/{key}/fork", response={201: SessionForkOut, **error_responses(404, 503)}, summary="Fork a session")
def session_fork(request: HttpRequest, key: str, payload: ForkEntry):
    """``sessions.fork``: a new session from the history before one of the source's user messages."""
    return Status(201, forks.session_fork(session_key=_key(key), entry_id=payload.entryId))


@router.get(
    "/{key}", response={200: SessionDescribeOut, **error_responses(404)}, summary="Get a session", exclude_unset=True
)
def session_describe(request: HttpRequest, key: str):
    """``sessions.describe``; an unknown key is a 404."""
    canonical = _key(key)
    row = selectors.session_row_of(canonical)
    if row is None:
        raise NotFound(f"session not found: {canonical}")
    return {"session": row}


@router.patch(
    "/{key}",
    response={200: SessionEntryOut, **error_responses(404, 409, 503)},
    summary="Change a session",
    exclude_unset=True,
)
def session_patch(request: HttpRequest, key: str, payload: SessionChanges):
    """``sessions.patch``: only the fields sent change; ``expectedRevision`` (the row's ``revision``) refuses the
    change (409) when the row was written since, ``expectedSessionId`` / ``expectedLifecycleRevision`` when the
    session was reset or changed owner."""
    session = sessions.session_patch(
        key=_key(key),
        changes=payload.changes(),
        expected_session_id=payload.expectedSessionId,
        expected_lifecycle_revision=payload.expectedLifecycleRevision,
        expected_revision=payload.expectedRevision,
    )
    return selectors.session_entry_payload(session, resolved=True)


@router.delete(
    "/{key}", response={200: SessionDeletedOut, **error_responses(404, 409, 503)}, summary="Delete a session"
)
def session_delete(request: HttpRequest, key: str, expected: Query[DeleteGuards]):
    """``sessions.delete``, guarded like ``PATCH``; refused while a turn of the session runs."""
    key = _key(key)
    deleted = sessions.session_delete(
        key=key,
        expected_session_id=expected.expectedSessionId,
        expected_lifecycle_revision=expected.expectedLifecycleRevision,
        expected_revision=expected.expectedRevision,
        expected_updated_at_ms=expected.expectedSessionUpdatedAt,
    )
    if not deleted:
        raise NotFound(f"session not found: {key}")
    return {"ok": True, "key": key, "deleted": True}


@router.post(
    "/{key}/reset",
    response={200: SessionEntryOut, **error_responses(404, 409, 503)},
    summary="Reset a session",
    exclude_unset=True,
)
def session_reset(request: HttpRequest, key: str, payload: ResetRequest | None = None):
    """``sessions.reset``: a new transcript (a new ``sessionId``), guarded like ``PATCH``; queued turns fail,
    and a running turn refuses the reset (409, retryable). Written to the audit log."""
    payload = payload or ResetRequest()
    session = sessions.session_reset(
        key=_key(key),
        reason=payload.reason,
        expected_session_id=payload.expectedSessionId,
        expected_lifecycle_revision=payload.expectedLifecycleRevision,
        expected_revision=payload.expectedRevision,
        actor=request_actor(request),
    )
    return selectors.session_entry_payload(session)


# --- chat -----------------------------------------------------------------------------------


@router.get(
    "/{key}/history",
    response={200: ChatHistoryOut, **error_responses(404)},
    summary="Read a session's history",
    exclude_unset=True,
)
def session_history(request: HttpRequest, key: str, query: Query[HistoryPage]):
    """``chat.history``: the newest ``limit`` messages of the session's transcript, oldest first."""
    session = selectors.session_require(_key(key))
    return history.chat_history_payload(session, ChatHistoryParams(sessionKey=session.key, limit=query.limit))


@router.post(
    "/{key}/messages",
    response={200: MessageOut, **error_responses(404, 409, 503)},
    summary="Send a message",
    exclude_unset=True,
)
async def session_send(request: HttpRequest, key: str, payload: MessageIn):
    """``chat.send``, then (``wait``) ``agent.wait``: the run's outcome, or ``status: "timeout"``.

    The wait sleeps on the run-finished notification (re-reading the run on a slow timer in case
    one is lost), so a long wait costs no database polling.
    """
    submitted = await database_sync_to_async(runs.chat_send)(
        session_key=_key(key),
        message=payload.message,
        idempotency_key=payload.idempotencyKey or str(uuid.uuid4()),
    )
    if not payload.wait:
        return selectors.chat_send_payload(submitted.run, created=submitted.created)
    return await wait_for_run(submitted.run.run_id, payload.timeoutMs)


@router.post("/{key}/abort", response={200: ChatAbortOut, **error_responses(404)}, summary="Stop a session's turns")
def session_abort(request: HttpRequest, key: str, payload: AbortTarget | None = None):
    """``chat.abort``: the one run named by ``runId``, else every queued and running turn of the session."""
    run_ids = runs.run_abort(session_key=_key(key), run_id=payload.runId if payload is not None else None)
    return selectors.chat_abort_payload(run_ids)
