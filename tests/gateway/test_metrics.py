"""The gateway's instruments move where they should, with bounded labels, and not at all when metrics are off."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from gateway import metrics
from gateway.auth import AuthRateLimiter, auth_failure, verify_device_proof
from gateway.dispatch import run_request
from gateway.exceptions import HandshakeRejected, InvalidRequest, NotFound, NotPaired
from gateway.handshake import failure_reason, parse_connect
from gateway.protocol import ConnectParams, RequestFrame
from gateway.registry import EmptyParams, MethodSpec, registry
from tests.support.connections import admin_operator_context

# The calls by method and outcome: the count of the latency histogram.
CALLS = "openclaw_rpc_duration_seconds_count"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def label_values(family: str, label: str) -> set[str]:
    return {
        sample.labels[label]
        for metric in REGISTRY.collect()
        if metric.name == family
        for sample in metric.samples
        if label in sample.labels
    }


@pytest.fixture
def methods(monkeypatch):
    async def answers(ctx, params):
        return {"fine": True}

    async def refuses(ctx, params):
        raise NotFound("no such thing")

    for name, handler in (("test.metrics.ok", answers), ("test.metrics.fails", refuses)):
        spec = MethodSpec(name=name, handler=handler, params=EmptyParams, role="operator", scope=None, is_async=True)
        monkeypatch.setitem(registry.methods, name, spec)


def call(method: str, request_id: str = "r1") -> dict:
    return asyncio.run(run_request(admin_operator_context(), RequestFrame(type="req", id=request_id, method=method)))


def test_an_answered_call_counts_as_ok_with_its_latency(methods):
    calls_before = sample(CALLS, method="test.metrics.ok", outcome="ok")
    timed_before = sample("openclaw_rpc_duration_seconds_sum", method="test.metrics.ok", outcome="ok")

    assert call("test.metrics.ok")["ok"] is True

    assert sample(CALLS, method="test.metrics.ok", outcome="ok") == calls_before + 1
    assert sample("openclaw_rpc_duration_seconds_sum", method="test.metrics.ok", outcome="ok") > timed_before


def test_a_refused_call_counts_under_its_error_code(methods):
    before = sample(CALLS, method="test.metrics.fails", outcome="INVALID_REQUEST")
    ok_before = sample(CALLS, method="test.metrics.fails", outcome="ok")

    response = call("test.metrics.fails")

    assert response["error"]["code"] == "INVALID_REQUEST"
    assert sample(CALLS, method="test.metrics.fails", outcome="INVALID_REQUEST") == before + 1
    assert sample(CALLS, method="test.metrics.fails", outcome="ok") == ok_before


def test_unknown_methods_share_one_label_value(methods):
    call("no.such.method.one")  # the first unknown call may create the "unknown" series
    methods_seen = label_values("openclaw_rpc_duration_seconds", "method")
    before = sample(CALLS, method="unknown", outcome="INVALID_REQUEST")

    for n in range(5):
        assert call(f"made.up.{n}")["error"]["message"] == f"unknown method: made.up.{n}"

    assert label_values("openclaw_rpc_duration_seconds", "method") == methods_seen
    assert "unknown" in methods_seen and not any(m.startswith(("made.up", "no.such")) for m in methods_seen)
    assert sample(CALLS, method="unknown", outcome="INVALID_REQUEST") == before + 5


def test_nothing_is_recorded_when_metrics_are_off(methods, settings):
    settings.OPENCLAW_METRICS_ENABLED = False
    before = sample(CALLS, method="test.metrics.ok", outcome="ok")
    lockouts = sample("openclaw_auth_lockouts_total", limiter="shared-secret")

    assert call("test.metrics.ok")["ok"] is True
    metrics.record_auth_lockout("shared-secret")
    metrics.connection_opened("operator")

    assert sample(CALLS, method="test.metrics.ok", outcome="ok") == before
    assert sample("openclaw_auth_lockouts_total", limiter="shared-secret") == lockouts


def test_a_bounded_label_admits_its_limit_then_answers_other():
    label = metrics.BoundedLabel(2)
    assert [label("a"), label("b"), label("c"), label("a"), label(""), label(None)] == [
        "a",
        "b",
        "other",
        "a",
        "unknown",
        "unknown",
    ]


def test_a_handshake_failure_is_named_by_its_detail_code_else_its_error_code():
    with pytest.raises(HandshakeRejected) as mismatch:
        parse_connect(
            {"type": "req", "id": "c", "method": "connect", "params": {**connect_params(), "minProtocol": 99}}
        )
    with pytest.raises(HandshakeRejected) as not_connect:
        parse_connect({"type": "req", "id": "c", "method": "health"})

    assert failure_reason(mismatch.value.error) == "protocol_mismatch"
    assert failure_reason(not_connect.value.error) == "invalid_request"
    assert failure_reason(NotPaired("pairing required", details={"code": "PAIRING_REQUIRED"})) == "pairing_required"
    assert failure_reason(InvalidRequest("x", details={"code": 7})) == "invalid_request"


def connect_params(**auth) -> dict:
    return {
        "minProtocol": 3,
        "maxProtocol": 3,
        "client": {"id": "cli", "version": "1", "platform": "linux", "mode": "cli"},
        **({"auth": auth} if auth else {}),
    }


def test_refused_credentials_count_by_reason():
    params = ConnectParams.model_validate(connect_params(token="wrong"))
    with_device = ConnectParams.model_validate(
        {
            **connect_params(),
            "device": {"id": "not-derived-from-the-key", "publicKey": "k", "signature": "s", "signedAt": 0},
        }
    )
    mismatch = sample("openclaw_auth_failures_total", reason="token_mismatch")
    identity = sample("openclaw_auth_failures_total", reason="device-id-mismatch")

    auth_failure("token_mismatch", params=params, local=True)
    with pytest.raises(InvalidRequest, match="device identity mismatch"):
        verify_device_proof(with_device, role="operator", scopes=[], nonce="n")

    assert sample("openclaw_auth_failures_total", reason="token_mismatch") == mismatch + 1
    assert sample("openclaw_auth_failures_total", reason="device-id-mismatch") == identity + 1


def test_a_lockout_counts_once_when_it_locks(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "metrics"}}
    config = {"MAX_FAILURES": 3, "WINDOW_MS": 60_000, "LOCKOUT_MS": 300_000, "EXEMPT_LOOPBACK": False}
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "AUTH_RATE_LIMIT": config}
    limiter = AuthRateLimiter("test-limiter")
    # The label this scope has in this process: "other" once earlier tests' limiters filled the bounded set.
    label = metrics.limiter_label("test-limiter")
    before = sample("openclaw_auth_lockouts_total", limiter=label)

    states = [limiter.record_failure("198.51.100.7").locked for _ in range(5)]

    assert states == [False, False, True, True, True]
    assert sample("openclaw_auth_lockouts_total", limiter=label) == before + 1
