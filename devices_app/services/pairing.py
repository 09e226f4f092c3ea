"""Pairing: requests from connecting devices, operator decisions, paired devices and nodes."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from gateway import scopes as sc
from gateway.audit import Actor, audit
from gateway.auth import derive_device_id
from gateway.conf import gateway_setting
from gateway.exceptions import InvalidRequest, NotFound, PermissionDenied
from gateway.models import GatewayConnection
from gateway.selectors import now_ms
from gateway.services import connections

from .. import events
from ..models import DevicePairingRequest, DeviceToken, PairedDevice, PairingStatus
from ..ports import node_workers
from ..selectors import EXEC_COMMANDS, node_catalog_changed, node_pairing_request_shape, pairing_request_shape
from . import tokens

logger = logging.getLogger(__name__)

# How a removal closes the device's live connections (workers.md §5.4: OpenClaw closes the node socket with
# 4001 `device removed`); a node host takes it as the end of its pairing and deletes what it kept for us.
REMOVED_CLOSE_CODE = 4001
REMOVED_CLOSE_REASON = "device removed"


@dataclass(frozen=True)
class PairingClaim:
    """What a connecting device asks to be approved for."""

    device_id: str
    public_key: str
    role: str
    scopes: list[str]
    reason: str
    is_repair: bool
    display_name: str = ""
    platform: str = ""
    device_family: str = ""
    model_identifier: str = ""
    client_id: str = ""
    client_mode: str = ""
    client_version: str = ""
    commands: list[str] = field(default_factory=list)
    caps: list[str] = field(default_factory=list)
    permissions: dict[str, bool] = field(default_factory=dict)
    remote_ip: str = ""


def pairing_requests_expire(device_id: str | None = None) -> list[DevicePairingRequest]:
    overdue = DevicePairingRequest.objects.filter(status=PairingStatus.PENDING, expires_at__lte=timezone.now())
    if device_id is not None:
        overdue = overdue.filter(device_id=device_id)
    expired = list(overdue)
    if expired:
        DevicePairingRequest.objects.filter(pk__in=[r.pk for r in expired], status=PairingStatus.PENDING).update(
            status=PairingStatus.EXPIRED, resolved_at=timezone.now(), resolved_by="expiry"
        )
    return expired


def pairing_request_publish_resolved(request: DevicePairingRequest, decision: str) -> None:
    if request.role == sc.ROLE_NODE:
        node_catalog_changed()
    ts = now_ms()
    events.publish_on_commit(
        events.EVENT_DEVICE_PAIR_RESOLVED,
        {"requestId": str(request.request_id), "deviceId": request.device_id, "decision": decision, "ts": ts},
    )
    if request.role == sc.ROLE_NODE:
        events.publish_on_commit(
            events.EVENT_NODE_PAIR_RESOLVED,
            {"requestId": str(request.request_id), "nodeId": request.device_id, "decision": decision, "ts": ts},
        )


class ApprovedMeanwhile(Exception):
    """The claim was approved between the caller's read of the device and this request: the device
    already holds the role, so a new request would be one no operator needs to see."""

    def __init__(self, device: PairedDevice):
        super().__init__(device.device_id)
        self.device = device


def pairing_request_ensure(*, claim: PairingClaim) -> tuple[DevicePairingRequest, bool]:
    """The open pairing request of a device, created if it has none (idempotent per device).

    An open request is refreshed with the latest claim, so an operator approves what the device
    asks for now. Concurrent connects of one device meet on the partial unique index. Raises
    ``ApprovedMeanwhile`` when the device was granted the claimed role since the caller read it.
    """
    fields = dict(
        public_key=claim.public_key,
        role=claim.role,
        scopes=claim.scopes,
        reason=claim.reason,
        is_repair=claim.is_repair,
        display_name=claim.display_name,
        platform=claim.platform,
        device_family=claim.device_family,
        model_identifier=claim.model_identifier,
        client_id=claim.client_id,
        client_mode=claim.client_mode,
        client_version=claim.client_version,
        commands=claim.commands,
        caps=claim.caps,
        permissions=claim.permissions,
        remote_ip=claim.remote_ip,
    )
    ttl = timedelta(milliseconds=gateway_setting("PAIRING_PENDING_TTL_MS"))
    for _attempt in range(3):
        try:
            with transaction.atomic():
                for expired in pairing_requests_expire(claim.device_id):
                    pairing_request_publish_resolved(expired, "expired")
                existing = (
                    DevicePairingRequest.objects.select_for_update(no_key=True)
                    .filter(device_id=claim.device_id, status=PairingStatus.PENDING)
                    .first()
                )
                # Locked so that a concurrent approve cannot resolve the request mid-refresh.
                if existing is not None:
                    changed = {k: v for k, v in fields.items() if getattr(existing, k) != v}
                    # A device that keeps asking keeps its request open (OpenClaw's refreshedAtMs): a node
                    # retrying while it waits for approval is approved by the same requestId.
                    DevicePairingRequest.objects.filter(pk=existing.pk).update(
                        expires_at=timezone.now() + ttl, **changed
                    )
                    if changed:
                        if claim.role == sc.ROLE_NODE or existing.role == sc.ROLE_NODE:
                            node_catalog_changed()
                        for key, value in changed.items():
                            setattr(existing, key, value)
                    return existing, False
                # Read after the pending row: an approval that resolved it has committed its grant,
                # or the locking read above would have waited for it.
                device = PairedDevice.objects.filter(device_id=claim.device_id).first()
                if device is not None and device.has_role(claim.role):
                    raise ApprovedMeanwhile(device)
                request = DevicePairingRequest.objects.create(
                    device_id=claim.device_id, expires_at=timezone.now() + ttl, **fields
                )
                events.publish_on_commit(events.EVENT_DEVICE_PAIR_REQUESTED, pairing_request_shape(request))
                if request.role == sc.ROLE_NODE:
                    node_catalog_changed()
                    events.publish_on_commit(events.EVENT_NODE_PAIR_REQUESTED, node_pairing_request_shape(request))
                return request, True
        except IntegrityError:
            continue  # another connection of this device created it first; read it again
    raise InvalidRequest("pairing request could not be recorded; retry")


_DEVICE_METADATA = (
    "public_key",
    "platform",
    "device_family",
    "model_identifier",
    "client_id",
    "client_mode",
    "client_version",
    "remote_ip",
)


def _grant(device: PairedDevice, source: PairingClaim | DevicePairingRequest, *, role: str, now) -> None:
    """Give ``device`` the role asked for by ``source`` (a request or a claim) and its metadata.

    Operator scopes accumulate; a node's command surface is replaced by the one just approved.
    """
    for name in _DEVICE_METADATA:
        setattr(device, name, getattr(source, name))
    device.display_name = source.display_name or device.display_name
    device.roles = sorted({*(device.roles or []), role})
    if role == sc.ROLE_OPERATOR:
        device.approved_scopes = sc.normalize_scopes([*(device.approved_scopes or []), *source.scopes])
    else:
        device.approved_commands = sorted(set(source.commands))
        device.approved_caps = sorted(set(source.caps))
        device.approved_permissions = dict(source.permissions or {})
    device.approved_at = now


def _approval_state(device: PairedDevice) -> dict | str:
    """A device's approval as an audit row records it before and after a change."""
    if device._state.adding:
        return "unpaired"
    return {"roles": list(device.roles or []), "scopes": list(device.approved_scopes or [])}


