"""``sessions.create`` as a caller asks for it (RPC and JSON API): workspace, session, first turn.

The one place that composes the workspace service (git worktrees, outside the database), the
session insert and the first turn, so that those modules do not import each other. Everything is
checked before the first write; the session and its first turn commit together or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from django.db import transaction

from gateway.exceptions import Busy

from .. import keys
from ..models import Run, RunStatus, Session
from ..schemas import SessionsCreateParams
from . import runs, workspace
from .sessions import SessionSpec, session_create


@dataclass(frozen=True)
class CreatedSession:
    session: Session
    worktree: dict | None = None
    run: Run | None = None


def _check_parent_idle(parent_key: str) -> None:
    """OpenClaw's ``/new`` (``emitCommandHooks``) waits for the parent's turns: refused while one is queued or runs."""
    if Run.objects.filter(session__key=parent_key, status__in=(RunStatus.QUEUED, RunStatus.RUNNING)).exists():
        raise Busy(f"Parent session {parent_key} is still active; try again in a moment.", retryable=True)


def session_create_requested(*, request: SessionsCreateParams) -> CreatedSession:
    """1. Validate the workspace options (OpenClaw's messages, in its order).
    2. Canonicalize the key under the agent; no key means a fresh dashboard key.
    3. Create the session, with its git worktree when asked (removed again if the insert fails).
    4. With ``message``, submit the first turn (idempotency key defaults to ``create-<sessionId>``).

    OpenClaw's ``/new`` (``emitCommandHooks`` with a parent) is refused while a turn of the parent is under way; its
    plugin hooks (session end of the parent when ``succeedsParent``, session start) have no listener here.
    """
    agent = keys.normalize_agent_id(request.agentId)
    plan = workspace.plan_session_workspace(
        cwd=request.cwd,
        worktree=bool(request.worktree),
        worktree_base_ref=request.worktreeBaseRef,
        worktree_name=request.worktreeName,
        exec_node=request.execNode,
    )
    session_key = keys.canonical_key(request.key, agent) if request.key else keys.dashboard_key(agent)
    spec = SessionSpec(
        key=session_key,
        agent_id=keys.agent_of(session_key),
        label=(request.label or "").strip(),
        display_name=(request.displayName or "").strip(),
        category=(request.category or "").strip(),
        model=(request.model or "").strip(),
        parent_session_key=keys.canonical_key(request.parentSessionKey, agent)
        if request.parentSessionKey
        else keys.main_key(agent),
        cwd=plan.cwd,
    )
    if request.message is not None:
        runs.clean_message(request.message)  # refused before anything is written
    worktree = workspace.worktree_add(plan) if plan.worktree else None
    try:
        # One transaction: a session whose first turn is refused is not kept.
        with transaction.atomic():
            if request.emitCommandHooks and request.parentSessionKey:
                _check_parent_idle(spec.parent_session_key)
            session = session_create(
                spec=replace(spec, cwd=worktree["path"], worktree=worktree) if worktree is not None else spec
            )
            run = None
            if request.message is not None:
                run_id = request.idempotencyKey or f"create-{session.session_id}"
                run = runs.run_submit(session_key=session.key, message=request.message, idempotency_key=run_id).run
    except BaseException:
        # The worktree lives outside the database: made first, removed again when the session is not created.
        if worktree is not None:
            workspace.worktree_remove(worktree)
        raise
    return CreatedSession(session=session, worktree=worktree, run=run)
