"""Session initialization that spans several stores, and its guarded rollback (reference §3.1-3.3).

1. A pending row (``initialization_pending``) is inserted and snapshotted; a handle is minted for
   the target (key, sessionId, lifecycleRevision).
2. The initializer (``after_create``) writes elsewhere (harness store, upstream links, transcript)
   checking ``handle.assert_current()``; it returns a final patch (only ``pluginExtensions``).
3. Readiness commits only if the row still equals the snapshot. Committed readiness seals the
   initialization: a failure to *publish* it is logged and never undoes it.
4. On failure after the initializer ran (and before readiness committed), the row is removed by a
   guarded rollback inside the handle's rollback context, through the owning harness's deletion
   participant, which undoes exactly what this initialization still owns. If ownership cannot be
   proven the row stays pending and the caller gets
   ``Session initialization failed and guarded rollback did not complete for <key>.``
"""

from __future__ import annotations

import contextvars
import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from gateway.audit import audit
from gateway.exceptions import Busy, Conflict, InvalidRequest

from .. import events, stages
from ..harnesses import DeletionTarget, registry
from ..models import Run, RunStatus, Session, SessionWindow, WindowReason
from .rows import session_delete_row, session_write

logger = logging.getLogger(__name__)

_rollback_owner: contextvars.ContextVar[InitializationHandle | None] = contextvars.ContextVar(
    "initialization_rollback_owner", default=None
)
_initialization_source: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "initialization_source", default=None
)


class InitializationError(InvalidRequest):
    """An initialization or rollback precondition failed (the message says which)."""


class RollbackIncomplete(InvalidRequest):
    """The row stays ``initializationPending`` for an operator (admin "clear stuck initialization").

    Both failures go to the log under ``details.errorId``; the client gets the reference, not their text.
    """

    def __init__(self, key: str, original: BaseException, rollback_error: BaseException):
        error_id = uuid.uuid4().hex[:16]
        logger.error(
            "initialization of %s failed (%r) and its guarded rollback did not complete (errorId=%s)",
            key,
            original,
            error_id,
            exc_info=rollback_error,
        )
        super().__init__(
            f"Session initialization failed and guarded rollback did not complete for {key}.",
            details={"code": "INITIALIZATION_ROLLBACK_INCOMPLETE", "errorId": error_id},
        )
        self.original = original
        self.rollback_error = rollback_error


def row_snapshot(session_key: str) -> dict[str, Any] | None:
    """Every stored column of the row (a deep-equality token for "nobody touched it")."""
    row = Session.objects.filter(key=session_key).values().first()
    return dict(row) if row is not None else None


@dataclass(frozen=True)
class InitializationTarget:
    agent_id: str
    session_key: str
    session_id: str
    lifecycle_revision: str


class InitializationHandle:
    """Proof that the caller is still the owner of one pending initialization."""

    def __init__(
        self,
        target: InitializationTarget,
        snapshot: dict[str, Any],
        *,
        harness_id: str,
        harness_generation: int | None,
        source_guard: Callable[[], None] | None,
    ):
        self.target = target
        self._snapshot = snapshot
        self._harness_id = harness_id
        self._harness_generation = harness_generation
        self._source_guard = source_guard
        self._closed = False
        self._deleted = False

    # -- the two checks -----------------------------------------------------------------

    def assert_current(self) -> None:
        if self._closed:
            raise InitializationError("Session initialization is closed")
        self._assert_owner()
        if self._deleted or _rollback_owner.get() is self:
            raise InitializationError("Session initialization is rolling back")
        if self._source_guard is not None:
            self._source_guard()

    def assert_rollback_current(self) -> None:
        if self._closed:
            raise InitializationError("Session initialization is closed")
        self._assert_owner()
        if _rollback_owner.get() is not self:
            raise InitializationError("Session initialization rollback is not active")

    def _assert_owner(self) -> None:
        if registry.generation(self._harness_id) != self._harness_generation:
            raise InitializationError("Session initialization registry owner changed")
        current = row_snapshot(self.target.session_key)
        owned = current is None if self._deleted else current == self._snapshot
        if not owned:
            raise InitializationError(f"Session initialization owner changed: {self.target.session_key}")

    # -- host-private ---------------------------------------------------------------------

    @property
    def snapshot(self) -> dict[str, Any]:
        return self._snapshot

    @contextmanager
    def rolling_back(self) -> Iterator[None]:
        token = _rollback_owner.set(self)
        try:
            yield
        finally:
            _rollback_owner.reset(token)

    def deletion_committed(self) -> None:
        self._deleted = True

    def close(self) -> None:
        self._closed = True


def active_rollback() -> InitializationHandle | None:
    return _rollback_owner.get()


