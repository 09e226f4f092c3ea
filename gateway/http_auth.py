"""Who may call the JSON API: the gateway's shared token (operators), and — on the routes that serve
nodes, such as the worker bundle — a paired node's own device token."""

from __future__ import annotations

from django.http import HttpRequest
from ninja.security import APIKeyHeader, HttpBearer

from .audit import Actor
from .auth import hash_device_token, secret_matches
from .conf import shared_token
from .models import DeviceToken
from .scopes import ROLE_NODE

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


class NodeDeviceBearer(HttpBearer):
    """``Authorization: Bearer <device token>`` of a paired node (its live, unrevoked node-role token)."""

    def authenticate(self, request: HttpRequest, token: str):
        if not token:
            return None
        found = (
            DeviceToken.objects.filter(
                token_hash=hash_device_token(token), role=ROLE_NODE, revoked_at__isnull=True, device__is_node=True
            )
            .values_list("device_id", flat=True)
            .first()
        )
        return f"node:{found}" if found else None


OPERATOR_AUTH = [GatewayBearer(), GatewayTokenHeader()]
NODE_OR_OPERATOR_AUTH = [GatewayBearer(), GatewayTokenHeader(), NodeDeviceBearer()]


def request_actor(request: HttpRequest) -> Actor:
    """Who a JSON API change is audited as: the logged-in user, else the gateway token (a full operator)."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return Actor.for_user(user)
    return Actor.system("api:token")
