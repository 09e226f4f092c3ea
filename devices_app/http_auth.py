"""A paired node's own device token on the JSON API routes that serve nodes (the worker bundle)."""

from __future__ import annotations

from django.http import HttpRequest
from ninja.security import HttpBearer

from gateway.auth import hash_device_token
from gateway.http_auth import OPERATOR_AUTH
from gateway.scopes import ROLE_NODE

from .models import DeviceToken


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


NODE_OR_OPERATOR_AUTH = [*OPERATOR_AUTH, NodeDeviceBearer()]
