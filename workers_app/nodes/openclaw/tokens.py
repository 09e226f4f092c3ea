"""Bearer tokens of OpenClaw's transfer routes (bundle download, workspace transfers): minted per operation,
bound to its purpose and subject, kept only as a hash in the cache the gateway's processes share (Redis when
configured, else the one process's memory), revoked when the operation ends.

A single-use token is taken by deleting its record: of two concurrent takes only the one whose delete removed
the record wins (the cache's delete answers whether it did).
"""

from __future__ import annotations

import hashlib
import secrets

from django.core.cache import cache

TOKEN_BYTES = 32
TOKEN_LENGTH = 43  # base64url of 32 bytes, unpadded: OpenClaw's archive.token shape
KEY_PREFIX = "workers:openclaw:transfer-token:"


def _key(token: str) -> str:
    return KEY_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def transfer_token_mint(purpose: str, subject: str, *, ttl_s: int, single_use: bool) -> str:
    token = secrets.token_urlsafe(TOKEN_BYTES)
    cache.set(_key(token), {"purpose": purpose, "subject": subject, "singleUse": single_use}, timeout=ttl_s)
    return token


def transfer_token_take(token: str, purpose: str, subject: str) -> bool:
    """Whether ``token`` is current for ``purpose`` on ``subject`` (a single-use token is consumed by this)."""
    if not isinstance(token, str) or len(token) != TOKEN_LENGTH:
        return False
    key = _key(token)
    record = cache.get(key)
    if not isinstance(record, dict):
        return False
    if record.get("purpose") != purpose or record.get("subject") != subject:
        return False
    if record.get("singleUse"):
        return bool(cache.delete(key))
    return True


def transfer_token_revoke(token: str) -> None:
    cache.delete(_key(token))
