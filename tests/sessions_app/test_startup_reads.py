"""What OpenClaw's Control UI and TUI read at start, answered from this gateway's state: agents.list,
agent.identity.get, models.list, models.authStatus, commands.list, chat.metadata, the sessions' part of status and
diagnostics.lanes. Names and shapes are OpenClaw's (tests/fixtures/openclaw_startup_reads.json); keys never leave."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gateway import scopes as sc
from gateway.registry import registry
from sessions_app.commands import GATEWAY_COMMANDS
from sessions_app.models import Session
from sessions_app.services import runs, sessions
from tests.support.connections import dispatched, handled
from tests.support.processes import ROOT

pytestmark = pytest.mark.django_db

OPENCLAW = json.loads((ROOT / "tests" / "fixtures" / "openclaw_startup_reads.json").read_text())
SECRET_KEY = "sk-live-do-not-show-0123456789"
READS = (
    "agents.list",
    "agent.identity.get",
    "models.list",
    "models.authStatus",
    "commands.list",
    "chat.metadata",
    "status",
    "diagnostics.lanes",
)


def call(method: str, params: dict | None = None, scopes: list[str] | None = None) -> dict:
    return dispatched(method, params, scopes=scopes if scopes is not None else [sc.READ])


def answer(method: str, params: dict | None = None, scopes: list[str] | None = None):
    """The handler's answer on this thread: the rows a test made are uncommitted (``call`` covers the dispatch)."""
    return handled(method, params, scopes=scopes if scopes is not None else [sc.READ])


def refusal(method: str, params: dict | None = None, scopes: list[str] | None = None) -> tuple[str, str]:
    response = call(method, params, scopes)
    assert response["ok"] is False, response
    return response["error"]["code"], response["error"]["message"]


def openclaw(prefix: str):
    return next(value for key, value in OPENCLAW.items() if key.startswith(prefix))


@pytest.fixture
def openai_model(settings):
    settings.OPENCLAW_MODEL = {
        **settings.OPENCLAW_MODEL,
        "PROVIDER": "openai",
        "BASE_URL": "http://127.0.0.1:9/v1",
        "API_KEY": SECRET_KEY,
        "MODEL": "gpt-test",
    }
    return settings.OPENCLAW_MODEL


def make(key: str, **fields) -> Session:
    return sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id=key.split(":")[1], **fields))


def test_the_reads_need_operator_read_and_are_advertised():
    assert {name: registry.methods[name].scope for name in READS} == dict.fromkeys(READS, sc.READ)
    assert set(READS) <= set(registry.method_names())
    for method in READS:
        assert refusal(method, scopes=[sc.PAIRING]) == ("INVALID_REQUEST", "missing scope: operator.read")


# --- agents ------------------------------------------------------------------------------------------


def test_agents_list_names_main_first_then_configured_agents_and_those_with_sessions(settings):
    settings.OPENCLAW_AGENT = {**settings.OPENCLAW_AGENT, "MAX_STEPS_BY_AGENT": {"Reviewer": 3}}
    make("agent:ops:one")
    make("agent:ops:two")
    make("agent:main:work")
    roster = answer("agents.list")
    assert roster == {
        "defaultId": "main",
        "ownership": "sole",
        "selectionRequired": False,
        "mainKey": "main",
        "scope": "per-sender",
        "agents": [
            {"id": "main", "model": {"primary": "echo/echo"}},
            {"id": "ops", "model": {"primary": "echo/echo"}},
            {"id": "reviewer", "model": {"primary": "echo/echo"}},
        ],
    }
    reference = openclaw("agents.list")
    assert roster.keys() == reference.keys()
    assert roster["agents"][0].keys() <= reference["agents"][0].keys()


def test_agents_list_without_sessions_is_the_default_agent():
    assert [agent["id"] for agent in answer("agents.list")["agents"]] == ["main"]
    assert refusal("agents.list", {"agentId": "main"}) == (
        "INVALID_REQUEST",
        "invalid agents.list params: at /agentId: unexpected property",
    )