def _required_approval_scopes(request: DevicePairingRequest) -> list[str]:
    if request.role != sc.ROLE_NODE or not request.commands:
        return [sc.PAIRING]
    if EXEC_COMMANDS & set(request.commands):
        return [sc.PAIRING, sc.ADMIN]
    return [sc.PAIRING, sc.WRITE]


def _open_request(request_id: str, *, role: str | None) -> DevicePairingRequest:
    try:
        request = DevicePairingRequest.objects.get(
            request_id=request_id, status=PairingStatus.PENDING, expires_at__gt=timezone.now()
        )
    except (DevicePairingRequest.DoesNotExist, ValidationError, ValueError, TypeError):
        raise NotFound("unknown requestId") from None
    if role is not None and request.role != role:
        raise NotFound("unknown requestId")
    return request


def pairing_request_approve(*, request_id: str, actor: Actor, role: str | None = None) -> PairedDevice:
    """Approve an open request: the device gets the requested role, scopes and command surface."""
    with transaction.atomic():
        request = _open_request(request_id, role=role)
        for scope in _required_approval_scopes(request):
            if not actor.has_scope(scope):
                raise PermissionDenied(f"missing scope: {scope}")
        now = timezone.now()
        claimed = DevicePairingRequest.objects.filter(pk=request.pk, status=PairingStatus.PENDING).update(
            status=PairingStatus.APPROVED, resolved_at=now, resolved_by=actor.label
        )
        if claimed != 1:
            raise NotFound("unknown requestId")
        device = PairedDevice.objects.select_for_update(no_key=True).filter(device_id=request.device_id).first()
        # Locked: a concurrent approval of another role for this device must not lose ours.
        if device is None:
            device = PairedDevice(device_id=request.device_id, approved_at=now)
        before = _approval_state(device)
        _grant(device, request, role=request.role, now=now)
        device.save()
        audit(
            actor,
            "device.pair.approve",
            "device",
            device.device_id,
            {
                "requestId": str(request.request_id),
                "role": request.role,
                "scopes": request.scopes,
                "commands": request.commands,
                "before": before,
                "after": _approval_state(device),
            },
        )
        pairing_request_publish_resolved(request, "approved")
    return device


