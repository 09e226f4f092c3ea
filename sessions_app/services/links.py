"""Upstream links: which external-runtime thread a session continues (reference §1.5).

Writes take an ``assert_commit_allowed`` guard (an initialization's ``assert_current``), checked
before the write and again just before COMMIT; an upsert may also carry the fork source's link,
re-read and compared at both points.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction

from gateway.exceptions import Conflict

from .. import stages
from ..models import SessionUpstreamLink

IDENTITY_FIELDS = ("catalogId", "hostId", "threadId", "upstreamKind", "upstreamRef")


class UpstreamSourceChanged(Conflict):
    def __init__(self) -> None:
        super().__init__("Session upstream source changed during initialization")


def link_shape(link: SessionUpstreamLink) -> dict[str, Any]:
    return {
        "sessionKey": link.session_key,
        "agentId": link.agent_id,
        "catalogId": link.catalog_id,
        "hostId": link.host_id,
        "threadId": link.thread_id,
        "upstreamKind": link.upstream_kind,
        "upstreamRef": link.upstream_ref,
        "marker": link.marker,
    }


def link_read(session_key: str, agent_id: str) -> dict[str, Any] | None:
    link = SessionUpstreamLink.objects.filter(session_key=session_key, agent_id=agent_id).first()
    return link_shape(link) if link is not None else None


def _source_matches(source: dict[str, Any]) -> bool:
    current = link_read(source["sessionKey"], source["agentId"])
    return current is not None and all(current[field] == source[field] for field in IDENTITY_FIELDS)


def _admit(assert_commit_allowed: Callable[[], None] | None, source: dict[str, Any] | None) -> None:
    if source is not None and not _source_matches(source):
        raise UpstreamSourceChanged()
    if assert_commit_allowed is not None:
        assert_commit_allowed()


def link_upsert(
    link: dict[str, Any],
    *,
    if_absent: bool = False,
    assert_commit_allowed: Callable[[], None] | None = None,
    source: dict[str, Any] | None = None,
) -> bool:
    """Write a link; with ``if_absent`` an existing row wins (returns False). True iff one row changed.

    Without ``if_absent`` a conflict updates the identity fields, and the marker is reset only
    when the source identity changed.
    """
    fields = {
        "catalog_id": link["catalogId"],
        "host_id": link["hostId"],
        "thread_id": link["threadId"],
        "upstream_kind": link["upstreamKind"],
        "upstream_ref": link.get("upstreamRef") or {},
        "marker": link.get("marker"),
    }
    try:
        with transaction.atomic():
            _admit(assert_commit_allowed, source)
            existing = (
                SessionUpstreamLink.objects.select_for_update(no_key=True)
                .filter(session_key=link["sessionKey"], agent_id=link["agentId"])
                .first()
            )
            # Locked: the identity comparison and the write must see the same row.
            if existing is not None:
                if if_absent:
                    return False
                identity_changed = any(
                    getattr(existing, name) != value for name, value in fields.items() if name != "marker"
                )
                if not identity_changed:
                    fields.pop("marker")
                SessionUpstreamLink.objects.filter(pk=existing.pk).update(**fields)
            else:
                SessionUpstreamLink.objects.create(session_key=link["sessionKey"], agent_id=link["agentId"], **fields)
            # Checked again at the last moment before COMMIT: a guard that turned false meanwhile
            # (initialization closed, source replaced) undoes the write.
            stages.reach("link.write.before_commit", link=link)
            _admit(assert_commit_allowed, source)
    except IntegrityError:
        if if_absent:
            return False
        raise
    return True


def link_delete(
    session_key: str,
    agent_id: str,
    *,
    expected: dict[str, Any] | None = None,
    assert_commit_allowed: Callable[[], None] | None = None,
) -> str:
    """``deleted`` | ``absent`` | ``changed`` (with ``expected``: the stored link differs from it)."""
    with transaction.atomic():
        if assert_commit_allowed is not None:
            assert_commit_allowed()
        link = (
            SessionUpstreamLink.objects.select_for_update(no_key=True)
            .filter(session_key=session_key, agent_id=agent_id)
            .first()
        )
        # Locked: compare-then-delete must not race a successor's write.
        if link is None:
            return "absent"
        if expected is not None and link_shape(link) != expected:
            return "changed"
        link.delete()
        if assert_commit_allowed is not None:
            assert_commit_allowed()
    return "deleted"
