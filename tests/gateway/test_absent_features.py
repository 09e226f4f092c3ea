"""Features this gateway does not have (gateway/absent_features.py): each method answers what OpenClaw's gateway
answered for the same call with the feature empty (tests/fixtures/openclaw_absent_features.json), takes exactly
OpenClaw's params, requires OpenClaw's scope, and is advertised in hello-ok as OpenClaw advertises it."""

from __future__ import annotations

import json

import pytest

from gateway import scopes as sc
from gateway.registry import registry
from tests.support.connections import dispatched
from tests.support.processes import ROOT

CAPTURED = json.loads((ROOT / "tests" / "fixtures" / "openclaw_absent_features.json").read_text())

# OpenClaw's method-scope table (reference/openclaw-clients.md §3, the scope column).
OPENCLAW_SCOPES = {
    "cron.list": sc.READ,
    "cron.status": sc.READ,
    "tasks.list": sc.READ,
    "question.list": sc.QUESTIONS,
    "plugin.approval.list": sc.APPROVALS,
    "openclaw.approval.list": sc.APPROVALS,
    "update.status": sc.ADMIN,
    "talk.catalog": sc.READ,
    "sessions.companion.state": sc.READ,
    "sessions.branches.list": sc.READ,
    "sessions.observer.visibility": sc.READ,
    "progressCard.get": sc.READ,
    "last-heartbeat": sc.READ,
}


def call(method: str, params: dict | None = None, scopes: list[str] | None = None) -> dict:
    return dispatched(method, params, scopes=scopes if scopes is not None else [sc.ADMIN])


def answer(method: str, params: dict | None = None, scopes: list[str] | None = None):
    response = call(method, params, scopes)
    assert response["ok"] is True, response
    return response["payload"]


def refusal(method: str, params: dict | None = None, scopes: list[str] | None = None) -> tuple[str, str]:
    response = call(method, params, scopes)
    assert response["ok"] is False, response
    return response["error"]["code"], response["error"]["message"]


def test_each_method_has_openclaws_scope_and_is_advertised():
    assert {name: registry.methods[name].scope for name in OPENCLAW_SCOPES} == OPENCLAW_SCOPES
    assert set(OPENCLAW_SCOPES) <= set(registry.method_names())


@pytest.mark.parametrize("captured", CAPTURED["same"], ids=lambda captured: captured["method"])
def test_it_answers_what_openclaws_gateway_answered_to_the_same_call(captured):
    assert answer(captured["method"], captured["params"]) == captured["answer"]


def test_update_and_cron_status_use_openclaws_fields_and_say_the_feature_is_off():
    update = answer("update.status", {"refreshCheckout": True})
    assert update == {"sentinel": None, "updateAvailable": None}
    assert update.keys() <= CAPTURED["shape"]["update.status"].keys()
    cron = answer("cron.status")
    assert cron == {"enabled": False, "jobs": 0, "nextWakeAtMs": None}
    assert cron.keys() <= CAPTURED["shape"]["cron.status"].keys()


def test_cron_list_pages_an_empty_list_as_openclaw_does():
    compact = answer("cron.list", {"compact": True, "limit": 200, "offset": 40, "sortBy": "name", "sortDir": "desc"})
    assert compact == {
        "jobs": [],
        "snapshotRevision": CAPTURED["same"][0]["answer"]["snapshotRevision"],
        "total": 0,
        "offset": 0,
        "limit": 200,
        "hasMore": False,
        "nextOffset": None,
    }


