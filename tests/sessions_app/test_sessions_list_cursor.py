"""sessions.list's keyset cursor (this gateway's addition beside OpenClaw's offset): the chain of pages visits
every session once, newest first, ties on ``updated_at`` included; a session updated meanwhile neither repeats
nor shifts the pages after it; a page's query seeks the index at any depth; bad cursors change nothing."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from gateway.cursors import cursor_encode
from gateway.exceptions import InvalidRequest
from sessions_app import selectors
from sessions_app.models import Session
from sessions_app.schemas import SessionsListParams

from .test_api import make

pytestmark = pytest.mark.django_db

START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def seven_sessions() -> list[str]:
    """s0..s6, newest last; s2, s3 and s4 share one updated_at (the id breaks the tie)."""
    keys = []
    for n in range(7):
        session = make(f"agent:main:s{n}")
        moment = START + timedelta(seconds=3 if n in (2, 3, 4) else n)
        Session.objects.filter(pk=session.pk).update(updated_at=moment)
        keys.append(session.key)
    return keys


def page(**params) -> dict:
    return selectors.sessions_list_payload(SessionsListParams(**params))


def walk(limit: int) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        result = page(limit=limit, **({"cursor": cursor} if cursor else {}))
        pages.append([row["key"] for row in result["sessions"]])
        cursor = result["nextCursor"]
        assert result["hasMore"] is (cursor is not None)
        if cursor is None:
            return pages


def test_the_cursor_chain_visits_every_session_once_newest_first(seven_sessions):
    pages = walk(limit=3)

    newest_first = [f"agent:main:s{n}" for n in (6, 5, 4, 3, 2, 1, 0)]
    assert pages == [newest_first[0:3], newest_first[3:6], newest_first[6:]]
    assert page(limit=3)["nextOffset"] == 3  # OpenClaw's offset pages still work beside it


def test_a_session_updated_during_the_walk_neither_repeats_nor_shifts_the_pages(seven_sessions):
    first = page(limit=3)
    # s0 (the oldest, not yet shown) becomes the newest; s5 (already shown) is touched again.
    Session.objects.filter(key__in=["agent:main:s0", "agent:main:s5"]).update(updated_at=START + timedelta(hours=1))

    rest = page(limit=10, cursor=first["nextCursor"])

    assert [row["key"] for row in rest["sessions"]] == [f"agent:main:s{n}" for n in (3, 2, 1)]
    assert rest["nextOffset"] is None and rest["nextCursor"] is None


@pytest.mark.parametrize(
    ("cursor", "offset", "message"),
    [
        ("not-a-cursor", 0, "invalid cursor"),
        (cursor_encode("2026-01-01T00:00:00", 1), 0, "invalid cursor"),  # a naive time
        (cursor_encode("2026-01-01T00:00:00+00:00", "1"), 0, "invalid cursor"),  # the id must be a number
        (cursor_encode("2026-01-01T00:00:00+00:00"), 0, "invalid cursor"),
        (cursor_encode("2026-01-01T00:00:00+00:00", 1), 2, "sessions.list takes offset or cursor, not both"),
    ],
)
def test_a_bad_cursor_is_refused_before_any_query(seven_sessions, cursor, offset, message, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(InvalidRequest) as refused:
        page(limit=3, cursor=cursor, offset=offset)
    assert refused.value.message == message


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the plan's wording is SQLite's")
def test_a_page_deep_in_the_cursor_chain_seeks_the_index_instead_of_walking_it(seven_sessions):
    first = page(limit=1)
    statements: list[tuple[str, Sequence]] = []

    def capture(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        page(limit=1, cursor=first["nextCursor"])
    (sql, params) = next((sql, params) for sql, params in statements if '"sessions_app_session"' in sql)
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        plan = " ".join(str(row[-1]) for row in cursor.fetchall())

    assert "USING INDEX session_active_recent_idx (updated_at<?)" in plan, plan
    assert "TEMP B-TREE" not in plan and "MULTI-INDEX" not in plan, plan
