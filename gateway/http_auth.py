"""Who may call the JSON API: the gateway's shared token (operators). A paired node's own device token,
on the routes that serve nodes, is devices_app's (``devices_app.http_auth``)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja.security import APIKeyHeader, HttpBearer

from . import scopes as sc
from .audit import Actor
from .auth import AUTH_REASON_CODES, NEXT_STEPS, secret_matches, shared_secret_limiter
from .conf import shared_token
from .exceptions import RateLimited

TOKEN_HEADER = "X-OpenClaw-Token"
RATE_LIMITED_MESSAGE = "unauthorized: too many failed authentication attempts (retry later)"


def _token_ok(request: HttpRequest, token: str | None) -> bool:
    """The shared token, with failures counted per client address in the limiter the socket's shared-secret connects
    use (one token, one guessing budget): a locked-out address is refused even with the right token. A success does
    not clear the count (that would cost every request a write); failures age out with their window."""
    if not token:
        return False
    address = request.META.get("REMOTE_ADDR")
    state = shared_secret_limiter.check(address)
    if not state.locked:
        expected = shared_token()
        if expected and secret_matches(token, expected):
            return True
        state = shared_secret_limiter.record_failure(address)
    if state.locked:
        raise RateLimited(
            RATE_LIMITED_MESSAGE,
            details={"code": AUTH_REASON_CODES["rate_limited"], "recommendedNextStep": NEXT_STEPS["rate_limited"]},
            retryable=True,
            retry_after_ms=state.retry_after_ms,
        )
    return False


class GatewayBearer(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        return "token" if _token_ok(request, token) else None


class GatewayTokenHeader(APIKeyHeader):
    param_name = TOKEN_HEADER

    def authenticate(self, request: HttpRequest, key: str | None):
        return "token" if _token_ok(request, key) else None


OPERATOR_AUTH = [GatewayBearer(), GatewayTokenHeader()]


def bearer_token(scope: dict[str, Any]) -> str | None:
    """The ``Authorization: Bearer`` credential of a plain ASGI request (the routes served beside Django), or None."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return None
            return token.strip()
    return None


def request_actor(request: HttpRequest) -> Actor:
    """Who a JSON API change is audited as: the logged-in user, else the gateway token. Either way it acts
    with the token's rights (a full operator): the token is what authenticated the request."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return Actor.for_user(user, scopes=(sc.ADMIN,))
    return Actor.system("api:token")
