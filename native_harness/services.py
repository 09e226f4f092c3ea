"""Writes and reads of the native harness store: threads, bindings, initialization ownership.

Every write runs in a transaction of the ``harness`` database; guarded writes call their guard
(an initialization's ``assert_current``) before the write and again just before COMMIT.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from gateway.exceptions import InvalidRequest
from openclaw_site.db_routers import HARNESS_DB

from .models import (
    BindingState,
    InitializationOwnership,
    NativeBinding,
    NativeConnection,
    NativeThread,
    NativeTurn,
    new_thread_id,
)

Guard = Callable[[], None] | None


def _atomic():
    return transaction.atomic(using=HARNESS_DB)


# --- connection -----------------------------------------------------------------------------


def current_fingerprint() -> str:
    live = NativeConnection.objects.filter(retired_at__isnull=True).order_by("-created_at").first()
    if live is not None:
        return live.fingerprint
    with _atomic():
        return NativeConnection.objects.create(fingerprint=f"conn-{uuid.uuid4()}").fingerprint


def retire_connection() -> None:
    with _atomic():
        NativeConnection.objects.filter(retired_at__isnull=True).update(retired_at=timezone.now())


# --- threads --------------------------------------------------------------------------------


def thread_create(turns: Sequence[tuple[str, str]]) -> NativeThread:
    with _atomic():
        thread = NativeThread.objects.create()
        NativeTurn.objects.bulk_create(
            NativeTurn(thread=thread, seq=index, turn_id=f"turn-{uuid.uuid4()}", role=role, text=text)
            for index, (role, text) in enumerate(turns, start=1)
        )
    return thread


def thread_history(thread_id: str) -> list[NativeTurn]:
    return list(NativeTurn.objects.filter(thread_id=thread_id).order_by("seq"))


def thread_fork(source_thread_id: str, before_turn_id: str, *, guard: Guard = None) -> NativeThread:
    """A fresh thread holding the source's turns before ``before_turn_id`` (never the source's id)."""
    with _atomic():
        if guard is not None:
            guard()
        source = NativeThread.objects.filter(thread_id=source_thread_id, archived_at__isnull=True).first()
        if source is None:
            raise InvalidRequest(f"native thread not found: {source_thread_id}")
        boundary = NativeTurn.objects.filter(thread=source, turn_id=before_turn_id).first()
        if boundary is None:
            raise InvalidRequest("This native runtime cannot fork at that message; the turn is not in the thread.")
        fork = NativeThread.objects.create(
            thread_id=new_thread_id(), source_thread_id=source.thread_id, forked_before_turn_id=before_turn_id
        )
        NativeTurn.objects.bulk_create(
            NativeTurn(thread=fork, seq=turn.seq, turn_id=turn.turn_id, role=turn.role, text=turn.text)
            for turn in NativeTurn.objects.filter(thread=source, seq__lt=boundary.seq).order_by("seq")
        )
        if guard is not None:
            guard()
    return fork


def thread_archive(thread_id: str, *, guard: Guard = None, released_session_id: str | None = None) -> None:
    """Archive a thread nobody else is bound to. ``released_session_id``: the binding being removed."""
    with _atomic():
        if guard is not None:
            guard()
        owners = NativeBinding.objects.filter(state=BindingState.ACTIVE, binding__threadId=thread_id)
        if released_session_id is not None:
            owners = owners.exclude(session_id=released_session_id)
        if owners.exists():
            raise InvalidRequest("Native fork cleanup refused: the native thread has another owner")
        NativeThread.objects.filter(thread_id=thread_id, archived_at__isnull=True).update(archived_at=timezone.now())
        if guard is not None:
            guard()


# --- bindings -------------------------------------------------------------------------------


def binding_read(agent_id: str, session_id: str) -> dict[str, Any] | None:
    row = NativeBinding.objects.filter(agent_id=agent_id, session_id=session_id, state=BindingState.ACTIVE).first()
    return dict(row.binding) if row is not None else None


def binding_set_if_absent(
    *, agent_id: str, session_id: str, session_key: str, binding: dict[str, Any], guard: Guard = None
) -> bool:
    try:
        with _atomic():
            if guard is not None:
                guard()
            if NativeBinding.objects.filter(agent_id=agent_id, session_id=session_id).exists():
                return False
            NativeBinding.objects.create(
                agent_id=agent_id, session_id=session_id, session_key=session_key, binding=binding
            )
            if guard is not None:
                guard()
    except IntegrityError:
        if NativeBinding.objects.filter(agent_id=agent_id, session_id=session_id).exists():
            return False  # a concurrent writer set it first
        raise  # the store refused the write: that is a failure, not a lost race
    return True


def binding_patch(*, agent_id: str, session_id: str, thread_id: str, patch: dict[str, Any]) -> bool:
    """Patch the active binding of a session, only while it still points at ``thread_id``."""
    with _atomic():
        row = (
            NativeBinding.objects.select_for_update()
            .filter(agent_id=agent_id, session_id=session_id, state=BindingState.ACTIVE)
            .first()
        )
        # Locked: the thread comparison and the write must see the same version.
        if row is None or row.binding.get("threadId") != thread_id:
            return False
        row.binding = {**row.binding, **patch}
        row.version += 1
        row.save(update_fields=["binding", "version", "updated_at"])
    return True


def binding_delete(*, agent_id: str, session_id: str) -> bool:
    with _atomic():
        deleted, _ = NativeBinding.objects.filter(agent_id=agent_id, session_id=session_id).delete()
    return bool(deleted)


# --- initialization ownership ---------------------------------------------------------------


def _target_filter(target) -> dict[str, str]:
    return {
        "session_key": target.session_key,
        "session_id": target.session_id,
        "lifecycle_revision": target.lifecycle_revision,
    }


def ownership_prepare(target, *, fresh_thread_id: str = "") -> InitializationOwnership:
    with _atomic():
        return InitializationOwnership.objects.create(
            agent_id=target.agent_id, fresh_thread_id=fresh_thread_id, **_target_filter(target)
        )


def ownership_get(target) -> InitializationOwnership | None:
    return InitializationOwnership.objects.filter(**_target_filter(target)).first()


def ownership_record(target, *, binding: dict | None = None, link: dict | None = None) -> None:
    changes: dict[str, Any] = {}
    if binding is not None:
        changes["written_binding"] = binding
    if link is not None:
        changes["written_link"] = link
    with _atomic():
        InitializationOwnership.objects.filter(**_target_filter(target)).update(**changes)


def ownership_release(target) -> None:
    with _atomic():
        InitializationOwnership.objects.filter(**_target_filter(target)).delete()


def thread_is_open(thread_id: str) -> bool:
    return NativeThread.objects.filter(thread_id=thread_id, archived_at__isnull=True).exists()
