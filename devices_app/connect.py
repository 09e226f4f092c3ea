"""Deciding a connect, in OpenClaw's order: credentials, device identity, device proof, pairing; then
registering the connection while its device still holds the role.

The gateway core asks this through its connection authority port (``gateway.ports``) in the connect's
one ``database_sync_to_async`` hop; refusals are :class:`HandshakeRejected` (the error ``res`` and the
close code).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from gateway import scopes as sc
from gateway.auth import (
    auth_failure,
    device_token_limiter,
    is_loopback,
    secret_matches,
    shared_secret_limiter,
    verify_device_proof,
)
from gateway.conf import shared_password, shared_token
from gateway.exceptions import GatewayError, HandshakeRejected, NotPaired
from gateway.handshake import ConnectContext, ConnectOutcome, keeps_unbound_scopes
from gateway.protocol import ConnectParams
from gateway.services.connections import ConnectionRecord

from .models import PairedDevice
from .services import connections, pairing, tokens

logger = logging.getLogger(__name__)

PAIRING_REQUIREMENTS = {
    "not-paired": "device is not approved yet",
    "role-upgrade": "device is asking for a higher role than currently approved",
    "scope-upgrade": "device is asking for more scopes than currently approved",
}


def _reject(error: Exception) -> HandshakeRejected:
    return HandshakeRejected(error)


def _check_credentials(params: ConnectParams, ctx: ConnectContext, role: str) -> tuple[str, Any]:
    """Shared secret first, then a device token. Returns (auth method, device token record|None)."""
    auth = params.auth
    local = is_loopback(ctx.remote_ip)
    token = auth.token if auth else None
    password = auth.password if auth else None
    device_token = auth.deviceToken if auth else None

    if not (token or password or device_token):
        if params.device is None:
            raise _reject(NotPaired("device identity required", details={"code": "DEVICE_IDENTITY_REQUIRED"}))
        expected_kind = "password" if shared_password() and not shared_token() else "token"
        raise _reject(auth_failure(f"{expected_kind}_missing", params=params, local=local))

    limit = shared_secret_limiter.check(ctx.remote_ip)
    if limit.locked:
        raise _reject(auth_failure("rate_limited", params=params, local=local, retry_after_ms=limit.retry_after_ms))

    failure: str | None = None
    if password:
        configured = shared_password()
        if configured is None:
            failure = "password_missing_config"
        elif secret_matches(password, configured):
            shared_secret_limiter.reset(ctx.remote_ip)
            return "password", None
        else:
            failure = "password_mismatch"
    if token:
        configured = shared_token()
        if configured is None:
            failure = failure or "token_missing_config"
        elif secret_matches(token, configured):
            shared_secret_limiter.reset(ctx.remote_ip)
            return "token", None
        else:
            failure = failure or "token_mismatch"

    # `auth.token` may carry a device token when it is not the shared secret.
    candidate = device_token or (token if failure == "token_mismatch" else None)
    if candidate and params.device is not None:
        device_limit = device_token_limiter.check(ctx.remote_ip)
        if device_limit.locked:
            raise _reject(
                auth_failure("rate_limited", params=params, local=local, retry_after_ms=device_limit.retry_after_ms)
            )
        try:
            record = tokens.device_token_verify(device_id=params.device.id, role=role, token=candidate)
        except tokens.DeviceTokenRejected:
            if device_token:
                state = device_token_limiter.record_failure(ctx.remote_ip)
                reason = "rate_limited" if state.locked else "device_token_mismatch"
                raise _reject(
                    auth_failure(reason, params=params, local=local, retry_after_ms=state.retry_after_ms or None)
                ) from None
        else:
            device_token_limiter.reset(ctx.remote_ip)
            if role == sc.ROLE_OPERATOR and not sc.scopes_cover(record.scopes, sc.normalize_scopes(params.scopes)):
                raise _reject(auth_failure("scope_mismatch", params=params, local=local))
            return "device-token", record

    if failure is None:
        # A device token without the device identity it is bound to.
        failure = "device_token_mismatch"
    if failure.endswith("_mismatch"):
        state = shared_secret_limiter.record_failure(ctx.remote_ip)
        if state.locked:
            raise _reject(auth_failure("rate_limited", params=params, local=local, retry_after_ms=state.retry_after_ms))
    raise _reject(auth_failure(failure, params=params, local=local))


def _claim(
    params: ConnectParams,
    ctx: ConnectContext,
    role: str,
    scopes: list[str],
    public_key: str,
    reason: str,
    is_repair: bool,
) -> pairing.PairingClaim:
    client = params.client
    return pairing.PairingClaim(
        device_id=params.device.id,
        public_key=public_key,
        role=role,
        scopes=scopes,
        reason=reason,
        is_repair=is_repair,
        display_name=client.displayName or "",
        platform=client.platform,
        device_family=client.deviceFamily or "",
        model_identifier=client.modelIdentifier or "",
        client_id=client.id,
        client_mode=client.mode,
        client_version=client.version,
        commands=sorted(set(params.commands or [])) if role == sc.ROLE_NODE else [],
        caps=sorted(set(params.caps or [])) if role == sc.ROLE_NODE else [],
        permissions=dict(params.permissions or {}) if role == sc.ROLE_NODE else {},
        remote_ip=ctx.remote_ip or "",
    )


def _pairing_required(request, reason: str, role: str, scopes: list[str], device: PairedDevice | None):
    requirement = PAIRING_REQUIREMENTS[reason]
    request_id = str(request.request_id)
    details = {
        "code": "PAIRING_REQUIRED",
        "reason": reason,
        "requestId": request_id,
        "remediationHint": f"approve with: python manage.py pairing approve {request_id}",
        # Only nodes are asked to pair here (operators pair silently with the shared secret). OpenClaw's clients
        # stop reconnecting after a PAIRING_REQUIRED close ("reconnect paused … waiting for operator action")
        # unless told to wait and retry, as OpenClaw's gateway tells them while an approval can still come without
        # the node's doing (bootstrap, SSH verification). A node host runs unattended: it keeps retrying (backoff
        # up to 30 s), its retries keep its request open, and it connects once an operator approves it.
        "recommendedNextStep": "wait_then_retry",
        "retryable": True,
        "pauseReconnect": False,
        "waitForResolution": True,
        "deviceId": request.device_id,
        "requestedRole": role,
        "requestedScopes": scopes,
    }
    if device is not None:
        details["approvedRoles"] = list(device.roles)
        details["approvedScopes"] = list(device.approved_scopes)
    return HandshakeRejected(
        NotPaired(f"pairing required: {requirement}", details=details),
        close_reason=f"pairing required: {requirement} (requestId: {request_id})",
    )


def authenticate_connect(
    params: ConnectParams, ctx: ConnectContext, *, then: tuple[str, dict] | None = None
) -> ConnectOutcome:
    """Decide and register a connect. ``then``: reads to send with the registration, where it is one
    statement (``connections.connection_register``); their rows come back in the outcome."""
    try:
        return _authenticate_connect(params, ctx, then)
    except GatewayError as error:
        raise HandshakeRejected(error) from None


def _authenticate_connect(params: ConnectParams, ctx: ConnectContext, then: tuple[str, dict] | None) -> ConnectOutcome:
    """Decide a connect, in OpenClaw's order: credentials, device identity, device proof, pairing.

    Side effects that must survive a refusal (a pending pairing request, a limiter count) are
    committed by their own services before the refusal is raised.
    """
    role = params.role or sc.ROLE_OPERATOR
    requested_scopes = sc.normalize_scopes(params.scopes) if role == sc.ROLE_OPERATOR else []
    auth_method, token_record = _check_credentials(params, ctx, role)

    if params.device is None:
        if role == sc.ROLE_NODE:
            raise _reject(NotPaired("device identity required", details={"code": "DEVICE_IDENTITY_REQUIRED"}))
        scopes = requested_scopes if keeps_unbound_scopes(params, ctx, auth_method) else []
        if scopes != requested_scopes:
            logger.info(
                "device-less %s/%s operator from %s: requested scopes cleared",
                params.client.id,
                params.client.mode,
                ctx.remote_ip,
            )
        registered = connections.connection_register(
            record=_record(params, ctx, role, scopes, auth_method, None, None, []), then=then
        )
        return ConnectOutcome(role, scopes, auth_method, None, None, [], None, None, registered.then_rows)

    public_key, _version = verify_device_proof(params, role=role, scopes=list(params.scopes or []), nonce=ctx.nonce)
    device_id = params.device.id
    if role == sc.ROLE_OPERATOR and token_record is None:
        # The usual reconnect of a paired operator with the shared secret: nothing to pair or mint,
        # which the registration itself checks (PostgreSQL), instead of reading device and token first.
        registered = connections.connection_register(
            record=_record(params, ctx, role, requested_scopes, auth_method, device_id, None, []),
            then=then,
            requires_scopes=requested_scopes,
        )
        if registered is not None:
            return ConnectOutcome(
                role, requested_scopes, auth_method, device_id, None, [], None, None, registered.then_rows
            )
    # The token of (device, role) brings its device along: a reconnecting device costs one read.
    stored_token = token_record or tokens.device_token_with_device(device_id=device_id, role=role)
    if stored_token is not None:
        device = stored_token.device
    else:
        device = PairedDevice.objects.filter(device_id=device_id).first()

    if role == sc.ROLE_NODE:
        if device is None or not device.has_role(sc.ROLE_NODE):
            reason = "not-paired" if device is None else "role-upgrade"
            claim = _claim(params, ctx, role, [], public_key, reason, is_repair=device is not None)
            try:
                request, _created = pairing.pairing_request_ensure(claim=claim)
            except pairing.ApprovedMeanwhile as approved:
                device = approved.device
            else:
                raise _pairing_required(request, reason, role, [], device)
    elif device is None or not device.has_role(role):
        if auth_method not in ("token", "password"):
            # A device token of a device that was since removed.
            raise _reject(auth_failure("device_token_mismatch", params=params, local=is_loopback(ctx.remote_ip)))

    silent_pairing = role == sc.ROLE_OPERATOR and auth_method in ("token", "password")
    pairing_needed = silent_pairing and not pairing.operator_device_covered(device, requested_scopes)
    token_scopes = requested_scopes if role == sc.ROLE_OPERATOR else []
    issued_token, issued_at = (params.auth.deviceToken or params.auth.token, None) if token_record else (None, None)
    # The common reconnect of a paired device (with its token, or the shared secret and a token on
    # file) writes one row or nothing: no transaction, which on SQLite would take the database's
    # write lock for every connect.
    if not pairing_needed and token_record is not None:
        tokens.device_token_touch(token_record)
    elif pairing_needed or not tokens.token_covers(stored_token, token_scopes):
        # Pairing (silent, for shared-secret operators) and the first device token commit together:
        # one durable transaction, so a crash cannot leave a paired device without its token record.
        with transaction.atomic():
            created = False
            if silent_pairing:
                claim = _claim(
                    params, ctx, role, requested_scopes, public_key, "not-paired", is_repair=device is not None
                )
                device, _changed, created = pairing.operator_device_auto_approve(claim=claim, known=device)
            if token_record is not None:
                tokens.device_token_touch(token_record)
            else:
                issued_token, issued_at = tokens.device_token_ensure(
                    device=device, role=role, scopes=token_scopes, new_device=created
                )

    commands: list[str] = []
    if role == sc.ROLE_NODE:
        approved = set(device.approved_commands or [])
        commands = sorted(c for c in set(params.commands or []) if c in approved)
    registered = connections.connection_register(
        record=_record(params, ctx, role, requested_scopes, auth_method, device_id, device, commands), then=then
    )
    return ConnectOutcome(
        role=role,
        scopes=requested_scopes,
        auth_method=auth_method,
        device_id=device_id,
        node_id=device_id if role == sc.ROLE_NODE else None,
        commands=commands,
        device_token=issued_token,
        device_token_issued_at_ms=issued_at,
        then_rows=registered.then_rows,
    )


def _record(
    params: ConnectParams,
    ctx: ConnectContext,
    role: str,
    scopes: list[str],
    auth_method: str,
    device_id: str | None,
    device: PairedDevice | None,
    commands: list[str],
) -> ConnectionRecord:
    client = params.client
    is_node = role == sc.ROLE_NODE
    return ConnectionRecord(
        conn_id=ctx.conn_id,
        boot_id=ctx.boot_id,
        channel_name=ctx.channel_name,
        role=role,
        scopes=scopes,
        auth_method=auth_method,
        device_id=device_id or "",
        node_id=device_id if is_node else None,
        client_id=client.id,
        client_mode=client.mode,
        client_version=client.version,
        display_name=client.displayName or "",
        platform=client.platform,
        device_family=client.deviceFamily or "",
        model_identifier=client.modelIdentifier or "",
        instance_id=client.instanceId or "",
        remote_ip=ctx.remote_ip or "",
        caps=sorted(set(params.caps or [])) if is_node else [],
        commands=commands,
        permissions=dict(params.permissions or {}) if is_node else {},
        path_env=(params.pathEnv or "") if is_node else "",
    )


class DevicesConnectionAuthority:
    """The gateway core's connection authority (``gateway.ports``): connects decided and connections'
    comings and goings recorded here, on the devices they belong to."""

    def authenticate_connect(
        self, params: ConnectParams, ctx: ConnectContext, *, then: tuple[str, dict] | None = None
    ) -> ConnectOutcome:
        return authenticate_connect(params, ctx, then=then)

    def connection_unregister(self, *, conn_id: str) -> bool:
        return connections.connection_unregister(conn_id=conn_id)

    def process_unregister(self, *, boot_id: str) -> None:
        connections.process_unregister(boot_id=boot_id)


connection_authority = DevicesConnectionAuthority()
