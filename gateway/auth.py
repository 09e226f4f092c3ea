"""Connect-time credential primitives: shared secret, device token hashing, the brute-force limiter, device
proof, and OpenClaw's auth failure messages.

Pure functions and cache access only: the connect's decision that uses them, and every pairing and token
change, are devices_app's (``devices_app/connect.py``, ``devices_app/services/``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import secrets
import time
from dataclasses import dataclass

from django.core.cache import cache

from openclaw_client.identity import (
    build_device_auth_payload,
    derive_device_id,
    load_public_key,
    normalize_public_key,
    verify_signature,
)

from . import metrics
from .conf import gateway_setting
from .exceptions import InvalidRequest
from .protocol import ConnectParams


def secret_matches(provided: str, expected: str) -> bool:
    """Constant-time comparison that does not leak the expected length."""
    return hmac.compare_digest(
        hashlib.sha256(provided.encode("utf-8")).digest(),
        hashlib.sha256(expected.encode("utf-8")).digest(),
    )


def new_device_token() -> str:
    return secrets.token_urlsafe(32)


def hash_device_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def is_loopback(address: str | None) -> bool:
    if not address:
        return False
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return address == "localhost"


# --- Brute-force limiter --------------------------------------------------------------------


@dataclass(frozen=True)
class RateLimitState:
    locked: bool
    retry_after_ms: int = 0


class AuthRateLimiter:
    """Per (scope, client address): ``MAX_FAILURES`` failures in a window lock the address out for ``LOCKOUT_MS``.

    The window is fixed: it opens at the first failure and closes ``WINDOW_MS`` later, whatever
    follows; the next failure opens a new one. (OpenClaw slides it; a fixed window lets the count be
    one atomic counter.) The failure that reaches ``MAX_FAILURES`` and every later one in the same
    window answer "locked". A success clears the count, not a lockout.

    Kept in Django's cache so every gateway process sees the same counts (Redis in production),
    through ``add`` + ``incr``, which are atomic on Redis and on the local-memory cache: failures
    recorded at the same moment are all counted. Attempts that passed :meth:`check` before the
    lock was set are still tried (at most one per concurrent connection of the client).
    """

    def __init__(self, scope: str):
        self.scope = scope

    @staticmethod
    def _config() -> dict:
        return gateway_setting("AUTH_RATE_LIMIT")

    def _exempt(self, address: str | None) -> bool:
        return bool(self._config()["EXEMPT_LOOPBACK"]) and is_loopback(address)

    def _keys(self, address: str) -> tuple[str, str]:
        return f"authfail:{self.scope}:{address}", f"authlock:{self.scope}:{address}"

    def check(self, address: str | None) -> RateLimitState:
        if not address or self._exempt(address):
            return RateLimitState(locked=False)
        _, lock_key = self._keys(address)
        locked_until = cache.get(lock_key)
        now_ms = int(time.time() * 1000)
        if locked_until and locked_until > now_ms:
            return RateLimitState(locked=True, retry_after_ms=locked_until - now_ms)
        return RateLimitState(locked=False)

    def record_failure(self, address: str | None) -> RateLimitState:
        if not address or self._exempt(address):
            return RateLimitState(locked=False)
        config = self._config()
        fail_key, lock_key = self._keys(address)
        failures = self._count_failure(fail_key, _seconds(config["WINDOW_MS"]))
        if failures < config["MAX_FAILURES"]:
            return RateLimitState(locked=False)
        locked_until = int(time.time() * 1000) + config["LOCKOUT_MS"]
        cache.set(lock_key, locked_until, timeout=_seconds(config["LOCKOUT_MS"]))
        if failures == config["MAX_FAILURES"]:  # the failure that locked it; the later ones find it locked
            metrics.record_auth_lockout(self.scope)
        return RateLimitState(locked=True, retry_after_ms=config["LOCKOUT_MS"])

    @staticmethod
    def _count_failure(fail_key: str, window_s: int) -> int:
        """This failure counted in the open window (opened by it if none is): the count so far."""
        # A no-op while a window is open: its expiry stays where the first failure set it.
        cache.add(fail_key, 0, timeout=window_s)
        try:
            failures = cache.incr(fail_key)
        except ValueError:  # the window closed between the two calls: this failure opens the next
            cache.add(fail_key, 0, timeout=window_s)
            failures = cache.incr(fail_key)
        if failures == 1:
            # Django's RedisCache.incr asks EXISTS, then INCRs: a window that closes in between is
            # made again by INCR, at 1 and without an expiry. The failure counted 1 opened the
            # window, so it sets (or sets again) the expiry.
            cache.touch(fail_key, window_s)
        return failures

    def reset(self, address: str | None) -> None:
        # An exempt address never records a failure: nothing to delete (a round trip to Redis saved).
        if address and not self._exempt(address):
            fail_key, _ = self._keys(address)
            cache.delete(fail_key)


def _seconds(ms: int) -> int:
    """A cache timeout for ``ms``: whole seconds, rounded up (a timeout of 0 would delete the key at once)."""
    return max(1, math.ceil(ms / 1000))


shared_secret_limiter = AuthRateLimiter("shared-secret")
device_token_limiter = AuthRateLimiter("device-token")


# --- Auth failure messages (OpenClaw auth-messages) -----------------------------------------


def _token_hint(client_id: str, client_mode: str, local: bool) -> str:
    if client_id == "cli" and client_mode == "cli":
        return (
            "use this gateway's gateway.auth.token or pair the device"
            if local
            else "set gateway.remote.token to match gateway.auth.token"
        )
    return "provide gateway auth token"


def _password_hint(client_id: str, client_mode: str, local: bool) -> str:
    if client_id == "cli" and client_mode == "cli":
        return (
            "use this gateway's gateway.auth.password"
            if local
            else "set gateway.remote.password to match gateway.auth.password"
        )
    return "provide gateway auth password"


AUTH_REASON_CODES = {
    "token_missing": "AUTH_TOKEN_MISSING",
    "token_mismatch": "AUTH_TOKEN_MISMATCH",
    "token_missing_config": "AUTH_TOKEN_NOT_CONFIGURED",
    "password_missing": "AUTH_PASSWORD_MISSING",
    "password_mismatch": "AUTH_PASSWORD_MISMATCH",
    "password_missing_config": "AUTH_PASSWORD_NOT_CONFIGURED",
    "rate_limited": "AUTH_RATE_LIMITED",
    "device_token_mismatch": "AUTH_DEVICE_TOKEN_MISMATCH",
    "scope_mismatch": "AUTH_SCOPE_MISMATCH",
}

NEXT_STEPS = {
    "token_missing": "update_auth_configuration",
    "token_missing_config": "update_auth_configuration",
    "password_missing": "update_auth_configuration",
    "password_missing_config": "update_auth_configuration",
    "token_mismatch": "update_auth_credentials",
    "password_mismatch": "update_auth_credentials",
    "device_token_mismatch": "update_auth_credentials",
    "scope_mismatch": "review_auth_configuration",
    "rate_limited": "wait_then_retry",
}


def auth_failure(
    reason: str,
    *,
    params: ConnectParams,
    local: bool,
    retry_after_ms: int | None = None,
) -> InvalidRequest:
    metrics.record_auth_failure(reason if reason in AUTH_REASON_CODES else "other")
    client_id, client_mode = params.client.id, params.client.mode
    messages = {
        "token_missing": f"unauthorized: gateway token missing ({_token_hint(client_id, client_mode, local)})",
        "token_mismatch": f"unauthorized: gateway token mismatch ({_token_hint(client_id, client_mode, local)})",
        "token_missing_config": "unauthorized: gateway token not configured on gateway (set gateway.auth.token)",
        "password_missing": (
            f"unauthorized: gateway password missing ({_password_hint(client_id, client_mode, local)})"
        ),
        "password_mismatch": (
            f"unauthorized: gateway password mismatch ({_password_hint(client_id, client_mode, local)})"
        ),
        "password_missing_config": (
            "unauthorized: gateway password not configured on gateway (set gateway.auth.password)"
        ),
        "rate_limited": "unauthorized: too many failed authentication attempts (retry later)",
        "device_token_mismatch": "unauthorized: device token mismatch (rotate/reissue device token)",
        "scope_mismatch": "unauthorized: device token scope mismatch (re-pair or approve scope upgrade)",
    }
    auth = params.auth
    provided_token = bool(auth and auth.token)
    can_retry_with_device_token = (
        reason == "token_mismatch" and params.device is not None and provided_token and not auth.deviceToken
    )
    details = {
        "code": AUTH_REASON_CODES.get(reason, "AUTH_UNAUTHORIZED"),
        "authReason": reason,
        "canRetryWithDeviceToken": can_retry_with_device_token,
        "recommendedNextStep": (
            "retry_with_device_token"
            if can_retry_with_device_token
            else NEXT_STEPS.get(reason, "review_auth_configuration")
        ),
    }
    return InvalidRequest(
        messages.get(reason, "unauthorized"),
        details=details,
        retryable=True if reason == "rate_limited" else None,
        retry_after_ms=retry_after_ms,
    )


# --- Device proof ---------------------------------------------------------------------------

DEVICE_AUTH_CODES = {
    "device-nonce-missing": "DEVICE_AUTH_NONCE_REQUIRED",
    "device-nonce-mismatch": "DEVICE_AUTH_NONCE_MISMATCH",
    "device-signature": "DEVICE_AUTH_SIGNATURE_INVALID",
    "device-signature-stale": "DEVICE_AUTH_SIGNATURE_EXPIRED",
    "device-id-mismatch": "DEVICE_AUTH_DEVICE_ID_MISMATCH",
    "device-public-key": "DEVICE_AUTH_PUBLIC_KEY_INVALID",
}


def _device_auth_invalid(reason: str, message: str) -> InvalidRequest:
    metrics.record_auth_failure(reason)
    return InvalidRequest(message, details={"code": DEVICE_AUTH_CODES[reason], "reason": reason})


def signature_token(params: ConnectParams) -> str | None:
    """The credential a device signs: the shared token, else its device token."""
    auth = params.auth
    if auth is None:
        return None
    return auth.token or auth.deviceToken or auth.bootstrapToken


def verify_device_proof(
    params: ConnectParams, *, role: str, scopes: list[str], nonce: str, now_ms: int | None = None
) -> tuple[str, str]:
    """Check the device's signature over this connection's challenge.

    Order of checks, each with OpenClaw's message: id derived from the key, signature age, nonce
    present, nonce of this connection, key is a 32-byte Ed25519 key, signature over v3 then v2.
    Returns (normalized public key, payload version).
    """
    device = params.device
    assert device is not None
    derived = derive_device_id(device.publicKey)
    if not derived or derived != device.id:
        raise _device_auth_invalid("device-id-mismatch", "device identity mismatch")
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    if abs(now - device.signedAt) > gateway_setting("DEVICE_SIGNATURE_SKEW_MS"):
        raise _device_auth_invalid("device-signature-stale", "device signature expired")
    provided_nonce = (device.nonce or "").strip()
    if not provided_nonce:
        raise _device_auth_invalid("device-nonce-missing", "device nonce required")
    if not hmac.compare_digest(provided_nonce.encode(), nonce.encode()):
        raise _device_auth_invalid("device-nonce-mismatch", "device nonce mismatch")
    public_key = load_public_key(device.publicKey)
    normalized = normalize_public_key(device.publicKey)
    if public_key is None or normalized is None:
        raise _device_auth_invalid("device-public-key", "device public key invalid")
    common = dict(
        device_id=device.id,
        client_id=params.client.id,
        client_mode=params.client.mode,
        role=role,
        scopes=scopes,
        signed_at_ms=device.signedAt,
        token=signature_token(params),
        nonce=provided_nonce,
    )
    v3 = build_device_auth_payload(
        version="v3", platform=params.client.platform, device_family=params.client.deviceFamily, **common
    )
    if verify_signature(public_key, v3, device.signature):
        return normalized, "v3"
    if verify_signature(public_key, build_device_auth_payload(version="v2", **common), device.signature):
        return normalized, "v2"
    raise _device_auth_invalid("device-signature", "device signature invalid")