def test_agent_identity_is_openclaws_default_identity_of_the_agent_asked_for():
    # What OpenClaw's gateway answered for its unnamed main agent (tests/fixtures/openclaw_absent_features.json).
    assert answer("agent.identity.get", {"agentId": "main"}) == {
        "agentId": "main",
        "name": "Assistant",
        "nameSource": "default",
        "avatar": "A",
    }
    assert answer("agent.identity.get", {"agentId": "Ops"})["agentId"] == "ops"
    assert answer("agent.identity.get", {"sessionKey": "agent:ops:x"})["agentId"] == "ops"
    assert answer("agent.identity.get", {"sessionKey": ""})["agentId"] == "main"
    assert answer("agent.identity.get")["agentId"] == "main"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"agentId": ""}, "invalid agent.identity.get params: at /agentId: String should have at least 1 character"),
        ({"agentId": "no spaces"}, "invalid agentId: no spaces"),
        ({"sessionKey": "agent:x"}, "invalid session key: agent:x"),
        ({"name": "x"}, "invalid agent.identity.get params: at /name: unexpected property"),
    ],
)
def test_agent_identity_refuses_what_is_not_an_agent(params, message):
    assert refusal("agent.identity.get", params) == ("INVALID_REQUEST", message)


# --- models ------------------------------------------------------------------------------------------


def test_models_list_offers_the_configured_model_in_openclaws_shape(openai_model):
    listed = answer("models.list", {"view": "configured", "sessionKey": "agent:main:main", "agentId": "main"})
    assert listed == {
        "models": [{"id": "gpt-test", "name": "gpt-test", "provider": "openai", "tags": ["default"], "available": True}]
    }
    reference = openclaw("models.list")
    assert listed["models"][0].keys() <= reference["models"][0].keys()
    # The configured view of no session previews the default models, as OpenClaw's does.
    assert answer("models.list", {"view": "configured"})["defaultModels"] == reference["defaultModels"]
    assert "defaultModels" not in answer("models.list", {"agentId": "main"})
    assert answer("models.list", {"includeDefaultModels": True, "sessionKey": "main"})["defaultModels"] == {
        "automaticUtilityModel": None
    }
    assert answer("models.list", {"provider": "OpenAI", "refresh": True})["models"][0]["id"] == "gpt-test"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"provider": "anthropic"}, "unknown model provider: anthropic (this gateway's provider is echo)"),
        (
            {"preparedOnly": True, "refresh": True},
            "invalid models.list params: at /: preparedOnly and refresh cannot be combined",
        ),
        (
            {"sessionKey": "main", "authProfileId": "me"},
            "invalid models.list params: at /: sessionKey and authProfileId cannot be combined",
        ),
        (
            {"view": "everything"},
            "invalid models.list params: at /view: Input should be 'default', 'configured', 'provider-config' or 'all'",
        ),
        ({"agentId": ""}, "invalid models.list params: at /agentId: String should have at least 1 character"),
        ({"agentId": "a/b"}, "invalid agentId: a/b"),
        ({"limit": 5}, "invalid models.list params: at /limit: unexpected property"),
    ],
)
def test_models_list_refuses_params_outside_openclaws_schema(params, message):
    assert refusal("models.list", params) == ("INVALID_REQUEST", message)


def test_models_auth_status_says_where_the_key_comes_from_and_never_the_key(openai_model):
    status = answer("models.authStatus", {"agentId": "main", "refresh": True})
    assert status["providers"] == [
        {
            "provider": "openai",
            "authProvider": "openai",
            "displayName": "openai",
            "status": "static",
            "profiles": [],
            "apiKey": {"source": "env", "envVar": "OPENCLAW_MODEL_API_KEY"},
        }
    ]
    assert status["providerCapabilities"] == [] and isinstance(status["ts"], int)
    assert status["providers"][0].keys() <= {*openclaw("models.authStatus")["providers"][0], "apiKey"}
    assert SECRET_KEY not in json.dumps(status)


