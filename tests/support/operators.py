"""Console and admin logins with operator scopes (``gateway/user_scopes.py``): the scopes are given as the
permissions an administrator would give them, so a test's user holds exactly what it names."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from gateway.user_scopes import SCOPE_PERMISSIONS

PASSWORD = "a-long-enough-password"


def grant(user: Any, *scopes: str) -> Any:
    """Give ``user`` the permission of each scope (the user object forgets its cached permissions)."""
    codenames = [SCOPE_PERMISSIONS[scope].removeprefix("gateway.") for scope in scopes]
    permissions = list(Permission.objects.filter(content_type__app_label="gateway", codename__in=codenames))
    assert len(permissions) == len(codenames), f"unknown scope among {scopes}"
    user.user_permissions.add(*permissions)
    for cache in ("_perm_cache", "_user_perm_cache", "_group_perm_cache"):
        user.__dict__.pop(cache, None)
    return user


def operator_user(username: str, *scopes: str, password: str = PASSWORD, **fields: Any) -> Any:
    """A saved, active login holding ``scopes`` (``is_staff`` and the like in ``fields``)."""
    user = get_user_model().objects.create_user(username=username, password=password, **fields)
    return grant(user, *scopes)
