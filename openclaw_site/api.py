"""The single NinjaAPI: one router per app, token auth, errors mapped from the shared hierarchy."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import NinjaAPI
from ninja.errors import ValidationError
from ninja.security import APIKeyHeader, HttpBearer

from openclaw_site.gateway.api import router as gateway_router
from openclaw_site.gateway.auth import secret_matches
from openclaw_site.gateway.conf import shared_token
from openclaw_site.gateway.exceptions import GatewayError
from sessions_app.api import router as sessions_router


def _token_ok(token: str | None) -> bool:
    expected = shared_token()
    return bool(token and expected and secret_matches(token, expected))


class GatewayBearer(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        return "token" if _token_ok(token) else None


class GatewayTokenHeader(APIKeyHeader):
    param_name = "X-OpenClaw-Token"

    def authenticate(self, request: HttpRequest, key: str | None):
        return "token" if _token_ok(key) else None


api = NinjaAPI(
    title="OpenClaw gateway API",
    version="1",
    auth=[GatewayBearer(), GatewayTokenHeader()],
    urls_namespace="api",
)
api.add_router("/gateway", gateway_router)
api.add_router("/sessions", sessions_router)


@api.exception_handler(GatewayError)
def gateway_error(request: HttpRequest, exc: GatewayError):
    return api.create_response(request, {"error": exc.to_shape()}, status=exc.http_status)


@api.exception_handler(ValidationError)
def validation_error(request: HttpRequest, exc: ValidationError):
    """Bad input has the same error shape as every other error (INVALID_REQUEST, 400)."""
    problems = "; ".join(
        f"at /{'/'.join(str(part) for part in item.get('loc', ())[1:])}: {item.get('msg', 'invalid')}"
        for item in exc.errors
    )
    shape = {"code": "INVALID_REQUEST", "message": f"invalid request: {problems}", "details": {"errors": exc.errors}}
    return api.create_response(request, {"error": shape}, status=400)
