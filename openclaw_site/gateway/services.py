"""All writes of the gateway core: pairing, device tokens, node names, live connections, processes.

One transaction per service; events and control messages go out only after commit.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from . import events
from . import scopes as sc
from .auth import hash_device_token, new_device_token, secret_matches
from .conf import gateway_setting
from .exceptions import InvalidRequest, NotFound, PermissionDenied
from .models import (
    AuditLog,
    DevicePairingRequest,
    DeviceToken,
    GatewayConnection,
    GatewayProcess,
    PairedDevice,
    PairingStatus,
)
from .selectors import (
    EXEC_COMMANDS,
    live_connections,
    node_catalog_changed,
    node_pairing_request_shape,
    now_ms,
    pairing_request_shape,
    stale_processes,
    to_ms,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Actor:
    """Who performs a change: an RPC connection, a Django user (admin/UI/API) or the CLI."""

    label: str
    scopes: tuple[str, ...] = (sc.ADMIN,)
    user: AbstractBaseUser | None = None
    device_id: str | None = None
    conn_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_user(cls, user: AbstractBaseUser) -> Actor:
        return cls(label=f"user:{user.get_username()}", user=user)

    @classmethod
    def system(cls, label: str = "gateway") -> Actor:
        return cls(label=label)

    def has_scope(self, scope: str) -> bool:
        return sc.scope_satisfied(self.scopes, scope)


def audit(actor: Actor, action: str, target_type: str, target_id: str, data: dict | None = None) -> None:
    AuditLog.objects.create(
        actor_user=actor.user if actor.user is not None and actor.user.is_authenticated else None,
        actor=actor.label,
        action=action,
        target_type=target_type,
        target_id=target_id,
        data=data or {},
    )


# --- pairing requests -----------------------------------------------------------------------


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


def _expire_overdue(device_id: str | None = None) -> list[DevicePairingRequest]:
    overdue = DevicePairingRequest.objects.filter(status=PairingStatus.PENDING, expires_at__lte=timezone.now())
    if device_id is not None:
        overdue = overdue.filter(device_id=device_id)
    expired = list(overdue)
    if expired:
        DevicePairingRequest.objects.filter(pk__in=[r.pk for r in expired], status=PairingStatus.PENDING).update(
            status=PairingStatus.EXPIRED, resolved_at=timezone.now(), resolved_by="expiry"
        )
    return expired


def _publish_resolved(request: DevicePairingRequest, decision: str) -> None:
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


def pairing_request_ensure(*, claim: PairingClaim) -> tuple[DevicePairingRequest, bool]:
    """The open pairing request of a device, created if it has none (idempotent per device).

    An open request is refreshed with the latest claim, so an operator approves what the device
    asks for now. Concurrent connects of one device meet on the partial unique index.
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
                for expired in _expire_overdue(claim.device_id):
                    _publish_resolved(expired, "expired")
                existing = (
                    DevicePairingRequest.objects.select_for_update(no_key=True)
                    .filter(device_id=claim.device_id, status=PairingStatus.PENDING)
                    .first()
                )
                # Locked so that a concurrent approve cannot resolve the request mid-refresh.
                if existing is not None:
                    changed = {k: v for k, v in fields.items() if getattr(existing, k) != v}
                    if changed:
                        DevicePairingRequest.objects.filter(pk=existing.pk).update(**changed)
                        if claim.role == sc.ROLE_NODE or existing.role == sc.ROLE_NODE:
                            node_catalog_changed()
                        for key, value in changed.items():
                            setattr(existing, key, value)
                    return existing, False
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
        raise InvalidRequest("unknown requestId") from None
    if role is not None and request.role != role:
        raise InvalidRequest("unknown requestId")
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
            raise InvalidRequest("unknown requestId")
        device = PairedDevice.objects.select_for_update(no_key=True).filter(device_id=request.device_id).first()
        # Locked: a concurrent approval of another role for this device must not lose ours.
        if device is None:
            device = PairedDevice(device_id=request.device_id, approved_at=now)
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
            },
        )
        _publish_resolved(request, "approved")
    return device


def pairing_request_reject(*, request_id: str, actor: Actor, role: str | None = None) -> DevicePairingRequest:
    with transaction.atomic():
        request = _open_request(request_id, role=role)
        claimed = DevicePairingRequest.objects.filter(pk=request.pk, status=PairingStatus.PENDING).update(
            status=PairingStatus.REJECTED, resolved_at=timezone.now(), resolved_by=actor.label
        )
        if claimed != 1:
            raise InvalidRequest("unknown requestId")
        audit(actor, "device.pair.reject", "device", request.device_id, {"requestId": str(request.request_id)})
        _publish_resolved(request, "rejected")
    return request


