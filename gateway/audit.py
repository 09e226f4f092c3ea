"""Who changed what: the actor of a change and the audit row every operator action writes.

Services of every app call :func:`audit` inside their own transaction, so the row commits (or
rolls back) with the change it describes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from . import scopes as sc
from .models import AuditLog
from .user_scopes import user_scopes

logger = logging.getLogger(__name__)
# The audit data's keys that explain a change; the rest (documents, lists of runs) stays in the audit row.
LOGGED_DATA_KEYS = ("reason", "before", "after", "decision")
MAX_LOGGED_VALUE_CHARS = 500


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
    def for_user(cls, user: AbstractBaseUser, *, scopes: tuple[str, ...] | None = None) -> Actor:
        """A Django user, with the scopes their permissions give (``scopes``: what authenticated the request
        instead, as the gateway token does on the JSON API)."""
        held = user_scopes(user) if scopes is None else scopes
        return cls(label=f"user:{user.get_username()}", user=user, scopes=held)

    @classmethod
    def system(cls, label: str = "gateway") -> Actor:
        return cls(label=label)

    def has_scope(self, scope: str) -> bool:
        return sc.scope_satisfied(self.scopes, scope)


def audit(actor: Actor, action: str, target_type: str, target_id: str, data: dict | None = None) -> AuditLog:
    """The audit row, in the caller's transaction, and its log line once that commits (a change that rolls back
    is neither audited nor logged)."""
    summary = " ".join(
        f"{key}={str(data[key])[:MAX_LOGGED_VALUE_CHARS]}" for key in LOGGED_DATA_KEYS if data and data.get(key)
    )
    transaction.on_commit(
        lambda: logger.info(
            "audit: %s %s %s:%s%s",
            actor.label,
            action,
            target_type,
            target_id,
            f" {summary}" if summary else "",
            extra={"audit_action": action, "actor": actor.label},
        )
    )
    return AuditLog.objects.create(
        actor_user=actor.user if actor.user is not None and actor.user.is_authenticated else None,
        actor=actor.label,
        action=action,
        target_type=target_type,
        target_id=target_id,
        data=data or {},
    )
