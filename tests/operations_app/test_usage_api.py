"""/api/usage/: the usage reports over HTTP with the gateway token, the same params and refusals as the RPC."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.support.api import API_TOKEN

pytestmark = pytest.mark.django_db

MARCH = {"startDate": "2026-03-01", "endDate": "2026-03-03"}


@pytest.fixture
def client(api_token) -> Client:
    return Client(headers={"Authorization": f"Bearer {API_TOKEN}"})


def test_cost_per_day_over_http(client, month):
    response = client.get("/api/usage/cost", {**MARCH, "agentScope": "all"})

    assert response.status_code == 200
    body = response.json()
    assert body["totals"]["totalTokens"] == 9030
    assert [day["date"] for day in body["daily"]] == ["2026-03-01", "2026-03-02", "2026-03-03"]
    assert body["missingPricing"] == ["openai/mystery"]


def test_sessions_and_status_over_http(client, month):
    sessions = client.get("/api/usage/sessions", {**MARCH, "agentScope": "all", "limit": 2})
    status = client.get("/api/usage/status")

    assert sessions.status_code == 200
    assert [row["key"] for row in sessions.json()["sessions"]] == ["agent:main:alpha", "agent:ops:gamma"]
    assert status.status_code == 200
    assert status.json()["providers"] == []


def test_a_bad_range_is_a_400_with_the_reason(client):
    too_long = client.get("/api/usage/cost", {"startDate": "2024-01-01", "endDate": "2026-01-01"})
    out_of_bounds = client.get("/api/usage/sessions", {"limit": 5000})

    assert too_long.status_code == 400
    assert too_long.json() == {
        "error": {
            "code": "INVALID_REQUEST",
            "message": "date range too long: 732 days from startDate to endDate, at most 366",
        }
    }
    assert out_of_bounds.status_code == 400
    assert out_of_bounds.json()["error"]["message"] == (
        "invalid request: at /limit (query): Input should be less than or equal to 1000"
    )


def test_without_the_token_nothing_is_read(api_token, month):
    response = Client().get("/api/usage/cost")

    assert response.status_code == 401
    assert response.json()["error"]["message"] == "gateway token required"
