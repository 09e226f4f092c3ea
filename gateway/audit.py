"""Who changed what: the actor of a change and the audit row every operator action writes.

Services of every app call :func:`audit` inside their own transaction, so the row commits (or
rolls back) with the change it describes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from . import scopes as sc
from .models import AuditLog


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


def audit(actor: Actor, action: str, target_type: str, target_id: str, data: dict | None = None) -> AuditLog:
    return AuditLog.objects.create(
        actor_user=actor.user if actor.user is not None and actor.user.is_authenticated else None,
        actor=actor.label,
        action=action,
        target_type=target_type,
        target_id=target_id,
        data=data or {},
    )