@contextmanager
def initialization_source(guard: Callable[[], None]) -> Iterator[None]:
    """Creations inside this block also require ``guard`` (e.g. the fork source is unchanged)."""
    token = _initialization_source.set(guard)
    try:
        yield
    finally:
        _initialization_source.reset(token)


@dataclass(frozen=True)
class CreatedEntry:
    key: str
    agent_id: str
    session_id: str
    session: Session


@dataclass(frozen=True)
class InitializerContext:
    key: str
    agent_id: str
    session_id: str
    entry: dict[str, Any]
    initialization: InitializationHandle


def create_session_entry(
    *,
    key: str,
    agent_id: str,
    agent_harness_id: str,
    after_create: Callable[[InitializerContext], dict[str, Any]],
    label: str = "",
    display_name: str = "",
    model_selection_locked: bool = True,
    fork_source: dict[str, str] | None = None,
    parent_session_key: str = "",
) -> CreatedEntry:
    """Create a harness-owned session through a pending row, an initializer and a readiness commit."""
    harness_generation = registry.generation(agent_harness_id)
    source_guard = _initialization_source.get()
    with transaction.atomic():
        if Session.objects.filter(key=key).exists():
            busy = Run.objects.filter(session__key=key, status__in=[RunStatus.QUEUED, RunStatus.RUNNING]).exists()
            if busy:
                raise Busy(f'Session "{key}" is still active; retry creation later.', retryable=True)
            raise Conflict(f"session already exists: {key}", details={"code": "SESSION_EXISTS"})
        session = Session.objects.create(
            key=key,
            agent_id=agent_id,
            label=label,
            display_name=display_name,
            created_via="plugin",
            initialization_pending=True,
            agent_harness_id=agent_harness_id,
            model_selection_locked=model_selection_locked,
            parent_session_key=parent_session_key,
            fork_source_session_key=(fork_source or {}).get("sessionKey", ""),
            fork_source_session_id=(fork_source or {}).get("sessionId", ""),
            fork_source_entry_id=(fork_source or {}).get("entryId", ""),
        )
        SessionWindow.objects.create(id=session.session_id, session=session, reason=WindowReason.FORK)
    snapshot = row_snapshot(key)
    handle = InitializationHandle(
        InitializationTarget(agent_id, key, session.session_id, session.lifecycle_revision),
        snapshot,
        harness_id=agent_harness_id,
        harness_generation=harness_generation,
        source_guard=source_guard,
    )
    callback_ran = False
    try:
        callback_ran = True
        stages.reach("initialization.after_create", key=key, agent_id=agent_id, handle=handle)
        patch = after_create(
            InitializerContext(
                key=key, agent_id=agent_id, session_id=session.session_id, entry=snapshot, initialization=handle
            )
        )
        handle.assert_current()
        if not isinstance(patch, dict) or set(patch) - {"pluginExtensions"}:
            raise InitializationError("session creation final patch may only contain pluginExtensions")
        ready = _commit_readiness(handle, patch)
    except BaseException as error:
        try:
            rollback_error = _roll_back_if_owned(handle, callback_ran)
        finally:
            handle.close()
        if rollback_error is not None:
            raise RollbackIncomplete(key, error, rollback_error) from error
        raise
    handle.close()  # readiness committed: creation authority is sealed
    try:
        stages.reach("initialization.readiness.published", key=key, session=ready)
        events.publish_session_changed_on_commit(ready, reason="create")
    except Exception:
        logger.exception("publishing the readiness of %s failed (the session stays ready)", key)
    return CreatedEntry(key=key, agent_id=agent_id, session_id=ready.session_id, session=ready)


def _commit_readiness(handle: InitializationHandle, patch: dict[str, Any]) -> Session:
    key = handle.target.session_key
    with transaction.atomic():
        row = Session.objects.select_for_update(no_key=True).filter(key=key).first()
        # Locked: readiness may only commit against the exact row this initialization created.
        if row is None:
            raise InitializationError(f"created session {key} disappeared before finalization")
        if row_snapshot(key) != handle.snapshot:
            raise InitializationError(f"created session {key} changed before finalization")
        handle.assert_current()
        row.initialization_pending = False
        if "pluginExtensions" in patch:
            row.plugin_extensions = patch["pluginExtensions"]
        session_write(row, "initialization_pending", "plugin_extensions")
    return row


