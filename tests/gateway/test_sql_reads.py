"""``gateway.sql_reads``: hand-written SQL read into the same instances the ORM loads, on either database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from devices_app.models import DevicePairingRequest
from gateway import sql_reads
from sessions_app.models import Session
from sessions_app.services import sessions

pytestmark = pytest.mark.django_db

FIELDS = tuple(Session._meta.concrete_fields)
TABLE = Session._meta.db_table


def _session(key: str, **changes) -> Session:
    session = sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id="main"))
    if changes:
        Session.objects.filter(pk=session.pk).update(**changes)
    return Session.objects.get(pk=session.pk)


def test_rows_become_the_instances_the_orm_loads():
    archived = timezone.now() - timedelta(days=2)
    stored = _session(
        "agent:main:full",
        archived_at=archived,
        worktree={"id": "w1", "path": "/tmp/w", "branch": "b"},
        plugin_extensions={"plugin": {"nested": [1, 2, {"x": None}]}},
        initialization_pending=True,
        input_tokens=2**40,
    )
    (read,) = sql_reads.instances(
        Session, FIELDS, f'SELECT {sql_reads.columns(FIELDS)} FROM "{TABLE}" WHERE "key" = %s', ["agent:main:full"]
    )

    for field in FIELDS:
        assert getattr(read, field.attname) == getattr(stored, field.attname), field.name
    assert read.archived_at.tzinfo is not None and read.archived_at == archived
    assert read.plugin_extensions == {"plugin": {"nested": [1, 2, {"x": None}]}}
    assert read.initialization_pending is True
    # A loaded instance, as the ORM's: saving it updates the row instead of inserting one.
    assert read._state.adding is False
    read.label = "renamed"
    read.save(update_fields=["label"])
    assert Session.objects.get(pk=stored.pk).label == "renamed"


def test_parameters_are_prepared_as_the_orm_prepares_them():
    older = _session("agent:main:older", updated_at=datetime(2026, 1, 1, 12, 0, tzinfo=UTC))
    _session("agent:main:newer", updated_at=datetime(2026, 1, 2, 12, 0, tzinfo=UTC))
    cutoff = sql_reads.prepared(Session._meta.get_field("updated_at"), datetime(2026, 1, 2, tzinfo=UTC), Session)

    found = sql_reads.instances(
        Session, FIELDS, f'SELECT {sql_reads.columns(FIELDS)} FROM "{TABLE}" WHERE "updated_at" < %s', [cutoff]
    )

    assert [s.key for s in found] == [older.key]
    assert found == list(Session.objects.filter(updated_at__lt=datetime(2026, 1, 2, tzinfo=UTC)))


def test_no_rows_is_an_empty_list():
    sql = f'SELECT {sql_reads.columns(FIELDS)} FROM "{TABLE}" WHERE "key" = %s'
    assert sql_reads.instances(Session, FIELDS, sql, ["agent:main:none"]) == []


def test_a_column_type_that_needs_the_backends_own_conversion_is_refused():
    fields = (DevicePairingRequest._meta.get_field("request_id"),)  # a UUIDField
    with pytest.raises(TypeError, match="does not convert UUIDField"):
        sql_reads.from_rows(DevicePairingRequest, fields, [("00000000000000000000000000000000",)], alias="default")
