"""Compiled-once ORM queries: the same rows as the ORM, with each call's values, on either database."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.db.models.signals import post_init
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from devices_app.models import DeviceToken, PairedDevice
from gateway.models import GatewayProcess
from gateway.prepared import MAX_ID_LIST, IdList, PreparedQuery, _named_style
from sessions_app.models import Session
from tests.support.processes import current_database_url

pytestmark = pytest.mark.django_db


def _session(key: str, *, label: str = "", minutes_ago: int = 0) -> Session:
    session = Session.objects.create(key=key, agent_id="main", label=label)
    Session.objects.filter(pk=session.pk).update(updated_at=timezone.now() - timedelta(minutes=minutes_ago))
    return Session.objects.get(pk=session.pk)


def test_each_call_binds_its_own_values_to_the_one_compiled_query():
    by_key = PreparedQuery(lambda key: Session.objects.filter(key=key), key=str)
    first, second = _session("agent:main:a"), _session("agent:main:b")
    assert [s.pk for s in by_key.fetch(key=first.key)] == [first.pk]
    assert [s.pk for s in by_key.fetch(key=second.key)] == [second.pk]
    assert by_key.fetch(key="agent:main:none") == []


def test_instances_match_the_orm_field_for_field():
    _session("agent:main:a", label="one")
    by_key = PreparedQuery(lambda key: Session.objects.filter(key=key), key=str)
    [prepared] = by_key.fetch(key="agent:main:a")
    orm = Session.objects.get(key="agent:main:a")
    for field in Session._meta.concrete_fields:
        assert getattr(prepared, field.attname) == getattr(orm, field.attname), field.name
    assert prepared._state.adding is False
    assert prepared._state.db == orm._state.db


def test_limit_and_offset_page_in_query_order():
    for n in range(5):
        _session(f"agent:main:s{n}", label="page", minutes_ago=n)
    page = PreparedQuery(
        lambda label: Session.objects.filter(label=label).order_by("-updated_at", "-id"), limit=True, label=str
    )
    keys = [s.key for s in page.fetch(label="page", limit=2, offset=1)]
    assert keys == ["agent:main:s1", "agent:main:s2"]
    assert [s.key for s in page.fetch(label="page", limit=10, offset=4)] == ["agent:main:s4"]


def test_limit_must_be_given_exactly_when_prepared_with_it():
    plain = PreparedQuery(lambda key: Session.objects.filter(key=key), key=str)
    paged = PreparedQuery(lambda key: Session.objects.filter(key=key), limit=True, key=str)
    with pytest.raises(TypeError):
        plain.fetch(key="k", limit=1)
    with pytest.raises(TypeError):
        paged.fetch(key="k")


def test_id_lists_of_any_length_including_empty_and_beyond_the_compiled_bound():
    sessions = [_session(f"agent:main:i{n}") for n in range(3)]
    in_ids = PreparedQuery(lambda ids: Session.objects.filter(pk__in=ids).order_by("pk"), ids=IdList)
    assert [s.pk for s in in_ids.fetch(ids=[sessions[2].pk])] == [sessions[2].pk]
    assert [s.pk for s in in_ids.fetch(ids=[s.pk for s in sessions])] == [s.pk for s in sessions]
    with CaptureQueriesContext(connection) as queries:
        assert in_ids.fetch(ids=[]) == []
    assert len(queries) == 0
    many = [sessions[0].pk, *range(10**9, 10**9 + MAX_ID_LIST)]
    assert [s.pk for s in in_ids.fetch(ids=many)] == [sessions[0].pk]


def test_datetime_parameters_compare_as_the_orm_does():
    now = timezone.now()
    old, fresh = uuid.uuid4(), uuid.uuid4()
    for boot_id, at in ((old, now - timedelta(minutes=5)), (fresh, now)):
        GatewayProcess.objects.create(boot_id=boot_id, hostname="h", pid=1, started_at=at, heartbeat_at=at)
    since = PreparedQuery(lambda cutoff: GatewayProcess.objects.filter(heartbeat_at__gte=cutoff), cutoff=type(now))
    assert {p.boot_id for p in since.fetch(cutoff=now - timedelta(minutes=1))} == {fresh}
    assert {p.boot_id for p in since.fetch(cutoff=now - timedelta(minutes=10))} == {old, fresh}


def test_values_list_rows_come_back_converted():
    device = PairedDevice.objects.create(device_id="d" * 64, public_key="k", approved_at=timezone.now())
    DeviceToken.objects.create(device=device, role="operator", token_hash="h" * 64, scopes=["operator.read"])
    rows = PreparedQuery(
        lambda device_id: DeviceToken.objects.filter(device_id=device_id).values_list("role", "scopes"),
        device_id=str,
    ).fetch(device_id=device.device_id)
    assert [tuple(row) for row in rows] == [("operator", ["operator.read"])]


def test_a_parameter_the_orm_rewrites_is_refused_when_compiled():
    contains = PreparedQuery(lambda text: Session.objects.filter(label__icontains=text), text=str)
    with pytest.raises(TypeError, match="not a plain value"):
        contains.fetch(text="x")


def test_an_unknown_parameter_kind_is_refused():
    with pytest.raises(TypeError):
        PreparedQuery(lambda ratio: Session.objects.filter(input_tokens=ratio), ratio=float)


def test_one_query_per_call_and_no_rows_kept_between_calls():
    by_key = PreparedQuery(lambda key: Session.objects.filter(key=key), key=str)
    session = _session("agent:main:c", label="before")
    by_key.fetch(key=session.key)
    Session.objects.filter(pk=session.pk).update(label="after")
    with CaptureQueriesContext(connection) as queries:
        [fresh] = by_key.fetch(key=session.key)
    assert len(queries) == 1
    assert fresh.label == "after"


def test_select_related_objects_come_from_the_same_query():
    device = PairedDevice.objects.create(
        device_id="e" * 64, public_key="k", display_name="laptop", approved_at=timezone.now()
    )
    DeviceToken.objects.create(device=device, role="operator", token_hash="i" * 64, scopes=[])
    with_device = PreparedQuery(lambda role: DeviceToken.objects.filter(role=role).select_related("device"), role=str)
    with CaptureQueriesContext(connection) as queries:
        [token] = with_device.fetch(role="operator")
        assert token.device.display_name == "laptop"
        assert token.device.approved_at == PairedDevice.objects.get(pk=device.pk).approved_at
    assert len(queries) == 2  # the prepared query, and the comparison's own


def test_a_literal_percent_sign_in_the_sql_comes_back_as_the_orm_gives_it():
    _session("agent:main:p", label="50% off")
    with_percent = PreparedQuery(
        lambda key: (
            Session.objects.filter(key=key).extra(select={"shown": "'100%%'"}).values_list("key", "label", "shown")
        ),
        limit=True,
        key=str,
    )
    orm = list(
        Session.objects.filter(key="agent:main:p")
        .extra(select={"shown": "'100%%'"})
        .values_list("key", "label", "shown")
    )
    assert (
        [tuple(row) for row in with_percent.fetch(key="agent:main:p", limit=5)]
        == orm
        == [("agent:main:p", "50% off", "100%")]
    )


def test_sqlite_gets_named_parameters_and_sql_it_cannot_name_stays_as_compiled():
    by_key = PreparedQuery(lambda key: Session.objects.filter(key=key), limit=True, key=str)
    executed = []

    def capture(execute, sql, params, many, context):
        executed.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        by_key.fetch(key="agent:main:none", limit=1)
    [(sql, params)] = executed
    if connection.vendor == "sqlite":
        assert params == {"p0": "agent:main:none", "p1": 1, "p2": 0}
        assert sql.endswith("LIMIT %(p1)s OFFSET %(p2)s")
    else:
        assert params == ["agent:main:none", 1, 0]

    assert _named_style("SELECT 5 %% 2 WHERE a = %s", 1) == ("SELECT 5 %% 2 WHERE a = %(p0)s", ("p0",))
    # A percent sign of neither form, or a count of placeholders other than the parameters': left alone.
    assert _named_style("SELECT '%d' WHERE a = %s", 1) == ("SELECT '%d' WHERE a = %s", None)
    assert _named_style("SELECT 1 WHERE a = %s", 2) == ("SELECT 1 WHERE a = %s", None)


def test_instances_behave_as_the_orm_s_when_changed_and_saved():
    session = _session("agent:main:s", label="before")
    [prepared] = PreparedQuery(lambda key: Session.objects.filter(key=key), key=str).fetch(key=session.key)
    assert prepared == Session.objects.get(pk=session.pk) and prepared.pk == session.pk
    assert prepared.get_deferred_fields() == set()
    prepared.label = "after"
    prepared.save(update_fields=["label"])
    assert Session.objects.get(pk=session.pk).label == "after"


def test_init_signal_receivers_see_every_instance_a_prepared_query_builds():
    session = _session("agent:main:r")
    by_key = PreparedQuery(lambda key: Session.objects.filter(key=key), key=str)
    by_key.fetch(key=session.key)  # compiled (and its instances built) before a receiver exists
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance)

    post_init.connect(receiver, sender=Session)
    try:
        [fetched] = by_key.fetch(key=session.key)
    finally:
        post_init.disconnect(receiver, sender=Session)
    assert seen == [fetched] and seen[0] is fetched


def test_deferred_columns_are_left_out_and_load_on_access_as_with_the_orm():
    session = _session("agent:main:d", label="shown")
    Session.objects.filter(pk=session.pk).update(plugin_extensions={"a": 1})
    [prepared] = PreparedQuery(
        lambda key: Session.objects.filter(key=key).defer("plugin_extensions", "label"), key=str
    ).fetch(key=session.key)
    orm = Session.objects.defer("plugin_extensions", "label").get(pk=session.pk)
    assert prepared.get_deferred_fields() == orm.get_deferred_fields() == {"plugin_extensions", "label"}
    assert prepared.key == orm.key and prepared.updated_at == orm.updated_at
    with CaptureQueriesContext(connection) as queries:
        assert prepared.plugin_extensions == {"a": 1}
    assert len(queries) == 1


def test_postgresql_prepares_a_fixed_query_on_the_server_and_binds_id_lists_on_the_client():
    if connection.vendor != "postgresql":
        pytest.skip("server-side prepared statements are PostgreSQL's; SQLite caches its own statements")
    _session("agent:main:prepared-a", label="a")
    _session("agent:main:prepared-b", label="b")
    by_key = PreparedQuery(lambda key: Session.objects.filter(key=key), key=str)
    by_ids = PreparedQuery(lambda ids: Session.objects.filter(pk__in=ids).order_by("pk"), ids=IdList)

    first = by_key.fetch(key="agent:main:prepared-a")
    with CaptureQueriesContext(connection) as logged:  # logged as any query
        second = by_key.fetch(key="agent:main:prepared-b")
    listed = by_ids.fetch(ids=[first[0].pk, second[0].pk])

    assert [s.label for s in first + second] == ["a", "b"] and [s.pk for s in listed] == [first[0].pk, second[0].pk]
    assert len(logged.captured_queries) == 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s", ["%sessions_app_session%"]
        )
        prepared = [row[0] for row in cursor.fetchall()]
    assert len(prepared) == 1 and '"key" = $1' in prepared[0]  # once for both calls; the id list is not prepared


@pytest.mark.django_db(transaction=True)
def test_postgresql_a_table_changed_under_a_prepared_query_is_read_again_after_one_retry():
    if connection.vendor != "postgresql":
        pytest.skip("server-side prepared statements are PostgreSQL's")
    _session("agent:main:altered", label="before")
    by_key = PreparedQuery(lambda key: Session.objects.filter(key=key), key=str)
    assert by_key.fetch(key="agent:main:altered")[0].label == "before"
    column = Session._meta.get_field("label").column
    table = Session._meta.db_table
    with psycopg.connect(current_database_url(), autocommit=True) as migration:  # another process's migration
        migration.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" TYPE text')
    try:
        assert by_key.fetch(key="agent:main:altered")[0].label == "before"
        assert by_key.fetch(key="agent:main:altered")[0].label == "before"
    finally:
        with psycopg.connect(current_database_url(), autocommit=True) as migration:
            length = Session._meta.get_field("label").max_length
            migration.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" TYPE varchar({length})')
