"""Typed access to ``settings.OPENCLAW_GATEWAY`` and the shared secret kept in the state dir."""

from __future__ import annotations

import secrets
from functools import lru_cache
from pathlib import Path
from typing import Any

from django.conf import settings

from . import secret_files


def gateway_setting(name: str) -> Any:
    return settings.OPENCLAW_GATEWAY[name]


def token_file() -> Path:
    return Path(settings.STATE_DIR) / "gateway-token"


def ensure_gateway_token() -> tuple[str, bool]:
    """The shared token, generating and storing one on first start. Returns (token, created)."""
    configured = gateway_setting("TOKEN")
    if configured:
        return configured, False
    token, created = secret_files.read_or_create(token_file(), lambda: secrets.token_urlsafe(32))
    if created:
        shared_token.cache_clear()
    return token, created


@lru_cache(maxsize=1)
def shared_token() -> str | None:
    configured = gateway_setting("TOKEN")
    if configured:
        return configured
    path = token_file()
    if path.exists():
        return path.read_text(encoding="utf-8").strip() or None
    return None


def shared_password() -> str | None:
    return gateway_setting("PASSWORD") or None


def auth_mode() -> str:
    return "password" if shared_password() and not shared_token() else "token"
