"""GET /api/sessions/runs: chat turns of every session, newest first, filtered, in keyset pages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client

from gateway.cursors import cursor_encode
from sessions_app.models import Run
from sessions_app.services import runs

from .test_api import TOKEN, finished_turn, make

pytestmark = pytest.mark.django_db

START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _token(api_token):
    return api_token


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {TOKEN}"})


@pytest.fixture
def four_runs() -> list[str]:
    """r1..r4, one second apart (r4 newest); r1 and r3 finished, r2 and r4 queued; r3 in session b."""
    a, b = make("agent:main:a"), make("agent:main:b")
    finished_turn(a, "r1", "one", "ONE")
    runs.run_submit(session_key=a.key, message="two", idempotency_key="r2")
    finished_turn(b, "r3", "three", "THREE")
    runs.run_submit(session_key=a.key, message="four", idempotency_key="r4")
    for n in range(1, 5):
        Run.objects.filter(run_id=f"r{n}").update(created_at=START + timedelta(seconds=n))
    return ["r4", "r3", "r2", "r1"]


def ids(page: dict) -> list[str]:
    return [run["runId"] for run in page["runs"]]


def test_runs_are_listed_newest_first_in_pages(client, four_runs, django_assert_max_num_queries):
    with django_assert_max_num_queries(1):
        first = client.get("/api/sessions/runs", {"limit": 3})

    assert first.status_code == 200
    page = first.json()
    assert ids(page) == ["r4", "r3", "r2"]
    assert page["runs"][1] == {
        "runId": "r3",
        "sessionKey": "agent:main:b",
        "status": "ok",
        "createdAt": int((START + timedelta(seconds=3)).timestamp() * 1000),
        "startedAt": page["runs"][1]["startedAt"],
        "endedAt": page["runs"][1]["endedAt"],
        "error": None,
    }
    assert page["runs"][1]["endedAt"] >= page["runs"][1]["startedAt"] > 0
    last = client.get("/api/sessions/runs", {"limit": 3, "cursor": page["nextCursor"]}).json()
    assert (ids(last), last["nextCursor"]) == (["r1"], None)


def test_a_run_sent_between_pages_does_not_shift_the_next_page(client, four_runs):
    first = client.get("/api/sessions/runs", {"limit": 2}).json()

    runs.run_submit(session_key="agent:main:a", message="five", idempotency_key="r5")
    rest = client.get("/api/sessions/runs", {"limit": 5, "cursor": first["nextCursor"]}).json()

    assert ids(first) == ["r4", "r3"]
    assert ids(rest) == ["r2", "r1"]


def test_runs_with_the_same_time_are_paged_by_id(client, four_runs):
    Run.objects.update(created_at=START)
    seen = []
    cursor = None
    while True:
        page = client.get("/api/sessions/runs", {"limit": 1, **({"cursor": cursor} if cursor else {})}).json()
        seen += ids(page)
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == ["r4", "r3", "r2", "r1"]


def test_runs_are_filtered_by_status_and_session(client, four_runs):
    def listed(**query) -> list[str]:
        response = client.get("/api/sessions/runs", query)
        assert response.status_code == 200, response.content
        return ids(response.json())

    assert listed(status="queued") == ["r4", "r2"]
    assert listed(status="ok", sessionKey="agent:main:a") == ["r1"]
    assert listed(sessionKey="b") == ["r3"]  # a bare key is under the default agent
    assert listed(sessionKey="agent:main:nope") == []
    assert listed(status="aborted") == []


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"cursor": "nope"}, "invalid cursor"),
        ({"cursor": cursor_encode("yesterday", "r1")}, "invalid cursor"),
        ({"cursor": cursor_encode("2026-01-01T00:00:00", "r1")}, "invalid cursor"),  # no time zone
        ({"cursor": cursor_encode(START.isoformat())}, "invalid cursor"),
        ({"sessionKey": "agent::x"}, "invalid session key: agent::x"),
    ],
)
def test_a_bad_cursor_or_session_key_is_refused(client, four_runs, query, message):
    response = client.get("/api/sessions/runs", query)

    assert response.status_code == 400
    assert response.json() == {"error": {"code": "INVALID_REQUEST", "message": message}}


@pytest.mark.parametrize("query", [{"status": "done"}, {"limit": 0}, {"limit": 501}, {"sessionKey": "k" * 301}])
def test_out_of_bounds_filters_are_bad_input(client, query):
    response = client.get("/api/sessions/runs", query)

    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(f"invalid request: at /{next(iter(query))} (query):")


def test_the_list_needs_the_gateway_token(four_runs):
    assert Client().get("/api/sessions/runs").status_code == 401
    assert Client(headers={"Authorization": "Bearer wrong"}).get("/api/sessions/runs").status_code == 401


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the plan's wording is SQLite's")
def test_a_page_deep_in_the_cursor_chain_seeks_the_index_instead_of_walking_it(client, four_runs):
    """With the keyset's OR alone SQLite reads every older run through two index searches and sorts them all
    (``MULTI-INDEX OR`` + ``USE TEMP B-TREE FOR ORDER BY``): a page would cost the rows after its cursor."""
    first = client.get("/api/sessions/runs", {"limit": 1}).json()
    statements: list[tuple[str, tuple]] = []

    def capture(execute, sql, params, many, context):
        statements.append((sql, tuple(params or ())))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        client.get("/api/sessions/runs", {"limit": 1, "cursor": first["nextCursor"]})
    (sql, params) = next((sql, params) for sql, params in statements if '"sessions_app_run"' in sql)
    with connection.cursor() as cursor:
        # With the bound parameters, as the page runs it (SQLite plans literal values differently).
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        plan = " ".join(str(row[-1]) for row in cursor.fetchall())

    assert "SEARCH sessions_app_run USING INDEX run_recent_idx (created_at<?)" in plan
    assert "TEMP B-TREE" not in plan and "MULTI-INDEX" not in plan
