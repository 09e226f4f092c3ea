"""usage.status, usage.cost and sessions.usage: the figures (summed per day, model, session and agent by the
database, priced here), OpenClaw's shapes, and every refusal with its exact message."""

from __future__ import annotations

import asyncio

import pytest

from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.dispatch import run_request
from gateway.protocol import RequestFrame
from gateway.registry import registry
from operations_app.rpc import sessions_usage_rpc, usage_cost_rpc, usage_status_rpc
from operations_app.schemas import SessionsUsageParams, UsageCostParams, UsageStatusParams
from sessions_app.models import Run

from .conftest import at, turn

READER = RpcContext(
    conn_id="reader",
    channel_name="inmemory!reader",
    role=sc.ROLE_OPERATOR,
    scopes=[sc.READ],
    auth_method="token",
    client_id="test",
    client_mode="test",
)
MARCH = {"startDate": "2026-03-01", "endDate": "2026-03-03"}
ZERO = {
    "input": 0,
    "output": 0,
    "cacheRead": 0,
    "cacheWrite": 0,
    "totalTokens": 0,
    "totalCost": 0.0,
    "inputCost": 0.0,
    "outputCost": 0.0,
    "cacheReadCost": 0.0,
    "cacheWriteCost": 0.0,
    "missingCostEntries": 0,
}


def cost(**params) -> dict:
    return usage_cost_rpc(READER, UsageCostParams.model_validate(params))


def sessions_usage(**params) -> dict:
    return sessions_usage_rpc(READER, SessionsUsageParams.model_validate(params))


def wire(method: str, params: dict, scopes: list[str] | None = None) -> dict:
    context = RpcContext(**{**READER.__dict__, "scopes": scopes if scopes is not None else [sc.READ]})
    return asyncio.run(run_request(context, RequestFrame(type="req", id="r1", method=method, params=params)))


def refusal(response: dict) -> tuple[str, str]:
    assert response["ok"] is False, response
    return response["error"]["code"], response["error"]["message"]


def test_the_methods_are_registered_with_the_read_scope():
    assert {name: registry.methods[name].scope for name in ("usage.status", "usage.cost", "sessions.usage")} == {
        "usage.status": sc.READ,
        "usage.cost": sc.READ,
        "sessions.usage": sc.READ,
    }
    # As OpenClaw's hello-ok: usage.status and usage.cost advertised, sessions.usage not (its Control UI calls it).
    assert {"usage.status", "usage.cost"} <= set(registry.method_names())
    assert "sessions.usage" not in registry.method_names()


# --- usage.cost ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_usage_cost_sums_every_agent_per_day_and_prices_each_model(month):
    summary = cost(**MARCH, agentScope="all")

    assert summary["days"] == 3
    assert (summary["startDate"], summary["endDate"]) == ("2026-03-01", "2026-03-03")
    assert summary["totals"] == {
        "input": 6710,
        "output": 1920,
        "cacheRead": 400,
        "cacheWrite": 0,
        "totalTokens": 9030,
        "totalCost": pytest.approx(0.01918),
        "inputCost": pytest.approx(0.01002),
        "outputCost": pytest.approx(0.00896),
        "cacheReadCost": pytest.approx(0.0002),
        "cacheWriteCost": 0.0,
        "missingCostEntries": 1,
    }
    assert [(day["date"], day["input"], day["output"], day["cacheRead"]) for day in summary["daily"]] == [
        ("2026-03-01", 3000, 1500, 400),
        ("2026-03-02", 3700, 400, 0),
        ("2026-03-03", 10, 20, 0),
    ]
    assert [day["totalCost"] for day in summary["daily"]] == [
        pytest.approx(0.0122),
        pytest.approx(0.0068),
        pytest.approx(0.00018),
    ]
    assert [day["missingCostEntries"] for day in summary["daily"]] == [0, 1, 0]
    assert summary["missingPricing"] == ["openai/mystery"]
    assert isinstance(summary["updatedAt"], int)


@pytest.mark.django_db
def test_usage_cost_reads_the_default_agent_unless_asked_for_another_or_all(month):
    assert cost(**MARCH)["totals"]["input"] == 6700  # agent "main", as OpenClaw without agentScope
    assert cost(**MARCH, agentId="ops")["totals"]["input"] == 10
    assert cost(**MARCH, agentId="nobody")["totals"] == ZERO


