"""Which operator scopes a Django user holds: the console, the admin and the audit actor ask here, so a login
gets exactly the rights over HTTP that a device token with the same scopes gets over the wire.

One permission per scope (``OperatorScope``'s, app ``gateway``), given to a user directly or through a group
(the migration makes one group per scope, named after it). The wire's implications hold: ``operator.admin``
satisfies every scope and ``operator.write`` satisfies ``operator.read``. An active superuser holds every
permission, so every scope; staff status alone holds none (it only opens the admin site).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import scopes as sc
from .registry import registry

SCOPE_PERMISSIONS: dict[str, str] = {
    sc.READ: "gateway.operator_read",
    sc.WRITE: "gateway.operator_write",
    sc.PAIRING: "gateway.operator_pairing",
    sc.APPROVALS: "gateway.operator_approvals",
    sc.ADMIN: "gateway.operator_admin",
}


def user_scopes(user: Any) -> tuple[str, ...]:
    """The scopes of ``user``'s permissions (none for an anonymous or inactive user). ``has_perm`` caches the
    user's permissions on the object, so a request asks the database once whatever it checks."""
    if user is None or not user.is_authenticated or not user.is_active:
        return ()
    return tuple(scope for scope, permission in SCOPE_PERMISSIONS.items() if user.has_perm(permission))


def user_has_scope(user: Any, scope: str) -> bool:
    return sc.scope_satisfied(user_scopes(user), scope)


def method_scope(method: str) -> str | None:
    """The scope the wire asks of an operator calling ``method`` (``KeyError`` for a method nobody registered:
    a console view or admin action naming one is a bug, found at its first use)."""
    return registry.methods[method].scope


def missing_scope(user: Any, methods: Iterable[str] = (), scope: str | None = None) -> str | None:
    """The first scope ``user`` lacks to do what ``methods`` do on the wire (and to hold ``scope``, for work no
    method does); None when nothing is missing. A method without a scope (``health``) needs a login only."""
    needed = [wanted for wanted in (scope, *(method_scope(method) for method in methods)) if wanted is not None]
    if user is None or not user.is_authenticated or not user.is_active:
        return needed[0] if needed else "a login"
    held = user_scopes(user)
    return next((wanted for wanted in needed if not sc.scope_satisfied(held, wanted)), None)


def user_may_call(user: Any, method: str) -> bool:
    """Whether ``user`` may do through the console or the admin what ``method`` does on the wire."""
    return missing_scope(user, [method]) is None