def _close_connections(connections: list[GatewayConnection], *, reason: str, code: int = 1008) -> None:
    by_channel = [c.channel_name for c in connections]
    GatewayConnection.objects.filter(pk__in=[c.pk for c in connections]).delete()
    events.send_to_channels_on_commit(by_channel, events.close_message(code, reason))


def paired_device_remove(*, device_id: str, actor: Actor) -> None:
    """Forget a device: its tokens die with it and its live connections are closed."""
    with transaction.atomic():
        deleted, _ = PairedDevice.objects.filter(device_id=device_id).delete()
        if not deleted:
            raise NotFound("unknown deviceId")
        _close_connections(list(GatewayConnection.objects.filter(device_id=device_id)), reason="device removed")
        audit(actor, "device.pair.remove", "device", device_id)
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
        remaining = [r for r in device.roles if r != sc.ROLE_NODE]
        if remaining:
            device.roles = remaining
            device.approved_commands, device.approved_caps, device.approved_permissions = [], [], {}
            device.save(update_fields=["roles", "approved_commands", "approved_caps", "approved_permissions"])
            DeviceToken.objects.filter(device=device, role=sc.ROLE_NODE).delete()
        else:
            device.delete()
        _close_connections(
            list(GatewayConnection.objects.filter(device_id=node_id, role=sc.ROLE_NODE)),
            reason="node pairing removed",
        )
        audit(actor, "node.pair.remove", "node", node_id)
        node_catalog_changed()
        events.publish_on_commit(
            events.EVENT_NODE_PAIR_RESOLVED,
            {"requestId": "", "nodeId": node_id, "decision": "removed", "ts": now_ms()},
        )


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


# --- device tokens --------------------------------------------------------------------------


