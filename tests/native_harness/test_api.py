"""Adoption and fork over the JSON API (the same services as sessions.adopt / sessions.fork)."""

from __future__ import annotations

import pytest
from django.test import Client

from native_harness import services
from native_harness.harness import harness
from sessions_app.models import Session
from tests.support.api import API_TOKEN

from .conftest import SOURCE_KEY

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "harness"])
TOKEN = API_TOKEN


@pytest.fixture(autouse=True)
def _token(api_token):
    return api_token


def post(path: str, body: dict):
    return Client().post(path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")


def test_adopt_and_fork_over_http(seeded):
    thread = services.thread_create([("user", "hello"), ("assistant", "hi")])
    adopted = post("/api/sessions/adopt", {"threadId": thread.thread_id, "key": "adopted", "label": "via api"})
    assert adopted.status_code == 201, adopted.content
    assert adopted.json()["key"] == "agent:main:adopted"
    assert adopted.json()["entry"]["label"] == "via api"
    again = post("/api/sessions/adopt", {"threadId": thread.thread_id})  # a second session on the same thread
    assert again.status_code == 201, again.content
    assert again.json()["key"] not in ("agent:main:adopted", None)
    missing = post("/api/sessions/adopt", {"threadId": "thread-nope"})
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == "native thread not found: thread-nope"

    forked = post(f"/api/sessions/{SOURCE_KEY}/fork", {"entryId": seeded.entry_id})
    assert forked.status_code == 201, forked.content
    assert forked.json()["editorText"] == "second question"
    assert Session.objects.filter(key=forked.json()["sessionKey"], initialization_pending=False).exists()
    bad = post(f"/api/sessions/{SOURCE_KEY}/fork", {"entryId": "nope"})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == "message entry not found: nope"
    unknown = post("/api/sessions/agent:main:nobody/fork", {"entryId": "x"})
    assert unknown.status_code == 404


def test_an_unexpected_adoption_failure_is_a_500_with_a_reference_and_creates_nothing(seeded, monkeypatch):
    thread = services.thread_create([("user", "hello"), ("assistant", "hi")])
    sessions_before = Session.objects.count()

    def broken(**kwargs):
        raise RuntimeError("database password is hunter2")

    monkeypatch.setattr(harness, "adopt_thread", broken)
    response = post("/api/sessions/adopt", {"threadId": thread.thread_id})

    assert response.status_code == 500
    error = response.json()["error"]
    assert (error["code"], error["retryable"], error["details"]["reason"]) == (
        "UNAVAILABLE",
        True,
        "initialization-failed",
    )
    assert error["message"] == f"session initialization failed; reference {error['details']['errorId']}"
    assert "hunter2" not in response.content.decode()
    assert Session.objects.count() == sessions_before
