"""Every gateway method this gateway serves, walked against OpenClaw's own tables (read from its package by
tests/fixtures/make_openclaw_method_fixtures.mjs): each param OpenClaw's schema defines is accepted, a key it does
not define is refused by name, and each method asks for OpenClaw's least-privilege scope, the params-dependent
ones (sessions.patch, sessions.create, sessions.delete) for the params that need more."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gateway import scopes as sc
from gateway.registry import registry
from sessions_app.services import creation, sessions
from tests.support.connections import dispatched
from tests.support.processes import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
OPENCLAW_PARAMS = json.loads((FIXTURES / "openclaw_method_params.json").read_text())["methods"]
OPENCLAW_SCOPES = json.loads((FIXTURES / "openclaw_method_scopes.json").read_text())["methods"]

# This gateway's own params beside OpenClaw's (docs/gateway-protocol.md, "OpenClaw's params"): keyset pages and the
# row revision guard, and the environments' prepared details.
OWN_PARAMS = {
    "sessions.list": {"cursor"},
    "sessions.subscribe": {"cursor"},
    "sessions.patch": {"displayName", "expectedRevision"},
    "sessions.reset": {"expectedLifecycleRevision", "expectedRevision"},
    "sessions.delete": {"expectedRevision"},
    "environments.list": {"includePreparedDetails"},
    "environments.status": {"includePreparedDetails"},
}
# Methods served here that are not OpenClaw's.
OWN_METHODS = {"sessions.adopt", "sessions.unsubscribe"}
# OpenClaw's params-dependent scopes that a handler here enforces itself (with OpenClaw's own refusal), or that ask
# less here because what needs more in OpenClaw does nothing here.
SCOPE_IN_HANDLER = {
    # workers_app/operations.py: a profile (Cloud) dispatch or move needs operator.admin (FORBIDDEN otherwise).
    "sessions.dispatch",
    "sessions.move",
    # gateway/invoke.py: browser.proxy needs operator.admin; OpenClaw's other admin-only node commands
    # (fs.listDir, terminal.upload) are not node commands here.
    "node.invoke",
    # runtimeId prepares an environment runtime in OpenClaw; here it selects nothing (the list is read only).
    "environments.list",
}
# `health` answers every authenticated connection here, nodes included (OpenClaw: operator.read); the reference's
# comparison calls that fine (../shared/spec/reference/openclaw-clients.md §4.9).
SCOPE_DIFFERENCES = {"health": None}


def served() -> set[str]:
    return set(registry.methods) - OWN_METHODS


def test_the_fixtures_name_every_method_served_here():
    assert served() == set(OPENCLAW_PARAMS) == set(OPENCLAW_SCOPES)


@pytest.mark.parametrize("method", sorted(name for name, entry in OPENCLAW_PARAMS.items() if entry["params"]))
def test_every_param_of_openclaws_schema_is_accepted(method):
    spec = registry.methods[method]
    fields = {field.alias or name for name, field in spec.params.model_fields.items()}
    openclaw = set(OPENCLAW_PARAMS[method]["params"])

    assert openclaw <= fields, f"{method} refuses OpenClaw's {sorted(openclaw - fields)}"
    assert fields - openclaw == OWN_PARAMS.get(method, set())
    for param in openclaw:
        # Whatever the value, the key itself is never refused as unknown.
        for value in (True, "x", 1, None):
            try:
                spec.params.model_validate({param: value})
            except ValidationError as refused:
                assert not [error for error in refused.errors() if error["type"] == "extra_forbidden"], (method, param)


@pytest.mark.parametrize("method", sorted(name for name in served() if registry.methods[name].role == "operator"))
def test_an_unknown_key_is_refused_by_name(method):
    response = dispatched(method, {"notAnOpenClawParam": 1}, scopes=[sc.ADMIN])

    assert response["ok"] is False
    assert response["error"]["code"] == "INVALID_REQUEST"
    assert response["error"]["message"].startswith(f"invalid {method} params: ")
    assert "at /notAnOpenClawParam: unexpected property" in response["error"]["message"]


@pytest.mark.parametrize(
    "method",
    sorted(name for name in served() if registry.methods[name].role == "node" and OPENCLAW_PARAMS[name]["params"]),
)
def test_a_node_methods_unknown_key_is_refused_too(method):
    with pytest.raises(ValidationError) as refused:
        registry.methods[method].params.model_validate({"notAnOpenClawParam": 1})

    assert any(error["type"] == "extra_forbidden" for error in refused.value.errors())


@pytest.mark.parametrize("method", sorted(OPENCLAW_SCOPES))
def test_each_method_asks_openclaws_least_privilege_scope(method):
    spec = registry.methods[method]
    expected = OPENCLAW_SCOPES[method]["scope"]

    if expected == "node role":
        assert spec.role == "node"
    elif method in SCOPE_DIFFERENCES:
        assert (spec.role, spec.scope) == ("operator", SCOPE_DIFFERENCES[method])
    else:
        assert (spec.role, spec.scope) == ("operator", expected)


PARAMS_CASES = [
    (method, case["params"], case["scope"])
    for method, entry in sorted(OPENCLAW_SCOPES.items())
    if method not in SCOPE_IN_HANDLER
    for case in entry.get("cases", [])
]


@pytest.mark.parametrize(("method", "params", "scope"), PARAMS_CASES)
def test_a_params_dependent_scope_is_openclaws(method, params, scope):
    spec = registry.methods[method]

    assert spec.required_scope(spec.params.model_validate(params)) == scope


def test_the_walk_covers_the_params_dependent_methods():
    dependent = {name for name, spec in registry.methods.items() if spec.params_scope is not None}
    assert dependent == {"sessions.patch", "sessions.create", "sessions.delete"}
    assert {method for method, _, _ in PARAMS_CASES} == dependent


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("sessions.patch", {"key": "agent:main:main", "verboseLevel": "on"}),
        ("sessions.patch", {"key": "agent:main:main", "permissionMode": "full"}),
        ("sessions.patch", {"key": "agent:main:main", "label": "x", "sandboxMode": "off"}),
        ("sessions.create", {"key": "agent:main:n", "execNode": "node-1"}),
        ("sessions.delete", {"key": "agent:main:main"}),
        ("sessions.delete", {"key": "agent:main:main", "archivedOnly": True, "expectedRevision": 1}),
    ],
)
def test_a_write_scope_client_is_refused_what_needs_admin_and_nothing_runs(monkeypatch, method, params):
    def must_not_run(**kwargs):
        raise AssertionError("the service ran")

    for module, name in (
        (sessions, "session_patch"),
        (sessions, "session_delete"),
        (creation, "session_create_requested"),
    ):
        monkeypatch.setattr(module, name, must_not_run)

    response = dispatched(method, params, scopes=[sc.WRITE])

    assert response["ok"] is False
    assert response["error"] == {
        "code": "INVALID_REQUEST",
        "message": "missing scope: operator.admin",
        "details": {"code": "MISSING_SCOPE", "missingScope": sc.ADMIN, "requiredScopes": [sc.ADMIN]},
    }


def test_a_read_scope_client_is_refused_a_patch_before_its_params_are_read():
    """The least privilege (operator.write) comes first: bad params or not, a reader learns only the scope."""
    response = dispatched("sessions.patch", {"key": "agent:main:main", "label": 5}, scopes=[sc.READ])

    assert (response["ok"], response["error"]["message"]) == (False, "missing scope: operator.write")


def test_bad_params_of_a_params_dependent_method_are_refused_as_params():
    response = dispatched("sessions.patch", {"key": "agent:main:main", "ttlMinutes": 0}, scopes=[sc.ADMIN])

    assert response["error"]["code"] == "INVALID_REQUEST"
    assert response["error"]["message"].startswith("invalid sessions.patch params: at /ttlMinutes: ")


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        (
            "exec.approval.resolve",
            {"id": "a1", "decision": "allow-always", "grantExpiresInDays": 30},
            "allow-always entries do not expire here; grantExpiresInDays is not supported",
        ),
        (
            "exec.approval.resolve",
            {"id": "a1", "decision": "deny", "grantExpiresInDays": 0},
            "at /grantExpiresInDays: ",
        ),
        ("exec.approval.resolve", {"id": "a1", "decision": "deny", "reviewer": {"channel": "x"}}, "at /reviewer/"),
        (
            "exec.approvals.node.set",
            {"nodeId": "n1", "file": {"version": 1}, "native": {"rules": []}},
            "native exec approvals (OpenClaw's macOS app nodes) are not kept here; send file",
        ),
        ("exec.approval.request", {"command": "ls", "unavailableDecisions": ["deny"]}, "at /unavailableDecisions/0: "),
        ("sessions.usage", {"creatorKey": ""}, "at /creatorKey: "),
    ],
)
def test_bad_or_unkeepable_openclaw_params_are_refused_by_name(method, params, message):
    response = dispatched(method, params, scopes=[sc.ADMIN])

    assert response["ok"] is False and response["error"]["code"] == "INVALID_REQUEST"
    assert response["error"]["message"].startswith(f"invalid {method} params: ")
    assert message in response["error"]["message"]
