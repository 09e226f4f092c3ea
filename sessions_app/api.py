"""JSON API of sessions_app: sessions, chat turns and runs, over the same services as the RPC.

Payloads are the gateway methods' (``selectors.*_payload``), except that a missing session is a
404 here where the RPC answers ``null`` or ``deleted: false``. Session keys go in the path as they
are (``agent:main:main``; a bare key is placed under the default agent). The ``runs/`` routes are
registered before the ``{key}`` ones, so a session whose bare key is ``runs`` needs its full key.
"""

from __future__ import annotations

import uuid

from channels.db import database_sync_to_async
from django.http import HttpRequest
from ninja import Query, Router, Status

from openclaw_site.gateway.exceptions import NotFound
from openclaw_site.gateway.schemas import ErrorOut

from . import keys, selectors
from .schemas import (
    AbortTarget,
    ExpectedRevision,
    ForkEntry,
    HistoryPage,
    MessageIn,
    RunOut,
    SessionChanges,
    SessionsAdoptParams,
    SessionsCreateParams,
    SessionsListParams,
)
from .services import creation, forks, runs, sessions
from .waiters import wait_for_run

router = Router(tags=["sessions"])

ERRORS = {400: ErrorOut, 404: ErrorOut, 409: ErrorOut, 503: ErrorOut}


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
@router.get("", response={200: dict, **ERRORS}, include_in_schema=False)  # /api/sessions, without the slash
def session_list(request: HttpRequest, filters: Query[SessionsListParams]):
    return selectors.sessions_list_payload(filters)


@router.post("/", response={201: dict, **ERRORS})
@router.post("", response={201: dict, **ERRORS}, include_in_schema=False)  # /api/sessions, without the slash
def session_create(request: HttpRequest, payload: SessionsCreateParams):
    """sessions.create: the body is its params."""
    created = creation.session_create_requested(request=payload)
    return Status(201, selectors.session_created_payload(created.session, worktree=created.worktree, run=created.run))


@router.post("/adopt", response={201: dict, **ERRORS})
def session_adopt(request: HttpRequest, payload: SessionsAdoptParams):
    """A new locked session continuing an existing native thread of an agent harness."""
    session = forks.session_adopt_requested(request=payload)
    return Status(201, selectors.session_adopted_payload(session))


@router.post("/{key}/fork", response={201: dict, **ERRORS})
def session_fork(request: HttpRequest, key: str, payload: ForkEntry):
    """A new session from the history before one of the source's user messages."""
    return Status(201, forks.session_fork(session_key=_key(key), entry_id=payload.entryId))


@router.get("/{key}", response={200: dict, **ERRORS})
def session_describe(request: HttpRequest, key: str):
    return {"session": selectors.session_row(selectors.session_require(_key(key)))}


@router.patch("/{key}", response={200: dict, **ERRORS})
def session_patch(request: HttpRequest, key: str, payload: SessionChanges):
    session = sessions.session_patch(
        key=_key(key),
        changes=payload.changes(),
        expected_session_id=payload.expectedSessionId,
        expected_lifecycle_revision=payload.expectedLifecycleRevision,
    )
    return selectors.session_entry_payload(session, resolved=True)


@router.delete("/{key}", response={200: dict, **ERRORS})
def session_delete(request: HttpRequest, key: str, expected: Query[ExpectedRevision]):
    key = _key(key)
    deleted = sessions.session_delete(
        key=key,
        expected_session_id=expected.expectedSessionId,
        expected_lifecycle_revision=expected.expectedLifecycleRevision,
    )
    if not deleted:
        raise NotFound(f"session not found: {key}")
    return {"ok": True, "key": key, "deleted": True}


# --- chat -----------------------------------------------------------------------------------


@router.get("/{key}/history", response={200: dict, **ERRORS})
def session_history(request: HttpRequest, key: str, query: Query[HistoryPage]):
    return selectors.chat_history(selectors.session_require(_key(key)), limit=query.limit)


@router.post("/{key}/messages", response={200: dict, **ERRORS})
async def session_send(request: HttpRequest, key: str, payload: MessageIn):
    """chat.send, then (``wait``) agent.wait: the run's outcome, or ``status: "timeout"``.

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


@router.post("/{key}/abort", response={200: dict, **ERRORS})
def session_abort(request: HttpRequest, key: str, payload: AbortTarget | None = None):
    run_ids = runs.run_abort(session_key=_key(key), run_id=payload.runId if payload is not None else None)
    return selectors.chat_abort_payload(run_ids)