def test_models_auth_status_lists_no_provider_that_holds_no_key(openai_model, settings):
    settings.OPENCLAW_MODEL = {**openai_model, "API_KEY": ""}
    assert answer("models.authStatus", {"agentId": ""})["providers"] == []
    settings.OPENCLAW_MODEL = {**openai_model, "PROVIDER": "echo"}
    assert answer("models.authStatus")["providers"] == []
    assert refusal("models.authStatus", {"agentId": "a b"}) == ("INVALID_REQUEST", "invalid agentId: a b")
    assert refusal("models.authStatus", {"apiKey": "x"}) == (
        "INVALID_REQUEST",
        "invalid models.authStatus params: at /apiKey: unexpected property",
    )


# --- commands ----------------------------------------------------------------------------------------


def test_commands_list_lists_the_gateway_commands_in_openclaws_shape():
    listed = answer("commands.list", {"agentId": "main", "scope": "text", "includeArgs": False})["commands"]
    assert [command["name"] for command in listed] == ["help", "status", "new", "reset", "model"]
    assert listed[0] == {
        "name": "help",
        "textAliases": ["/help"],
        "description": "Show available commands.",
        "category": "status",
        "source": "native",
        "scope": "text",
        "acceptsArgs": False,
    }
    by_name = {command["name"]: command for command in openclaw("commands.list")["commands"]}
    for command in listed:
        assert command.keys() <= by_name[command["name"]].keys() | {"args"}
        assert (command["category"], command["acceptsArgs"]) == (
            by_name[command["name"]]["category"],
            by_name[command["name"]]["acceptsArgs"],
        )
    assert "args" not in listed[-1]
    # Arguments are described unless asked not to; "native" surfaces (channel command menus) have none here.
    model = answer("commands.list")["commands"][-1]
    assert model["args"] == [
        {
            "name": "model",
            "description": "provider/model, a model id of the configured provider, or default",
            "type": "string",
        }
    ]
    assert answer("commands.list", {"scope": "native", "provider": "discord"}) == {"commands": []}
    assert len(answer("commands.list", {"scope": "both", "sessionKey": "agent:main:main"})["commands"]) == len(
        GATEWAY_COMMANDS
    )


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"scope": "menu"}, "invalid commands.list params: at /scope: Input should be 'text', 'native' or 'both'"),
        (
            {"includeArgs": "maybe"},
            "invalid commands.list params: at /includeArgs: Input should be a valid boolean, unable to interpret input",
        ),
        ({"sessionKey": "agent::x"}, "invalid session key: agent::x"),
        ({"filter": "x"}, "invalid commands.list params: at /filter: unexpected property"),
    ],
)
def test_commands_list_refuses_params_outside_openclaws_schema(params, message):
    assert refusal("commands.list", params) == ("INVALID_REQUEST", message)


def test_chat_metadata_gives_models_and_commands_and_the_sessions_model_lock():
    make("agent:main:locked")
    Session.objects.filter(key="agent:main:locked").update(model_selection_locked=True)
    metadata = answer("chat.metadata", {"agentId": "main", "sessionKey": "agent:main:locked"})
    assert metadata["models"] == [
        {"id": "echo", "name": "echo", "provider": "echo", "tags": ["default"], "available": True}
    ]
    assert [command["name"] for command in metadata["commands"]] == ["help", "status", "new", "reset", "model"]
    assert metadata["commands"][-1]["args"][0]["name"] == "model"
    assert metadata["runtimeSelectionLocked"] is True
    assert metadata["swarmEnabled"] is False
    assert metadata["accountSelection"] == openclaw("chat.metadata")["accountSelection"]
    assert metadata.keys() == openclaw("chat.metadata").keys()
    make("agent:main:free")
    assert answer("chat.metadata", {"sessionKey": "free"})["runtimeSelectionLocked"] is False
    # A session that does not exist (yet) reads as a new chat.
    assert answer("chat.metadata", {"sessionKey": "agent:main:nope"})["runtimeSelectionLocked"] is False
    assert refusal("chat.metadata", {"sessionKey": "x", "authProfileId": "me"}) == (
        "INVALID_REQUEST",
        "invalid chat.metadata params: at /: sessionKey and authProfileId cannot be combined",
    )


