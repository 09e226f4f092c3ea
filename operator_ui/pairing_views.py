"""The console's pairing page: operator devices asking to pair, paired devices and their tokens.

For logins holding ``operator.pairing``, as ``device.pair.*`` and ``device.token.*`` ask on the wire. Reads go
through the selector behind ``device.pair.list``; every action calls the service behind its RPC
(``device.pair.approve|reject|remove``, ``device.token.rotate|revoke``) with the logged-in user as the
actor, so the service writes the audit row and its refusal is shown word for word. Destructive
actions (remove a device, revoke or rotate a token) ask first on a page of their own: a GET never
changes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST
from pydantic import ValidationError

from devices_app import selectors as device_selectors
from devices_app.schemas import DeviceIdParams, RequestIdParams, TokenRevokeParams
from devices_app.services import pairing as pairing_services
from devices_app.services import tokens as token_services
from gateway import scopes
from gateway import selectors as gateway_selectors
from gateway.audit import Actor
from gateway.exceptions import GatewayError

from .access import operator_required
from .views import _refusal

# The gateway events after which the page's parts are fetched again (``console.js``).
LIVE_EVENTS = ("device.pair.requested", "device.pair.resolved", "node.pair.requested", "node.pair.resolved")


def _when(ms: int | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, tz=UTC) if ms is not None else None


@dataclass
class TokenRow:
    role: str
    scopes: list[str] = field(default_factory=list)
    state: str = "none"  # active, revoked, or none (the role was approved, no token issued yet)
    created_at: datetime | None = None
    rotated_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None


@dataclass
class DeviceRow:
    device_id: str
    label: str
    roles: list[str]
    scopes: list[str]
    platform: str
    client: str
    connected: bool
    last_seen_at: datetime | None
    last_seen_reason: str
    approved_at: datetime | None
    tokens: list[TokenRow]


def _device_row(shape: dict) -> DeviceRow:
    """The ``device.pair.list`` entry of a device, with a row per role (a role without a token yet too)."""
    by_role = {
        summary["role"]: TokenRow(
            role=summary["role"],
            scopes=summary.get("scopes", []),
            state="revoked" if summary.get("revokedAtMs") else "active",
            created_at=_when(summary.get("createdAtMs")),
            rotated_at=_when(summary.get("rotatedAtMs")),
            revoked_at=_when(summary.get("revokedAtMs")),
            last_used_at=_when(summary.get("lastUsedAtMs")),
        )
        for summary in shape.get("tokens", [])
    }
    for role in shape.get("roles", []):
        by_role.setdefault(role, TokenRow(role=role))
    return DeviceRow(
        device_id=shape["deviceId"],
        label=shape.get("operatorLabel") or shape.get("displayName") or shape["deviceId"][:12],
        roles=shape.get("roles", []),
        scopes=shape.get("scopes", []),
        platform=shape.get("platform", ""),
        client=" ".join(filter(None, (shape.get("clientId"), shape.get("clientMode")))),
        connected=shape.get("connected", False),
        last_seen_at=_when(shape.get("lastSeenAtMs")),
        last_seen_reason=shape.get("lastSeenReason", ""),
        approved_at=_when(shape.get("approvedAtMs")),
        tokens=[by_role[role] for role in sorted(by_role)],
    )


def _device(device_id: str) -> DeviceRow:
    """The device as it is now (for a confirmation page), or 404."""
    try:
        DeviceIdParams.model_validate({"deviceId": device_id})
    except ValidationError:
        raise Http404("no such paired device") from None
    listed = device_selectors.device_pair_list(only_device_id=device_id)["paired"]
    if not listed:
        raise Http404("no such paired device")
    return _device_row(listed[0])


@require_GET
@operator_required("device.pair.list")
def pairing(request: HttpRequest) -> HttpResponse:
    listed = device_selectors.device_pair_list()
    pending = [
        {**shape, "requestedAt": _when(shape.get("ts"))}
        for shape in listed["pending"]
        if shape.get("role") != scopes.ROLE_NODE
    ]
    return render(
        request,
        "operator_ui/pairing.html",
        {
            "pending": pending,
            "pending_nodes": len(listed["pending"]) - len(pending),
            "devices": [_device_row(shape) for shape in listed["paired"]],
            "live_events": " ".join(LIVE_EVENTS),
            "nav": "pairing",
        },
    )


@require_POST
@operator_required("device.pair.approve", "device.pair.reject")
def pairing_request_decide(request: HttpRequest, request_id: str, decision: str) -> HttpResponse:
    """Operator devices only: a node's request is decided on the nodes page (its approval needs more)."""
    if decision not in ("approve", "reject"):
        raise Http404("no such decision")
    actor = Actor.for_user(request.user)
    try:
        params = RequestIdParams.model_validate({"requestId": request_id})
        if decision == "approve":
            device = pairing_services.pairing_request_approve(
                request_id=params.requestId, actor=actor, role=scopes.ROLE_OPERATOR
            )
            messages.success(request, f"Approved device {device.label} ({device.device_id}).")
        else:
            rejected = pairing_services.pairing_request_reject(
                request_id=params.requestId, actor=actor, role=scopes.ROLE_OPERATOR
            )
            messages.success(request, f"Rejected the pairing request of device {rejected.device_id}.")
    except (ValidationError, GatewayError) as refused:
        messages.error(request, _refusal(refused))
    return redirect("ui:pairing")


