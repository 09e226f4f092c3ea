"""One access line per HTTP request and per RPC call: what was asked and how it ended, never what was sent."""

from __future__ import annotations

import asyncio
import logging

import pytest
from django.test import AsyncClient, Client, RequestFactory, override_settings

from gateway import scopes as sc
from gateway.access_log import RequestLogMiddleware
from gateway.context import RpcContext
from gateway.dispatch import run_request
from gateway.protocol import RequestFrame
from tests.support.api import API_TOKEN

SECRET = "sk-live-very-secret-value"


def operator(*scopes: str, device_id: str | None = "device-1") -> RpcContext:
    return RpcContext(
        conn_id="conn-1",
        channel_name="inmemory!conn-1",
        role=sc.ROLE_OPERATOR,
        scopes=list(scopes),
        auth_method="token",
        client_id="test",
        client_mode="test",
        device_id=device_id,
    )


def call(ctx: RpcContext, method: str, params, frame_id: str = "frame-1") -> dict:
    return asyncio.run(run_request(ctx, RequestFrame(type="req", id=frame_id, method=method, params=params)))


@pytest.mark.django_db(transaction=True)
def test_an_rpc_call_logs_its_method_outcome_and_duration_and_never_its_params(json_log):
    admin = operator(sc.ADMIN)

    refused = call(admin, "logs.tail", {"limit": 5, "token": SECRET}, frame_id="f-refused")
    answered = call(admin, "chat.history", {"sessionKey": f"agent:main:{SECRET}"}, frame_id="f-answered")
    unknown = call(admin, "no.such.method", {"message": SECRET}, frame_id="f-unknown")
    forbidden = call(operator(sc.READ), "exec.approvals.get", {"password": SECRET}, frame_id="f-forbidden")

    assert not refused["ok"] and not unknown["ok"] and not forbidden["ok"]
    lines = json_log.lines("openclaw.access.rpc")
    assert [(line["method"], line["outcome"], line["request_id"], line["device_id"]) for line in lines] == [
        ("logs.tail", "INVALID_REQUEST", "f-refused", "device-1"),
        ("chat.history", "ok" if answered["ok"] else answered["error"]["code"], "f-answered", "device-1"),
        ("no.such.method", "INVALID_REQUEST", "f-unknown", "device-1"),
        ("exec.approvals.get", "INVALID_REQUEST", "f-forbidden", "device-1"),
    ]
    assert all(isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0 for line in lines)
    assert lines[0]["message"].startswith("logs.tail INVALID_REQUEST ")
    assert SECRET not in json_log.text


@pytest.mark.django_db(transaction=True)
def test_a_call_of_a_connection_without_a_device_names_none(json_log):
    call(operator(sc.ADMIN, device_id=None), "health", {}, frame_id="f-health")

    (line,) = json_log.lines("openclaw.access.rpc")
    assert (line["method"], line["outcome"], line["request_id"]) == ("health", "ok", "f-health")
    assert "device_id" not in line


@pytest.mark.django_db
def test_an_http_request_logs_method_path_status_and_duration_without_query_headers_or_cookies(json_log, api_token):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {API_TOKEN}")
    client.cookies["sessionid"] = SECRET

    response = client.get(f"/api/gateway/nodes?token={SECRET}&x=1", HTTP_X_OPENCLAW_TOKEN=SECRET)

    (line,) = json_log.lines("openclaw.access.http")
    assert (line["method"], line["path"], line["status"]) == ("GET", "/api/gateway/nodes", response.status_code)
    assert line["duration_ms"] >= 0
    assert line["request_id"] == response["X-Request-ID"]
    assert SECRET not in json_log.text and API_TOKEN not in json_log.text


@pytest.mark.django_db
@override_settings(ROOT_URLCONF="tests.gateway.log_probe_urls")
def test_lines_logged_during_a_request_carry_its_request_id(json_log):
    client = Client(raise_request_exception=False)

    answered = client.get("/probe/logs", HTTP_X_REQUEST_ID="proxy-req-42")
    failed = client.get("/probe/fails")

    assert answered.status_code == 200 and answered["X-Request-ID"] == "proxy-req-42"
    (view_line,) = json_log.lines("openclaw.test.probe")
    assert view_line["request_id"] == "proxy-req-42"
    (error_line,) = json_log.lines("django.request")
    assert error_line["level"] == "ERROR" and error_line["request_id"] == failed["X-Request-ID"] != "proxy-req-42"
    assert "RuntimeError: the view failed" in error_line["exc_info"]
    assert [(line["path"], line["status"]) for line in json_log.lines("openclaw.access.http")] == [
        ("/probe/logs", 200),
        ("/probe/fails", 500),
    ]


@pytest.mark.django_db
def test_a_request_id_that_is_not_a_plain_token_is_replaced(json_log):
    response = Client().get("/api/gateway/health", HTTP_X_REQUEST_ID="bad id\u00e9 with spaces")

    assert response["X-Request-ID"] != "bad id\u00e9 with spaces"
    assert len(response["X-Request-ID"]) == 32
    (line,) = json_log.lines("openclaw.access.http")
    assert line["request_id"] == response["X-Request-ID"]


@pytest.mark.django_db(transaction=True)
def test_the_async_request_path_logs_the_same_line(json_log):
    response = asyncio.run(AsyncClient().get(f"/api/gateway/health?token={SECRET}"))

    (line,) = json_log.lines("openclaw.access.http")
    assert (line["path"], line["status"], line["request_id"]) == (
        "/api/gateway/health",
        200,
        response["X-Request-ID"],
    )
    assert SECRET not in json_log.text


def test_a_request_whose_client_left_first_is_logged_as_499_not_as_a_failure(json_log):
    """Django cancels an async view when its client disconnects (a load balancer's health check timing out)."""

    async def abandoned(request):
        raise asyncio.CancelledError

    middleware = RequestLogMiddleware(abandoned)
    request = RequestFactory().get("/readyz")

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(middleware(request))

    (line,) = json_log.lines("openclaw.access.http")
    assert (line["path"], line["status"]) == ("/readyz", 499)


@pytest.mark.django_db
def test_the_access_loggers_can_be_silenced_on_their_own(json_log):
    access = logging.getLogger("openclaw.access.http")
    access.setLevel(logging.WARNING)
    try:
        Client().get("/api/gateway/health")
    finally:
        access.setLevel(logging.NOTSET)
    assert json_log.lines("openclaw.access.http") == []
