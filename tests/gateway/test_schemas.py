"""Limits of what callers send to the gateway core's methods are in their schemas, checked first."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from devices_app.schemas import RequestIdParams, TokenRotateParams
from gateway.schemas import MAX_SCOPES, NodeInvokeParams


@pytest.mark.parametrize(
    "params",
    [
        {"deviceId": "d" * 201, "role": "operator"},
        {"deviceId": "d", "role": "r" * 65},
        {"deviceId": "d", "role": "operator", "scopes": ["operator.read"] * (MAX_SCOPES + 1)},
        {"deviceId": "d", "role": "operator", "scopes": ["s" * 65]},
    ],
)
def test_token_rotation_refuses_oversized_ids_roles_and_scope_lists(params):
    with pytest.raises(ValidationError):
        TokenRotateParams.model_validate(params)


def test_node_invoke_bounds_what_it_forwards_and_dedupes_on():
    base = {"nodeId": "n", "command": "echo", "idempotencyKey": "k"}
    NodeInvokeParams.model_validate(base)
    for oversized in ({"idempotencyKey": "k" * 201}, {"command": "c" * 201}, {"timeoutMs": 24 * 3600 * 1000 + 1}):
        with pytest.raises(ValidationError):
            NodeInvokeParams.model_validate({**base, **oversized})


def test_request_ids_are_bounded():
    RequestIdParams.model_validate({"requestId": "r" * 200})
    with pytest.raises(ValidationError):
        RequestIdParams.model_validate({"requestId": "r" * 201})