def pairing_request_reject(*, request_id: str, actor: Actor, role: str | None = None) -> DevicePairingRequest:
    with transaction.atomic():
        request = _open_request(request_id, role=role)
        claimed = DevicePairingRequest.objects.filter(pk=request.pk, status=PairingStatus.PENDING).update(
            status=PairingStatus.REJECTED, resolved_at=timezone.now(), resolved_by=actor.label
        )
        if claimed != 1:
            raise NotFound("unknown requestId")
        audit(
            actor,
            "device.pair.reject",
            "device",
            request.device_id,
            {"requestId": str(request.request_id), "before": "pending", "after": "rejected"},
        )
        pairing_request_publish_resolved(request, "rejected")
    return request


def paired_device_remove(*, device_id: str, actor: Actor) -> None:
    """Forget a device: its tokens die with it and its live connections are closed."""
    with transaction.atomic():
        device = PairedDevice.objects.filter(device_id=device_id).first()
        deleted, _ = PairedDevice.objects.filter(device_id=device_id).delete()
        if device is None or not deleted:
            raise NotFound("unknown deviceId")
        connections.connections_close(
            list(GatewayConnection.objects.filter(device_id=device_id)),
            reason=REMOVED_CLOSE_REASON,
            code=REMOVED_CLOSE_CODE,
        )
        audit(actor, "device.pair.remove", "device", device_id, {"before": _approval_state(device), "after": "removed"})
        node_catalog_changed()
        events.publish_on_commit(
            events.EVENT_DEVICE_PAIR_RESOLVED,
            {"requestId": "", "deviceId": device_id, "decision": "removed", "ts": now_ms()},
        )


def node_remove(*, node_id: str, actor: Actor) -> None:
    """Withdraw a device's node role: node token revoked, node connections closed."""
    with transaction.atomic():
        device = PairedDevice.objects.select_for_update(no_key=True).filter(device_id=node_id).first()
        # Locked so that a concurrent approval cannot re-add the role we are removing.
        if device is None or not device.has_role(sc.ROLE_NODE):
            raise NotFound("unknown nodeId")
        before = _approval_state(device)
        remaining = [r for r in device.roles if r != sc.ROLE_NODE]
        if remaining:
            device.roles = remaining
            device.approved_commands, device.approved_caps, device.approved_permissions = [], [], {}
            device.save(update_fields=["roles", "approved_commands", "approved_caps", "approved_permissions"])
            DeviceToken.objects.filter(device=device, role=sc.ROLE_NODE).delete()
        else:
            device.delete()
        connections.connections_close(
            list(GatewayConnection.objects.filter(device_id=node_id, role=sc.ROLE_NODE)),
            reason=REMOVED_CLOSE_REASON,
            code=REMOVED_CLOSE_CODE,
        )
        after = {"roles": remaining, "scopes": list(device.approved_scopes or [])} if remaining else "removed"
        audit(actor, "node.pair.remove", "node", node_id, {"before": before, "after": after})
        node_catalog_changed()
        events.publish_on_commit(
            events.EVENT_NODE_PAIR_RESOLVED,
            {"requestId": "", "nodeId": node_id, "decision": "removed", "ts": now_ms()},
        )


def node_pair_remove(*, node_id: str, actor: Actor) -> None:
    """``node.pair.remove`` (the RPC, the console): a node still connected asked to delete what it keeps for
    this gateway, the role withdrawn, then every app's cleanup of what ran on the node (workers_app waits for
    its environments and placements) before this returns."""
    node_workers().node_leaving(node_id)
    node_remove(node_id=node_id, actor=actor)
    node_workers().node_removed(node_id)