@operator_required("device.pair.remove")
def pairing_device_remove(request: HttpRequest, device_id: str) -> HttpResponse:
    """GET asks for confirmation; POST removes the device (``device.pair.remove``)."""
    if request.method == "POST":
        try:
            params = DeviceIdParams.model_validate({"deviceId": device_id})
            pairing_services.paired_device_remove(device_id=params.deviceId, actor=Actor.for_user(request.user))
            messages.success(request, f"Removed device {device_id}.")
        except (ValidationError, GatewayError) as refused:
            messages.error(request, _refusal(refused))
        return redirect("ui:pairing")
    if request.method != "GET":
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    return render(request, "operator_ui/pairing_device_remove.html", {"device": _device(device_id), "nav": "pairing"})


def _token_params(device_id: str, role: str) -> TokenRevokeParams:
    try:
        params = TokenRevokeParams.model_validate({"deviceId": device_id, "role": role})
    except ValidationError:
        raise Http404("no such device token") from None
    if params.role not in scopes.ROLES:
        raise Http404("no such device token")
    return params


def _token(device: DeviceRow, role: str) -> TokenRow:
    token = next((row for row in device.tokens if row.role == role), None)
    if token is None:
        raise Http404("no such device token")
    return token


@operator_required("device.token.revoke")
def pairing_token_revoke(request: HttpRequest, device_id: str, role: str) -> HttpResponse:
    """GET asks for confirmation; POST revokes (``device.token.revoke``, idempotent in the service)."""
    params = _token_params(device_id, role)
    if request.method == "POST":
        asked_at_ms = gateway_selectors.now_ms()
        try:
            result = token_services.device_token_revoke(
                device_id=params.deviceId, role=params.role, actor=Actor.for_user(request.user)
            )
            if (result.get("revokedAtMs") or asked_at_ms) < asked_at_ms:
                messages.info(request, f"The {params.role} token of device {device_id} was already revoked.")
            else:
                messages.success(request, f"Revoked the {params.role} token of device {device_id}.")
        except GatewayError as refused:
            messages.error(request, _refusal(refused))
        return redirect("ui:pairing")
    if request.method != "GET":
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    device = _device(params.deviceId)
    token = _token(device, params.role)
    return render(
        request,
        "operator_ui/pairing_token_revoke.html",
        {"device": device, "token": token, "nav": "pairing"},
    )


@operator_required("device.token.rotate")
def pairing_token_rotate(request: HttpRequest, device_id: str, role: str) -> HttpResponse:
    """GET asks for confirmation; POST rotates (``device.token.rotate`` with the device's approved scopes)
    and answers with the new secret, shown this once and never stored anywhere but as its hash."""
    params = _token_params(device_id, role)
    if request.method == "POST":
        try:
            result = token_services.device_token_rotate(
                device_id=params.deviceId,
                role=params.role,
                scopes=None,
                actor=Actor.for_user(request.user),
                show_to_operator=True,
            )
        except GatewayError as refused:
            messages.error(request, _refusal(refused))
            return redirect("ui:pairing")
        response = render(
            request,
            "operator_ui/pairing_token_rotated.html",
            {
                "device_id": params.deviceId,
                "role": params.role,
                "scopes": result["scopes"],
                "token": result["token"],
                "rotated_at": _when(result["rotatedAtMs"]),
                "nav": "pairing",
            },
        )
        # The secret must stay out of caches and the browser's history.
        response["Cache-Control"] = "no-store"
        return response
    if request.method != "GET":
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    device = _device(params.deviceId)
    token = _token(device, params.role)
    scopes_after = device.scopes if params.role == scopes.ROLE_OPERATOR else []
    return render(
        request,
        "operator_ui/pairing_token_rotate.html",
        {"device": device, "token": token, "scopes_after": scopes_after, "nav": "pairing"},
    )
