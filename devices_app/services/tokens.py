"""Device tokens: one per (device, role), stored as a hash, minted on approval, rotated and revoked."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from gateway import scopes as sc
from gateway import sql_reads
from gateway.audit import Actor, audit
from gateway.auth import hash_device_token, new_device_token, secret_matches
from gateway.exceptions import InvalidRequest, NotFound
from gateway.models import GatewayConnection
from gateway.selectors import to_ms
from gateway.services import connections

from ..models import DeviceToken, PairedDevice


class DeviceTokenRejected(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_TOKEN_FIELDS = tuple(DeviceToken._meta.concrete_fields)
_DEVICE_FIELDS = tuple(PairedDevice._meta.concrete_fields)
# The one read of a reconnecting device's connect, so SQL text (gateway.sql_reads), not a queryset compiled per call.
_TOKEN_WITH_DEVICE_SQL = (
    f"SELECT {sql_reads.columns(_TOKEN_FIELDS, table='t')}, {sql_reads.columns(_DEVICE_FIELDS, table='d')} "
    f'FROM "{DeviceToken._meta.db_table}" t JOIN "{PairedDevice._meta.db_table}" d ON d."device_id" = t."device_id" '
    'WHERE t."device_id" = %s AND t."role" = %s'
)


def device_token_with_device(*, device_id: str, role: str) -> DeviceToken | None:
    """The token record of (device, role) (one per pair), its ``device`` filled in, or None."""
    alias, rows = sql_reads.read(DeviceToken, _TOKEN_WITH_DEVICE_SQL, [device_id, role])
    if not rows:
        return None
    row = rows[0]
    split = len(_TOKEN_FIELDS)
    (record,) = sql_reads.from_rows(DeviceToken, _TOKEN_FIELDS, [row[:split]], alias=alias)
    (record.device,) = sql_reads.from_rows(PairedDevice, _DEVICE_FIELDS, [row[split:]], alias=alias)
    return record


def device_token_verify(*, device_id: str, role: str, token: str) -> DeviceToken:
    """Reasons: device-not-paired, token-missing, token-revoked, token-mismatch. ``record.device`` is loaded."""
    record = device_token_with_device(device_id=device_id, role=role)
    if record is None:
        if not PairedDevice.objects.filter(device_id=device_id).exists():
            raise DeviceTokenRejected("device-not-paired")
        raise DeviceTokenRejected("token-missing")
    if not secret_matches(hash_device_token(token), record.token_hash):
        raise DeviceTokenRejected("token-mismatch")
    if record.revoked_at is not None:
        raise DeviceTokenRejected("token-revoked")
    return record


def token_covers(record: DeviceToken | None, scopes: list[str]) -> bool:
    return record is not None and record.revoked_at is None and sc.scopes_cover(record.scopes, scopes)


def device_token_covers(*, device: PairedDevice, role: str, scopes: list[str]) -> bool:
    """Whether (device, role) has a usable token for these scopes: :func:`device_token_ensure` would mint none."""
    return token_covers(DeviceToken.objects.filter(device=device, role=role).first(), scopes)


def device_token_ensure(
    *, device: PairedDevice, role: str, scopes: list[str], new_device: bool = False
) -> tuple[str | None, int | None]:
    """Mint a token for (device, role) when it has no usable one; returns (token, issuedAtMs).

    Only hashes are stored, so an existing token cannot be handed out again: a device that lost
    its token rotates it (``device.token.rotate``) or re-pairs. ``new_device``: the caller's
    transaction has just inserted the device row, so it has no token, and none can be added by
    others before that commits: nothing is read or locked.
    """
    if not new_device and device_token_covers(device=device, role=role, scopes=scopes):
        return None, None  # the common reconnect: nothing to mint, no lock needed
    # No savepoint inside a caller's transaction (a connect's, an enrollment's): a failure here fails it.
    with transaction.atomic(savepoint=False):
        record = (
            None
            if new_device
            else DeviceToken.objects.select_for_update(no_key=True).filter(device=device, role=role).first()
        )
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


TOKEN_DELIVERY_IN_BAND = "in-band"
TOKEN_DELIVERY_WITHHELD = "withheld-cross-device"
# Not a wire value: the console and the admin, never the RPC, show the secret once to the Django user
# who rotated it, to hand it over to the device (a node host's token file, say).
TOKEN_DELIVERY_SHOWN_TO_OPERATOR = "shown-to-operator"


def token_state(record: DeviceToken | None) -> str:
    if record is None:
        return "none"
    return "active" if record.revoked_at is None else "revoked"


def device_token_rotate(
    *, device_id: str, role: str, scopes: list[str] | None, actor: Actor, show_to_operator: bool = False
) -> dict:
    """Issue a fresh token; the secret is returned only to the device itself, or with
    ``show_to_operator`` to the Django user acting in the console or the admin (audited as such)."""
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
        before = token_state(DeviceToken.objects.filter(device=device, role=role).first())
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
        connections.connections_close(list(others), reason="device token rotated")
        if actor.device_id == device_id:
            delivery = TOKEN_DELIVERY_IN_BAND
        elif show_to_operator and actor.user is not None:
            delivery = TOKEN_DELIVERY_SHOWN_TO_OPERATOR
        else:
            delivery = TOKEN_DELIVERY_WITHHELD
        audit(
            actor,
            "device.token.rotate",
            "device",
            device_id,
            {"role": role, "scopes": wanted, "before": before, "after": "active", "tokenDelivery": delivery},
        )
    result = {
        "deviceId": device_id,
        "role": role,
        "scopes": wanted,
        "rotatedAtMs": to_ms(now),
        "tokenDelivery": delivery,
    }
    if delivery != TOKEN_DELIVERY_WITHHELD:
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
        connections.connections_close(list(others), reason="device token revoked")
        audit(actor, "device.token.revoke", "device", device_id, {"role": role, "before": "active", "after": "revoked"})
    return {"deviceId": device_id, "role": role, "revokedAtMs": to_ms(now)}