@pytest.mark.django_db
def test_a_model_priced_under_its_provider_name_wins_over_the_bare_name(month, settings):
    settings.OPENCLAW_MODEL_PRICES = {**settings.OPENCLAW_MODEL_PRICES, "openai/gpt-a": {"input": 0, "output": 0}}

    summary = cost(startDate="2026-03-03", endDate="2026-03-03", agentScope="all")

    assert summary["totals"]["totalCost"] == 0.0
    assert summary["totals"]["missingCostEntries"] == 0


@pytest.mark.django_db
def test_without_prices_every_model_costs_nothing_and_is_listed(month, settings):
    settings.OPENCLAW_MODEL_PRICES = {}

    summary = cost(**MARCH, agentScope="all")

    assert summary["totals"]["totalCost"] == 0.0
    assert summary["totals"]["missingCostEntries"] == 5  # every run that recorded usage
    assert summary["missingPricing"] == ["openai/gpt-a", "openai/gpt-b", "openai/mystery"]


@pytest.mark.django_db
def test_days_are_cut_in_the_zone_the_caller_asks_for():
    turn("agent:main:main", "late", at("2026-03-01", "23:30"), {"input": 5, "output": 5})
    one_day = {"startDate": "2026-03-02", "endDate": "2026-03-02"}

    assert cost(**one_day)["daily"] == []  # UTC: it happened on the 1st
    tokyo = cost(**one_day, mode="specific", timeZone="Asia/Tokyo")
    assert [day["date"] for day in tokyo["daily"]] == ["2026-03-02"]
    india = cost(**one_day, mode="specific", utcOffset="UTC+5:30")
    assert [day["date"] for day in india["daily"]] == ["2026-03-02"]
    # Without mode "specific" the zone fields are not used (OpenClaw's compatibility rule).
    assert cost(**one_day, timeZone="Asia/Tokyo")["daily"] == []
    # A zone this gateway does not know, sent with a usable offset: the offset counts.
    east = cost(**one_day, mode="specific", timeZone="Mars/Olympus", utcOffset="UTC+1")
    assert [day["date"] for day in east["daily"]] == ["2026-03-02"]
    assert cost(**one_day, mode="specific", timeZone="Mars/Olympus", utcOffset="UTC-01:00")["daily"] == []


@pytest.mark.django_db
def test_usage_that_is_not_a_count_is_taken_as_zero_and_the_rest_still_counts():
    run = turn("agent:main:main", "odd", at("2026-03-01"), {"input": 1, "output": 1})
    # What a worker host may report (its own usage object), written as it came.
    Run.objects.filter(pk=run.pk).update(
        usage={"input": "12", "output": -5, "cacheRead": True, "cacheWrite": 7.0, "totalTokens": [1]}
    )
    turn("agent:main:main", "fine", at("2026-03-01", "13:00"), {"input": 4, "output": 6})

    totals = cost(startDate="2026-03-01", endDate="2026-03-01")["totals"]

    assert (totals["input"], totals["output"], totals["cacheRead"], totals["cacheWrite"]) == (4, 6, 0, 7)


@pytest.mark.django_db
def test_a_run_that_named_no_model_is_unpriced_and_left_unnamed():
    turn("agent:main:main", "anon", at("2026-03-01"), {"input": 3, "output": 4}, model="", provider="")

    result = sessions_usage(startDate="2026-03-01", endDate="2026-03-01")

    assert result["aggregates"]["byModel"] == [
        {
            "count": 1,
            "totals": {**ZERO, "input": 3, "output": 4, "totalTokens": 7, "missingCostEntries": 1},
            "priced": False,
        }
    ]
    assert result["aggregates"]["modelDaily"] == [{"date": "2026-03-01", "tokens": 7, "cost": 0.0, "count": 1}]
    assert result["missingPricing"] == ["unknown"]


@pytest.mark.django_db
def test_no_runs_answer_zeros():
    summary = cost()

    assert summary["days"] == 30
    assert summary["daily"] == []
    assert summary["totals"] == ZERO
    assert summary["missingPricing"] == []


