"""Who may call the JSON API: the gateway's shared token (operators). A paired node's own device token,
on the routes that serve nodes, is devices_app's (``devices_app.http_auth``)."""

from __future__ import annotations

from django.http import HttpRequest
from ninja.security import APIKeyHeader, HttpBearer

from . import scopes as sc
from .audit import Actor
from .auth import secret_matches
from .conf import shared_token

TOKEN_HEADER = "X-OpenClaw-Token"


def _token_ok(token: str | None) -> bool:
    expected = shared_token()
    return bool(token and expected and secret_matches(token, expected))


class GatewayBearer(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        return "token" if _token_ok(token) else None


class GatewayTokenHeader(APIKeyHeader):
    param_name = TOKEN_HEADER

    def authenticate(self, request: HttpRequest, key: str | None):
        return "token" if _token_ok(key) else None


OPERATOR_AUTH = [GatewayBearer(), GatewayTokenHeader()]


def request_actor(request: HttpRequest) -> Actor:
    """Who a JSON API change is audited as: the logged-in user, else the gateway token. Either way it acts
    with the token's rights (a full operator): the token is what authenticated the request."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return Actor.for_user(user, scopes=(sc.ADMIN,))
    return Actor.system("api:token")