# --- status and lanes --------------------------------------------------------------------------------


def test_status_counts_the_stored_sessions_and_shows_the_default_model_to_an_admin(openai_model):
    make("agent:main:a")
    make("agent:main:b", model="gpt-other")
    make("agent:ops:c")
    Session.objects.filter(key="agent:main:b").update(input_tokens=12, output_tokens=34)
    with CaptureQueriesContext(connection) as queries:
        admin = answer("status", {"includeChannelSummary": False}, scopes=[sc.ADMIN])
    # The core's one query, the apps' counts, and the admin's rows.
    assert len(queries) == 3
    assert admin["sessions"]["count"] == 3
    assert admin["sessions"]["paths"] == []
    assert admin["sessions"]["defaults"] == {"model": "gpt-test", "contextTokens": None}
    assert [row["key"] for row in admin["sessions"]["recent"]] == ["agent:ops:c", "agent:main:b", "agent:main:a"]
    recent_b = admin["sessions"]["recent"][1]
    assert (recent_b["model"], recent_b["inputTokens"], recent_b["outputTokens"], recent_b["agentId"]) == (
        "gpt-other",
        12,
        34,
        "main",
    )
    assert recent_b["age"] >= 0 and recent_b["flags"] == [f"id:{recent_b['sessionId']}"]
    by_agent = {entry["agentId"]: entry for entry in admin["sessions"]["byAgent"]}
    assert (by_agent["main"]["count"], by_agent["ops"]["count"]) == (2, 1)
    assert [row["key"] for row in by_agent["ops"]["recent"]] == ["agent:ops:c"]
    assert admin["heartbeat"] == {
        "defaultAgentId": "main",
        "agents": [
            {"agentId": agent, "enabled": False, "every": "disabled", "everyMs": None, "waitingForRoute": False}
            for agent in ("main", "ops")
        ],
    }
    reference = openclaw("status")
    assert admin.keys() >= reference.keys()
    assert admin["sessions"].keys() == reference["sessions"].keys()
    assert admin["heartbeat"]["agents"][0].keys() == reference["heartbeat"]["agents"][0].keys()
    assert admin["channelSummary"] == [] and admin["queuedSystemEvents"] == []
    assert SECRET_KEY not in json.dumps(admin)


def test_status_shows_a_reader_the_counts_only_as_openclaw_does():
    make("agent:main:a")
    reader = answer("status")
    assert reader["sessions"]["count"] == 1
    assert reader["sessions"]["defaults"] == {"model": None, "contextTokens": None}
    assert reader["sessions"]["recent"] == []
    assert reader["sessions"]["byAgent"] == [{"agentId": "main", "count": 1, "recent": []}]
    assert refusal("status", {"verbose": True}) == (
        "INVALID_REQUEST",
        "invalid status params: at /verbose: unexpected property",
    )


def test_diagnostics_lanes_counts_each_sessions_turns(monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)
    assert answer("diagnostics.lanes")["dynamic"] is None
    make("agent:main:busy")
    make("agent:main:waiting")
    runs.run_submit(session_key="agent:main:busy", message="one", idempotency_key="busy-1")
    runs.run_claim(run_id="busy-1", executor="test")
    runs.run_submit(session_key="agent:main:busy", message="two", idempotency_key="busy-2")
    runs.run_submit(session_key="agent:main:waiting", message="three", idempotency_key="waiting-1")
    lanes = answer("diagnostics.lanes")
    assert lanes["lanes"] == []
    assert lanes["dynamic"] == {"laneCount": 2, "activeCount": 1, "queuedCount": 2, "queuedLaneCount": 2}
    assert lanes.keys() == openclaw("diagnostics.lanes").keys()
    assert refusal("diagnostics.lanes", {"lane": "main"}) == (
        "INVALID_REQUEST",
        "invalid diagnostics.lanes params: at /lane: unexpected property",
    )