# --- sessions.usage --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_sessions_usage_lists_sessions_latest_first_with_their_breakdown(month):
    result = sessions_usage(**MARCH, agentScope="all", mode="specific", timeZone="UTC", groupBy="family")

    assert [row["key"] for row in result["sessions"]] == ["agent:main:alpha", "agent:ops:gamma", "agent:main:beta"]
    alpha = result["sessions"][0]
    assert alpha["agentId"] == "main"
    usage = alpha["usage"]
    assert (usage["input"], usage["output"], usage["cacheRead"]) == (3000, 1500, 400)
    assert usage["totalCost"] == pytest.approx(0.0122)
    assert usage["activityDates"] == ["2026-03-01", "2026-03-03"]
    assert [(d["date"], d["tokens"]) for d in usage["dailyBreakdown"]] == [("2026-03-01", 4900), ("2026-03-03", 0)]
    assert usage["messageCounts"] == {
        "total": 5,
        "user": 3,
        "assistant": 2,
        "toolCalls": 0,
        "toolResults": 0,
        "errors": 1,
    }
    assert usage["firstActivity"] == int(at("2026-03-01", "08:00").timestamp() * 1000)
    assert usage["lastActivity"] == int(at("2026-03-03", "14:00").timestamp() * 1000)
    assert sorted((m["model"], m["count"]) for m in usage["modelUsage"]) == [("gpt-a", 1), ("gpt-b", 1)]

    assert result["totals"]["totalTokens"] == 9030
    aggregates = result["aggregates"]
    assert [(m["model"], m["priced"]) for m in aggregates["byModel"]] == [
        ("gpt-a", True),
        ("gpt-b", True),
        ("mystery", False),
    ]
    assert [row["agentId"] for row in aggregates["byAgent"]] == ["main", "ops"]
    assert [(d["date"], d["tokens"], d["errors"]) for d in aggregates["daily"]] == [
        ("2026-03-01", 4900, 0),
        ("2026-03-02", 4100, 0),
        ("2026-03-03", 30, 1),
    ]
    assert aggregates["messages"]["user"] == 6
    assert [p["provider"] for p in aggregates["byProvider"]] == ["openai"]
    assert result["missingPricing"] == ["openai/mystery"]
    assert aggregates["sessionCount"] == 3
    # What OpenClaw's Control UI draws its daily chart from: each day's totals with their cost.
    assert [(d["date"], d["input"], d["totalCost"], d["missingCostEntries"]) for d in aggregates["costDaily"]] == [
        ("2026-03-01", 3000, pytest.approx(0.0122), 0),
        ("2026-03-02", 3700, pytest.approx(0.0068), 1),
        ("2026-03-03", 10, pytest.approx(0.00018), 0),
    ]
    assert alpha["hasContextWeight"] is False


@pytest.mark.django_db
def test_sessions_usage_limit_and_one_session_by_key(month):
    limited = sessions_usage(**MARCH, agentScope="all", limit=1)
    assert len(limited["sessions"]) == 1
    assert limited["aggregates"]["sessionCount"] == 3
    assert limited["totals"]["totalTokens"] == 9030  # the totals are the window's, not the listed sessions'

    beta = sessions_usage(**MARCH, key="agent:main:beta")
    assert [row["key"] for row in beta["sessions"]] == ["agent:main:beta"]
    assert beta["totals"]["input"] == 3700

    unknown = sessions_usage(**MARCH, key="agent:main:nothing-here")
    assert unknown["sessions"] == []
    assert unknown["totals"] == ZERO


@pytest.mark.django_db
def test_context_weight_is_null_when_asked_for(month):
    row = sessions_usage(**MARCH, key="agent:main:beta", includeContextWeight=True)["sessions"][0]
    assert row["contextWeight"] is None
    assert "contextWeight" not in sessions_usage(**MARCH, key="agent:main:beta")["sessions"][0]


@pytest.mark.django_db
def test_a_report_is_a_few_grouped_queries_however_many_runs(month, django_assert_num_queries):
    with django_assert_num_queries(1):
        cost(**MARCH, agentScope="all")
    # Totals per day/agent/model; the sessions ranked; their rows; their breakdown per day and model.
    with django_assert_num_queries(4):
        sessions_usage(**MARCH, agentScope="all")
    with django_assert_num_queries(5):  # and the key's session first
        sessions_usage(**MARCH, key="agent:main:beta")
    with django_assert_num_queries(5):  # and, with more sessions than the limit, their count
        sessions_usage(**MARCH, agentScope="all", limit=2)


# --- usage.status ----------------------------------------------------------------------------------------


