"""The JSON API against its own OpenAPI document, on a live gateway (Daphne, the real middleware chain).

Schemathesis reads ``/api/openapi.json`` from the running gateway and sends, for every operation,
generated requests with the gateway token: valid and invalid bodies, query strings and path
parameters, and the boundary values of every declared limit. Each answer must not be a server error
(5xx), must have a status the operation documents, and must match the schema documented for it.

The database holds real objects first (:func:`seeded`) — sessions with turns, a failed placement, a
worker environment, pairing requests, a paired node and a device with tokens — and about half of the
generated ids are theirs, so the success answers are checked on real rows, not only the 404s.

The run is bounded and repeatable: a fixed seed, derandomized generation, a few examples per
operation, no example database. The gateway is a process of this test alone (stopped before the
test database is flushed), so whatever the generated requests create or destroy cannot reach
another test; nor can it break this one, which authenticates with the gateway token no route can
change.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.utils import timezone
from schemathesis import Config

from devices_app.models import DeviceToken, PairedDevice
from devices_app.services import pairing
from gateway import scopes as sc
from gateway.auth import hash_device_token
from tests.sessions_app.test_api import finished_turn, make
from tests.workers_app.test_rpc import failed_without_environment
from workers_app.models import WorkerEnvironment

# About a minute: in the README's test command (PostgreSQL + Redis), left out of CI's second, embedded pass.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "harness"]),
]

EXAMPLES_PER_OPERATION = 12
CHECKS = ("not_a_server_error", "status_code_conformance", "response_schema_conformance")
# How often a generated path id (or session filter) is one of the seeded objects'.
KNOWN_ID_PROBABILITY = 0.5


def _device(n: int, roles: list[str]) -> PairedDevice:
    device = PairedDevice.objects.create(
        device_id=f"{n:064x}",
        public_key=f"pk-{n}",
        display_name=f"Contract {n}",
        platform="linux",
        roles=roles,
        approved_scopes=[sc.READ, sc.WRITE] if sc.ROLE_OPERATOR in roles else [],
        approved_at=timezone.now(),
    )
    for role in roles:
        DeviceToken.objects.create(device=device, role=role, token_hash=hash_device_token(f"secret-{n}-{role}"))
    return device


def _request(n: int, role: str) -> str:
    claim = pairing.PairingClaim(
        device_id=f"{n:064x}",
        public_key=f"pk-{n}",
        role=role,
        scopes=[sc.READ] if role == sc.ROLE_OPERATOR else [],
        reason="not-paired",
        is_repair=False,
        display_name=f"Contract {n}",
        platform="linux",
        commands=["echo"] if role == sc.ROLE_NODE else [],
    )
    request, _ = pairing.pairing_request_ensure(claim=claim)
    return str(request.pk)


@pytest.fixture
def seeded() -> dict[str, list[str]]:
    """Real objects of every kind the API serves, by the id its routes take."""
    chatty = make("agent:main:contract")
    finished_turn(chatty, "contract-run-1", "one", "ONE")
    finished_turn(chatty, "contract-run-2", "two", "TWO")
    failed_without_environment(make("agent:main:contract-failed"))
    WorkerEnvironment.objects.create(
        environment_id="worker:contract",
        provider_id="static-ssh",
        profile_id="contract",
        state="failed",
        last_error="bootstrap failed",
        attached_session_ids=[],
        created_at_ms=1,
        updated_at_ms=1,
        state_changed_at_ms=1,
    )
    node = _device(1, [sc.ROLE_NODE])
    operator = _device(2, [sc.ROLE_OPERATOR])
    return {
        "sessions": ["agent:main:contract", "agent:main:contract-failed", "contract"],
        "runs": ["contract-run-1", "contract-run-2"],
        "environments": ["worker:contract"],
        "nodes": [node.device_id, f"{3:064x}"],
        "devices": [operator.device_id, node.device_id],
        "requests": [_request(3, sc.ROLE_NODE), _request(4, sc.ROLE_OPERATOR)],
    }


@pytest.fixture
def contract_gateway(gateway_factory):
    return gateway_factory()


@pytest.fixture
def api_schema(contract_gateway, seeded):
    bindings = {
        "path.key": "sessions",
        "query.sessionKey": "sessions",
        "path.runId": "runs",
        "path.environmentId": "environments",
        "path.nodeId": "nodes",
        "path.deviceId": "devices",
        "path.requestId": "requests",
    }
    config = Config.from_dict(
        {
            "headers": {"Authorization": f"Bearer {contract_gateway.token}"},
            "request-timeout": 30,
            "seed": 20251201,
            "generation": {
                "max-examples": EXAMPLES_PER_OPERATION,
                "deterministic": True,
                "database": "none",
            },
            "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
            "phases": {"stateful": {"enabled": False}},
            "dictionaries": {name: {"values": values} for name, values in seeded.items()},
            "parameters": {
                parameter: {"dictionary": name, "probability": KNOWN_ID_PROBABILITY}
                for parameter, name in bindings.items()
            },
        }
    )
    return schemathesis.openapi.from_url(f"{contract_gateway.http_url}/api/openapi.json", config=config)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
def test_every_operation_answers_as_documented(case):
    case.call_and_validate()