def node_enroll(
    *, public_key: str, display_name: str, commands: list[str], caps: list[str], actor: Actor
) -> tuple[PairedDevice, str]:
    """A pre-approved node pairing: the gateway itself starts this node (a ``local`` or ``static-ssh``
    worker host), so the operator's approval is the provisioning request that led here. Returns the
    paired device and its node token, handed to the node once (only its hash is kept)."""
    device_id = derive_device_id(public_key)
    if device_id is None:
        raise InvalidRequest("invalid node public key")
    now = timezone.now()
    with transaction.atomic():
        device, _created = PairedDevice.objects.select_for_update(no_key=True).get_or_create(
            device_id=device_id, defaults={"public_key": public_key, "approved_at": now}
        )
        claim = PairingClaim(
            device_id=device_id,
            public_key=public_key,
            role=sc.ROLE_NODE,
            scopes=[],
            reason="enrolled",
            is_repair=False,
            display_name=display_name,
            client_id="node-host",
            client_mode="node",
            commands=list(commands),
            caps=list(caps),
        )
        _grant(device, claim, role=sc.ROLE_NODE, now=now)
        device.save()
        DeviceToken.objects.filter(device=device, role=sc.ROLE_NODE).delete()
        token, _issued = tokens.device_token_ensure(device=device, role=sc.ROLE_NODE, scopes=[])
        audit(actor, "node.enroll", "node", device_id, {"displayName": display_name})
        node_catalog_changed()
    if token is None:  # the previous token was just deleted: a new one is always minted
        raise RuntimeError(f"no node token was minted for {device_id}")
    return device, token


def node_rename(*, node_id: str, display_name: str, actor: Actor) -> PairedDevice:
    name = display_name.strip()
    if not name:
        raise InvalidRequest("displayName required")
    with transaction.atomic():
        updated = PairedDevice.objects.filter(device_id=node_id).update(operator_label=name[:200])
        if not updated:
            raise NotFound("unknown nodeId")
        audit(actor, "node.rename", "node", node_id, {"displayName": name})
        node_catalog_changed()
    return PairedDevice.objects.get(device_id=node_id)


# --- silent operator pairing ----------------------------------------------------------------


def operator_device_covered(device: PairedDevice | None, scopes: list[str]) -> bool:
    """Whether an operator device as read already holds these scopes: auto-approval has nothing to write."""
    return device is not None and device.has_role(sc.ROLE_OPERATOR) and sc.scopes_cover(device.approved_scopes, scopes)


def operator_device_auto_approve(
    *, claim: PairingClaim, known: PairedDevice | None = None
) -> tuple[PairedDevice, bool, bool]:
    """Pair (or widen) an operator device that proved possession of the shared secret.

    The shared secret is the operator credential of this gateway, so its holder needs no second
    approval; OpenClaw does the same for local clients ("silent" pairing). ``known`` is the device
    as the caller just read it: when it already covers the claim, nothing is locked or written.
    Returns (device, changed, created).
    """
    if operator_device_covered(known, claim.scopes):
        return known, False, False
    # No savepoint inside the connect's transaction: a failure here fails the whole connect anyway.
    with transaction.atomic(savepoint=False):
        device = PairedDevice.objects.select_for_update(no_key=True).filter(device_id=claim.device_id).first()
        # Locked: concurrent first connects of one device must merge, not overwrite, scopes.
        now = timezone.now()
        if operator_device_covered(device, claim.scopes):
            return device, False, False
        created = device is None
        if device is None:
            device = PairedDevice(device_id=claim.device_id, approved_at=now)
        _grant(device, claim, role=sc.ROLE_OPERATOR, now=now)
        # A new row is inserted straight away (save() would try an UPDATE of its primary key first).
        device.save(force_insert=created)
        audit(
            Actor.system("gateway:shared-secret"),
            "device.pair.auto-approve",
            "device",
            device.device_id,
            {"role": sc.ROLE_OPERATOR, "scopes": claim.scopes, "created": created},
        )
        events.publish_on_commit(
            events.EVENT_DEVICE_PAIR_RESOLVED,
            {"requestId": "", "deviceId": device.device_id, "decision": "approved", "ts": now_ms()},
        )
    return device, True, created


def pairing_sweep() -> dict:
    """Expire overdue pairing requests and tell the operators (Celery beat; the gateway loop when embedded)."""
    with transaction.atomic():
        expired = pairing_requests_expire()
        for request in expired:
            pairing_request_publish_resolved(request, "expired")
    if expired:
        # The one line of this sweep: it runs every 30 s and is silent when nothing expired.
        logger.info(
            "pairing: %d request(s) expired without a decision: %s",
            len(expired),
            ", ".join(str(request.request_id) for request in expired),
        )
    return {"expiredRequests": len(expired)}
