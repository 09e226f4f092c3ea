"""The migration that gives Django logins operator scopes keeps the logins that existed before working as the
console let them: staff every scope, other active users ``operator.write`` (no node pairing), superusers all
(as ever); inactive users nothing. It makes one group per scope holding that scope's permission."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from gateway import scopes as sc
from gateway.user_scopes import SCOPE_PERMISSIONS, user_scopes

BEFORE = ("gateway", "0004_devices_moved_to_devices_app")
AFTER = ("gateway", "0005_operator_scopes")


def migrate_to(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])


@pytest.fixture(autouse=True)
def every_migration_applied_again_after_the_test():
    """The test stops at ``AFTER``; the tests after it (the readiness check of unapplied migrations among them) need
    the database at every app's latest migration again, whatever was added after ``AFTER``."""
    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_logins_made_before_the_scopes_keep_what_the_console_let_them_do():
    migrate_to(BEFORE)
    try:
        Group.objects.filter(name__startswith="operator.").delete()
        User.objects.create_user("staff", is_staff=True)
        User.objects.create_user("operator")
        User.objects.create_user("gone", is_active=False)
        User.objects.create_superuser("root")
    finally:
        migrate_to(AFTER)

    held = {user.username: set(user_scopes(user)) for user in User.objects.all()}

    assert held == {
        "staff": {sc.ADMIN},
        "operator": {sc.WRITE},
        "gone": set(),
        "root": set(SCOPE_PERMISSIONS),
    }
    for scope, permission in SCOPE_PERMISSIONS.items():
        group = Group.objects.get(name=scope)
        assert [f"gateway.{p.codename}" for p in group.permissions.all()] == [permission]