def test_talk_catalog_names_openclaws_vocabulary_and_no_provider():
    catalog = answer("talk.catalog", {"provider": "openai", "model": "gpt-realtime"})
    assert {key: catalog[key] for key in ("modes", "transports", "brains")} == CAPTURED["talk.catalog vocabulary"]
    assert catalog["speech"] == {"providers": []}
    assert catalog["transcription"] == catalog["realtime"] == {"ready": False, "providers": []}


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("cron.list", {"bogusKey": 1}, "invalid cron.list params: at /bogusKey: unexpected property"),
        ("cron.list", {"limit": 500}, "invalid cron.list params: at /limit: Input should be less than or equal to 200"),
        (
            "cron.list",
            {"offset": -1},
            "invalid cron.list params: at /offset: Input should be greater than or equal to 0",
        ),
        ("cron.status", {"bogusKey": 1}, "invalid cron.status params: at /bogusKey: unexpected property"),
        (
            "tasks.list",
            {"status": ["running", "lost"]},
            "invalid tasks.list params: at /status/1: Input should be 'queued', 'running', 'completed', 'failed', "
            "'cancelled' or 'timed_out'",
        ),
        (
            "tasks.list",
            {"limit": 0},
            "invalid tasks.list params: at /limit: Input should be greater than or equal to 1",
        ),
        ("question.list", {"bogusKey": 1}, "invalid question.list params: at /bogusKey: unexpected property"),
        ("plugin.approval.list", {"all": True}, "invalid plugin.approval.list params: at /all: unexpected property"),
        (
            "update.status",
            {"refreshCheckout": "maybe"},
            "invalid update.status params: at /refreshCheckout: "
            "Input should be a valid boolean, unable to interpret input",
        ),
        (
            "talk.catalog",
            {"provider": ""},
            "invalid talk.catalog params: at /provider: String should have at least 1 character",
        ),
        (
            "sessions.companion.state",
            {"bogusKey": 1},
            "invalid sessions.companion.state params: at /sessionKey: must have required property; "
            "at /bogusKey: unexpected property",
        ),
        (
            "sessions.branches.list",
            {"sessionKey": ""},
            "invalid sessions.branches.list params: at /sessionKey: String should have at least 1 character",
        ),
        (
            "sessions.observer.visibility",
            {},
            "invalid sessions.observer.visibility params: at /visible: must have required property",
        ),
        ("progressCard.get", {}, "invalid progressCard.get params: at /sessionKey: must have required property"),
        ("last-heartbeat", {"agentId": "main"}, "invalid last-heartbeat params: at /agentId: unexpected property"),
    ],
)
def test_params_outside_openclaws_schema_are_refused(method, params, message):
    assert refusal(method, params) == ("INVALID_REQUEST", message)


@pytest.mark.parametrize(
    ("method", "granted", "missing"),
    [
        ("question.list", [sc.WRITE], sc.QUESTIONS),
        ("question.list", [sc.APPROVALS], sc.QUESTIONS),
        ("plugin.approval.list", [sc.READ, sc.WRITE], sc.APPROVALS),
        ("openclaw.approval.list", [sc.WRITE], sc.APPROVALS),
        ("update.status", [sc.READ, sc.WRITE, sc.APPROVALS], sc.ADMIN),
        ("cron.list", [sc.PAIRING], sc.READ),
        ("progressCard.get", [sc.APPROVALS], sc.READ),
    ],
)
def test_a_caller_without_openclaws_scope_is_refused(method, granted, missing):
    params = {"sessionKey": "agent:main:main"} if method == "progressCard.get" else {}
    # The project answers refusals of role and scope as OpenClaw does: INVALID_REQUEST (gateway/exceptions.py).
    assert refusal(method, params, scopes=granted) == ("INVALID_REQUEST", f"missing scope: {missing}")


def test_one_status_is_taken_as_a_list_of_one():
    assert answer("tasks.list", {"status": "running", "sortBy": "endedAt", "cursor": "x"}) == {"tasks": []}
    message = refusal("tasks.list", {"status": "lost"})[1]
    assert message.startswith("invalid tasks.list params: at /status/0: Input should be 'queued'")


def test_the_scopes_that_imply_openclaws_let_the_caller_in():
    assert answer("question.list", scopes=[sc.QUESTIONS]) == {"questions": []}
    assert answer("plugin.approval.list", scopes=[sc.APPROVALS]) == []
    assert answer("cron.list", scopes=[sc.WRITE])["jobs"] == []
    assert answer("update.status", scopes=[sc.ADMIN])["updateAvailable"] is None