def test_usage_status_reports_no_provider_quota():
    status = usage_status_rpc(READER, UsageStatusParams())
    assert status["providers"] == []
    assert isinstance(status["updatedAt"], int)


# --- over the wire: scopes and refusals ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_with_no_runs_the_methods_answer_over_the_wire():
    for method in ("usage.status", "usage.cost", "sessions.usage"):
        response = wire(method, {})
        assert response["ok"] is True, response
    assert wire("sessions.usage", {})["payload"]["sessions"] == []


@pytest.mark.parametrize("method", ["usage.status", "usage.cost", "sessions.usage"])
def test_a_connection_without_read_scope_is_refused(method):
    assert refusal(wire(method, {}, scopes=[sc.PAIRING])) == ("INVALID_REQUEST", "missing scope: operator.read")


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        (
            "usage.cost",
            {"startDate": "2026-02-30", "endDate": "2026-03-01"},
            "invalid startDate: expected a valid YYYY-MM-DD calendar date",
        ),
        (
            "usage.cost",
            {"startDate": "2026-03-01", "endDate": "2026-13-01"},
            "invalid endDate: expected a valid YYYY-MM-DD calendar date",
        ),
        ("usage.cost", {"startDate": "2026-03-01"}, "startDate and endDate must be provided together"),
        ("usage.cost", {"startDate": "2026-03-02", "endDate": "2026-03-01"}, "startDate must not be after endDate"),
        (
            "usage.cost",
            {"startDate": "2025-01-01", "endDate": "2026-01-02"},
            "date range too long: 367 days from startDate to endDate, at most 366",
        ),
        (
            "usage.cost",
            {"startDate": "1969-12-31", "endDate": "1970-01-01"},
            "startDate must be between 1970-01-01 and 9998-12-31",
        ),
        ("usage.cost", {"range": "all"}, 'range "all" is not served: a report covers at most 366 days (use "1y")'),
        (
            "usage.cost",
            {"mode": "specific", "timeZone": "Mars/Olympus"},
            "invalid timeZone: expected a valid IANA time zone",
        ),
        (
            "usage.cost",
            {"mode": "specific", "timeZone": "localtime"},
            "invalid timeZone: expected a valid IANA time zone",
        ),
        (
            "usage.cost",
            {"mode": "specific", "timeZone": "../../etc/passwd"},
            "invalid timeZone: expected a valid IANA time zone",
        ),
        (
            "usage.cost",
            {"mode": "specific", "utcOffset": "UTC+15"},
            "invalid utcOffset: expected UTC-12:00 through UTC+14:00",
        ),
        ("usage.cost", {"agentScope": "all", "agentId": "main"}, "agentScope=all cannot be combined with agentId"),
        ("usage.cost", {"agentId": "Not An Agent!"}, "invalid agentId: Not An Agent!"),
        (
            "sessions.usage",
            {"agentScope": "all", "key": "main"},
            "agentScope=all cannot be combined with key or agentId",
        ),
        ("sessions.usage", {"key": "agent:ops:x", "agentId": "main"}, "session key agent does not match agentId"),
    ],
)
def test_a_window_or_scope_that_cannot_be_read_is_refused_with_the_reason(method, params, message):
    assert refusal(wire(method, params)) == ("INVALID_REQUEST", message)


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("usage.cost", {"days": 0}, "invalid usage.cost params: at /days: Input should be greater than or equal to 1"),
        ("usage.cost", {"days": 367}, "invalid usage.cost params: at /days: Input should be less than or equal to 366"),
        (
            "usage.cost",
            {"startDate": "March 1"},
            "invalid usage.cost params: at /startDate: String should match pattern '^\\d{4}-\\d{2}-\\d{2}$'",
        ),
        ("usage.cost", {"mode": "local"}, None),
        ("usage.cost", {"surprise": 1}, None),
        (
            "sessions.usage",
            {"limit": 0},
            "invalid sessions.usage params: at /limit: Input should be greater than or equal to 1",
        ),
        (
            "sessions.usage",
            {"limit": 1001},
            "invalid sessions.usage params: at /limit: Input should be less than or equal to 1000",
        ),
        ("usage.status", {"sessionKey": ""}, None),
    ],
)
def test_params_out_of_bounds_are_refused(method, params, message):
    code, text = refusal(wire(method, params))
    assert code == "INVALID_REQUEST"
    assert text.startswith(f"invalid {method} params: ")
    if message is not None:
        assert text == message
