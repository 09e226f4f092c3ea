"""The JSON API's one error shape, whatever goes wrong, and the admin's rate-limited login."""

from __future__ import annotations

import logging
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from sessions_app import api as sessions_api
from tests.support.api import API_TOKEN

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(api_token) -> Client:
    return Client(headers={"Authorization": f"Bearer {API_TOKEN}"})


def error_of(response) -> dict:
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    return body["error"]


def test_a_missing_or_wrong_token_is_a_401_in_the_error_shape(api_token):
    missing = Client().get("/api/sessions/")
    wrong = Client(headers={"Authorization": "Bearer not-the-token"}).get("/api/sessions/")
    assert missing.status_code == wrong.status_code == 401
    assert error_of(missing)["message"] == "gateway token required"
    assert error_of(missing)["details"]["code"] == "AUTH_TOKEN_MISSING"
    assert error_of(wrong)["message"] == "gateway token refused"
    assert error_of(wrong)["details"]["code"] == "AUTH_TOKEN_MISMATCH"


def test_bad_json_is_a_400_in_the_error_shape(client):
    response = client.post("/api/sessions/", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert error_of(response) == {"code": "INVALID_REQUEST", "message": "invalid request: the body is not valid JSON"}


def test_validation_errors_name_only_what_the_client_sent(client):
    response = client.post("/api/sessions/", {"message": 5, "bogus": 1}, content_type="application/json")
    bad_query = client.get("/api/sessions/?limit=0")
    error = error_of(response)
    assert response.status_code == 400
    assert error["message"] == (
        "invalid request: at /message (body): Input should be a valid string; at /bogus (body): unexpected property"
    )
    assert error["details"]["errors"] == [
        {"in": "body", "path": "/message", "message": "Input should be a valid string"},
        {"in": "body", "path": "/bogus", "message": "unexpected property"},
    ]
    assert "payload" not in response.content.decode()  # the view's parameter name is ours, not the client's
    assert (
        error_of(bad_query)["message"]
        == "invalid request: at /limit (query): Input should be greater than or equal to 1"
    )


def test_unknown_routes_and_methods_answer_in_the_error_shape(client):
    unknown = client.get("/api/no-such-thing")
    method = client.delete("/api/gateway/health")
    assert unknown.status_code == 404
    assert error_of(unknown) == {"code": "INVALID_REQUEST", "message": "no API route GET /api/no-such-thing"}
    assert method.status_code == 405
    assert error_of(method)["message"] == "method DELETE is not allowed on /api/gateway/health"
    assert method["Allow"] == "GET"


def test_sessions_without_the_trailing_slash_work_as_spelled_in_the_readme(client):
    created = client.post("/api/sessions", {"key": "no-slash"}, content_type="application/json")
    listed = client.get("/api/sessions")
    assert created.status_code == 201 and created.json()["key"] == "agent:main:no-slash"
    assert [row["key"] for row in listed.json()["sessions"]] == ["agent:main:no-slash"]


def test_an_unexpected_failure_is_a_reference_not_the_exception_text(client, monkeypatch, caplog):
    def broken(**kwargs):
        raise RuntimeError("SELECT secret FROM internals")

    monkeypatch.setattr(sessions_api.creation, "session_create_requested", broken)
    with caplog.at_level(logging.ERROR):
        response = client.post("/api/sessions/", {"key": "x"}, content_type="application/json")

    error = error_of(response)
    assert response.status_code == 500
    assert error["code"] == "UNAVAILABLE" and error["retryable"] is True
    assert error["message"] == f"internal error; reference {error['details']['errorId']}"
    assert "SELECT" not in response.content.decode()
    # The operator finds the traceback in the log under the same reference.
    logged = [r for r in caplog.records if error["details"]["errorId"] in r.getMessage()]
    assert logged and logged[0].exc_info is not None


@pytest.fixture
def limited_admin_login(settings) -> str:
    """Three failures lock an address out; each test gets an address of its own (the counts live in the cache)."""
    limits = {"MAX_FAILURES": 3, "WINDOW_MS": 60_000, "LOCKOUT_MS": 60_000, "EXEMPT_LOOPBACK": False}
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "AUTH_RATE_LIMIT": limits}
    get_user_model().objects.create_superuser("boss", password="right-password-123")
    return f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}"


def test_failed_admin_logins_lock_the_address_out(limited_admin_login):
    client = Client(REMOTE_ADDR=limited_admin_login)
    url = reverse("admin:login")
    attempts = [client.post(url, {"username": "boss", "password": "wrong"}) for _ in range(3)]
    locked = client.post(url, {"username": "boss", "password": "right-password-123"})

    assert [a.status_code for a in attempts[:2]] == [200, 200]  # the form again, with its error
    assert attempts[2].status_code == 429
    assert locked.status_code == 429  # even the right password, until the lockout ends
    assert int(locked["Retry-After"]) > 0
    assert "_auth_user_id" not in client.session


def test_a_successful_admin_login_clears_the_failures(limited_admin_login):
    client = Client(REMOTE_ADDR=limited_admin_login)
    url = reverse("admin:login")
    client.post(url, {"username": "boss", "password": "wrong"})
    client.post(url, {"username": "boss", "password": "wrong"})
    ok = client.post(url, {"username": "boss", "password": "right-password-123"})
    client.logout()
    again = client.post(url, {"username": "boss", "password": "wrong"})
    assert ok.status_code == 302
    assert again.status_code == 200  # the count started over


def test_console_and_admin_logins_share_one_failure_budget_per_address(limited_admin_login):
    """A password guesser cannot double its tries by alternating the console's login and the admin's."""
    client = Client(REMOTE_ADDR=limited_admin_login)
    console, admin = reverse("ui:login"), reverse("admin:login")
    first = client.post(console, {"username": "boss", "password": "wrong"})
    second = client.post(admin, {"username": "boss", "password": "wrong"})
    third = client.post(console, {"username": "boss", "password": "wrong"})
    locked = client.post(console, {"username": "boss", "password": "right-password-123"})

    assert (first.status_code, second.status_code) == (200, 200)
    assert third.status_code == 429 and locked.status_code == 429
    assert "_auth_user_id" not in client.session