def _roll_back_if_owned(handle: InitializationHandle, callback_ran: bool) -> Exception | None:
    """Undo a failed initialization; returns the reason when the guarded rollback did not complete."""
    key = handle.target.session_key
    if not callback_ran:
        return None
    current = row_snapshot(key)
    if (
        current is not None
        and not current["initialization_pending"]
        and current["session_id"] == handle.target.session_id
        and current["lifecycle_revision"] == handle.target.lifecycle_revision
    ):
        return None  # readiness committed: nothing to roll back
    try:
        with handle.rolling_back():
            deleted = delete_session_guarded(
                key=key, expected=handle.snapshot, initialization=handle, harness_required=True, purpose="rollback"
            )
        if not deleted:
            raise InitializationError(f"created session {key} changed before rollback")
    except Exception as rollback_error:
        logger.warning("guarded rollback of %s did not complete: %s", key, rollback_error)
        return rollback_error
    return None


def delete_session_guarded(
    *,
    key: str,
    expected: dict[str, Any] | None,
    initialization: InitializationHandle | None = None,
    harness_required: bool = False,
    purpose: str = "delete",
) -> bool:
    """Delete a session together with its harness's state; False when the row is not ``expected``.

    1. The owning harness prepares (it may refuse: supervision-owned binding, a changed owner).
    2. In one transaction of the gateway database: lock, compare, delete the row (windows,
       transcript and runs cascade).
    3. After COMMIT: the initialization (if any) is marked deleted, then the harness removes its
       binding and runs its cleanup (upstream link, fresh native thread).
    """
    session = Session.objects.filter(key=key).first()
    if session is None:
        return False
    if session.model_selection_locked and not session.agent_harness_id:
        raise InitializationError("Model-selection-locked sessions cannot be removed, unlocked, or reassigned.")
    participation = None
    if session.agent_harness_id:
        harness = registry.get(session.agent_harness_id)
        if harness is None:
            if harness_required or session.model_selection_locked:
                raise InitializationError("Model-selection-locked sessions cannot be removed, unlocked, or reassigned.")
        else:
            participation = harness.prepare_deletion(
                DeletionTarget(
                    agent_id=session.agent_id,
                    session_key=session.key,
                    session_id=session.session_id,
                    lifecycle_revision=session.lifecycle_revision,
                    agent_harness_id=session.agent_harness_id,
                    initialization=initialization if initialization is active_rollback() else None,
                    purpose=purpose,
                )
            )
    try:
        with transaction.atomic():
            row = Session.objects.select_for_update(no_key=True).filter(key=key).first()
            # Locked: compare-then-delete against a concurrent writer of the same row.
            if row is None or (expected is not None and row_snapshot(key) != expected):
                deleted = False
            elif Run.objects.filter(session=row, status=RunStatus.RUNNING).exists():
                raise Busy(
                    f"Cannot mutate session while competing work is in flight for {key}; retry after the run completes",
                    retryable=True,
                )
            else:
                stages.reach("deletion.before_delete", key=key)
                session_delete_row(row)
                events.publish_session_changed_on_commit(row, reason="delete", deleted=True)
                deleted = True
    except BaseException:
        if participation is not None:
            participation.abandon()
        raise
    if not deleted:
        if participation is not None:
            participation.abandon()
        return False
    if initialization is not None:
        initialization.deletion_committed()
    if participation is not None:
        participation.after_commit()
    return True


def rollback_harness_session(*, key: str, expected: dict[str, Any]) -> bool:
    """Owner-specific removal of a harness-owned session (``rollbackAgentHarnessSessionEntryLifecycle``).

    Outside the owning initialization's rollback a supervision-owned binding refuses it.
    """
    return delete_session_guarded(
        key=key, expected=expected, initialization=active_rollback(), harness_required=True, purpose="rollback"
    )


def clear_stuck_initialization(*, key: str, actor=None) -> bool:
    """Remove a session left ``initialization_pending`` (say, by a process killed mid-fork).

    A recovery handle takes over the pending row exactly as it is now and runs the same guarded
    rollback; the harness undoes what its durable ownership record says this initialization
    wrote. Raises when ownership cannot be proven; the row then stays for inspection.
    """
    current = row_snapshot(key)
    if current is None:
        return False
    if not current["initialization_pending"]:
        raise InitializationError(f"Session {key} is not initializing")
    handle = InitializationHandle(
        InitializationTarget(current["agent_id"], key, current["session_id"], current["lifecycle_revision"]),
        current,
        harness_id=current["agent_harness_id"],
        harness_generation=registry.generation(current["agent_harness_id"]),
        source_guard=None,
    )
    try:
        with handle.rolling_back():
            deleted = delete_session_guarded(
                key=key, expected=current, initialization=handle, harness_required=True, purpose="rollback"
            )
        if not deleted:
            raise InitializationError(f"created session {key} changed before rollback")
    finally:
        handle.close()
    if actor is not None:
        audit(actor, "session.initialization.clear", "session", key, {"sessionId": current["session_id"]})
    return True