class DeviceTokenRejected(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def device_token_verify(*, device_id: str, role: str, token: str) -> DeviceToken:
    """Reasons: device-not-paired, token-missing, token-revoked, token-mismatch."""
    device = PairedDevice.objects.filter(device_id=device_id).first()
    if device is None:
        raise DeviceTokenRejected("device-not-paired")
    record = DeviceToken.objects.filter(device=device, role=role).first()
    if record is None:
        raise DeviceTokenRejected("token-missing")
    if not secret_matches(hash_device_token(token), record.token_hash):
        raise DeviceTokenRejected("token-mismatch")
    if record.revoked_at is not None:
        raise DeviceTokenRejected("token-revoked")
    return record


def device_token_ensure(*, device: PairedDevice, role: str, scopes: list[str]) -> tuple[str | None, int | None]:
    """Mint a token for (device, role) when it has no usable one; returns (token, issuedAtMs).

    Only hashes are stored, so an existing token cannot be handed out again: a device that lost
    its token rotates it (``device.token.rotate``) or re-pairs.
    """
    current = DeviceToken.objects.filter(device=device, role=role).first()
    if current is not None and current.revoked_at is None and sc.scopes_cover(current.scopes, scopes):
        return None, None  # the common reconnect: nothing to mint, no lock needed
    with transaction.atomic():
        record = DeviceToken.objects.select_for_update(no_key=True).filter(device=device, role=role).first()
        # Locked: two first connects of one device must not both mint.
        if record is not None and record.revoked_at is None and sc.scopes_cover(record.scopes, scopes):
            return None, None
        token = new_device_token()
        now = timezone.now()
        if record is None:
            record = DeviceToken.objects.create(
                device=device, role=role, token_hash=hash_device_token(token), scopes=scopes
            )
        else:
            record.token_hash = hash_device_token(token)
            record.scopes = sc.normalize_scopes([*record.scopes, *scopes]) if record.revoked_at is None else scopes
            record.revoked_at = None
            record.rotated_at = now
            record.save(update_fields=["token_hash", "scopes", "revoked_at", "rotated_at"])
        return token, to_ms(now)


def device_token_touch(record: DeviceToken) -> None:
    DeviceToken.objects.filter(pk=record.pk).update(last_used_at=timezone.now())


def device_token_rotate(*, device_id: str, role: str, scopes: list[str] | None, actor: Actor) -> dict:
    """Issue a fresh token; the secret is returned only to the device itself."""
    with transaction.atomic():
        device = PairedDevice.objects.filter(device_id=device_id).first()
        if device is None:
            raise NotFound("unknown deviceId")
        if not device.has_role(role):
            raise InvalidRequest("device token rotation denied")
        wanted = sc.normalize_scopes(
            scopes if scopes is not None else (device.approved_scopes if role == sc.ROLE_OPERATOR else [])
        )
        if role == sc.ROLE_OPERATOR and not sc.scopes_cover(device.approved_scopes, wanted):
            raise InvalidRequest("device token rotation denied")
        if not sc.scopes_cover(actor.scopes, wanted) and actor.device_id != device_id:
            raise InvalidRequest("device token rotation denied")
        token = new_device_token()
        now = timezone.now()
        DeviceToken.objects.update_or_create(
            device=device,
            role=role,
            defaults={"token_hash": hash_device_token(token), "scopes": wanted, "revoked_at": None, "rotated_at": now},
        )
        others = GatewayConnection.objects.filter(device_id=device_id, role=role, auth_method="device-token")
        if actor.conn_id:
            others = others.exclude(conn_id=actor.conn_id)
        _close_connections(list(others), reason="device token rotated")
        audit(actor, "device.token.rotate", "device", device_id, {"role": role, "scopes": wanted})
    in_band = actor.device_id == device_id
    result = {
        "deviceId": device_id,
        "role": role,
        "scopes": wanted,
        "rotatedAtMs": to_ms(now),
        "tokenDelivery": "in-band" if in_band else "withheld-cross-device",
    }
    if in_band:
        result["token"] = token
    return result


def device_token_revoke(*, device_id: str, role: str, actor: Actor) -> dict:
    """Revoke (idempotent: revoking a revoked token changes, closes and audits nothing)."""
    with transaction.atomic():
        now = timezone.now()
        updated = DeviceToken.objects.filter(device_id=device_id, role=role, revoked_at__isnull=True).update(
            revoked_at=now
        )
        if not updated:
            record = DeviceToken.objects.filter(device_id=device_id, role=role).first()
            if record is None:
                raise NotFound("unknown device token")
            return {"deviceId": device_id, "role": role, "revokedAtMs": to_ms(record.revoked_at)}
        others = GatewayConnection.objects.filter(device_id=device_id, role=role, auth_method="device-token")
        if actor.conn_id:
            others = others.exclude(conn_id=actor.conn_id)
        _close_connections(list(others), reason="device token revoked")
        audit(actor, "device.token.revoke", "device", device_id, {"role": role})
    return {"deviceId": device_id, "role": role, "revokedAtMs": to_ms(now)}


# --- silent operator pairing ----------------------------------------------------------------


def _operator_covered(device: PairedDevice | None, scopes: list[str]) -> bool:
    return device is not None and device.has_role(sc.ROLE_OPERATOR) and sc.scopes_cover(device.approved_scopes, scopes)


def operator_device_auto_approve(
    *, claim: PairingClaim, known: PairedDevice | None = None
) -> tuple[PairedDevice, bool]:
    """Pair (or widen) an operator device that proved possession of the shared secret.

    The shared secret is the operator credential of this gateway, so its holder needs no second
    approval; OpenClaw does the same for local clients ("silent" pairing). ``known`` is the device
    as the caller just read it: when it already covers the claim, nothing is locked or written.
    """
    if _operator_covered(known, claim.scopes):
        return known, False
    with transaction.atomic():
        device = PairedDevice.objects.select_for_update(no_key=True).filter(device_id=claim.device_id).first()
        # Locked: concurrent first connects of one device must merge, not overwrite, scopes.
        now = timezone.now()
        if _operator_covered(device, claim.scopes):
            return device, False
        created = device is None
        if device is None:
            device = PairedDevice(device_id=claim.device_id, approved_at=now)
        _grant(device, claim, role=sc.ROLE_OPERATOR, now=now)
        device.save()
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
    return device, True


# --- processes and live connections ---------------------------------------------------------


def process_register(*, boot_id: str) -> GatewayProcess:
    now = timezone.now()
    process, _ = GatewayProcess.objects.update_or_create(
        boot_id=boot_id,
        defaults={"hostname": socket.gethostname(), "pid": os.getpid(), "started_at": now, "heartbeat_at": now},
    )
    return process


def process_heartbeat(*, boot_id: str) -> None:
    if not GatewayProcess.objects.filter(boot_id=boot_id).update(heartbeat_at=timezone.now()):
        # Swept as dead after a long pause (debugger, overloaded host): come back.
        process_register(boot_id=boot_id)


def process_unregister(*, boot_id: str) -> None:
    with transaction.atomic():
        device_ids = list(
            GatewayConnection.objects.filter(process_id=boot_id)
            .exclude(device_id="")
            .values_list("device_id", flat=True)
        )
        GatewayProcess.objects.filter(boot_id=boot_id).delete()
        node_catalog_changed()
        if device_ids:
            PairedDevice.objects.filter(device_id__in=device_ids).update(
                last_disconnected_at=timezone.now(), last_seen_at=timezone.now(), last_seen_reason="disconnect"
            )


@dataclass(frozen=True)
class ConnectionRecord:
    conn_id: str
    boot_id: str
    channel_name: str
    role: str
    scopes: list[str]
    auth_method: str
    device_id: str
    node_id: str | None
    client_id: str
    client_mode: str
    client_version: str
    display_name: str
    platform: str
    device_family: str
    model_identifier: str
    instance_id: str
    remote_ip: str
    caps: list[str]
    commands: list[str]
    permissions: dict[str, bool]
    path_env: str


def connection_register(*, record: ConnectionRecord) -> None:
    """Make a connection routable from every gateway process; a node replaces its older socket."""
    try:
        _connection_insert(record)
    except IntegrityError:
        # Our process row was swept (a long pause without heartbeats): register again and retry.
        process_register(boot_id=record.boot_id)
        _connection_insert(record)


def _connection_insert(record: ConnectionRecord) -> None:
    now = timezone.now()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # Connection rows die with their process anyway; their commit need not wait for the
            # WAL flush (pairing decisions and tokens keep full durability).
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        if record.role == sc.ROLE_NODE and record.node_id:
            replaced = list(GatewayConnection.objects.filter(role=sc.ROLE_NODE, node_id=record.node_id))
            _close_connections(replaced, reason="replaced by a newer connection")
        GatewayConnection.objects.create(
            conn_id=record.conn_id,
            process_id=record.boot_id,
            channel_name=record.channel_name,
            role=record.role,
            scopes=record.scopes,
            auth_method=record.auth_method,
            device_id=record.device_id,
            node_id=record.node_id or "",
            client_id=record.client_id,
            client_mode=record.client_mode,
            client_version=record.client_version,
            display_name=record.display_name,
            platform=record.platform,
            device_family=record.device_family,
            model_identifier=record.model_identifier,
            instance_id=record.instance_id,
            remote_ip=record.remote_ip,
            caps=record.caps,
            commands=record.commands,
            permissions=record.permissions,
            path_env=record.path_env,
            connected_at=now,
        )
        if record.device_id:
            PairedDevice.objects.filter(device_id=record.device_id).update(
                last_connected_at=now, last_seen_at=now, last_seen_reason="connect"
            )
        if record.role == sc.ROLE_NODE:
            node_catalog_changed()


def connection_unregister(*, conn_id: str) -> bool:
    with transaction.atomic():
        conn = GatewayConnection.objects.filter(conn_id=conn_id).first()
        if conn is None:
            return False
        conn.delete()
        if conn.role == sc.ROLE_NODE:
            node_catalog_changed()
        if conn.device_id:
            now = timezone.now()
            PairedDevice.objects.filter(device_id=conn.device_id).update(
                last_disconnected_at=now, last_seen_at=now, last_seen_reason="disconnect"
            )
        return True


def node_presence_touch(*, node_id: str, reason: str) -> bool:
    with transaction.atomic():
        touched = PairedDevice.objects.filter(device_id=node_id).update(
            last_seen_at=timezone.now(), last_seen_reason=reason
        )
        if touched:
            node_catalog_changed()
    return bool(touched)


def gateway_sweep() -> dict:
    """Expire overdue pairing requests; forget processes (and their connections) that stopped heartbeating."""
    with transaction.atomic():
        expired = _expire_overdue()
        for request in expired:
            _publish_resolved(request, "expired")
        dead = list(stale_processes().values_list("boot_id", flat=True))
    for boot_id in dead:
        process_unregister(boot_id=str(boot_id))
    if dead:
        logger.warning("forgot %d gateway process(es) that stopped heartbeating", len(dead))
    return {"expiredRequests": len(expired), "deadProcesses": len(dead), "liveConnections": live_connections().count()}
