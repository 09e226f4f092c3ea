"""Operator scopes for Django users (``gateway/user_scopes.py``): one permission per scope, a group per scope
holding it, and the logins that existed before keep what the console let them do — staff users every scope
(``operator.admin``), other active users ``operator.write`` (sessions; no longer node pairing, which needs
``operator.pairing``). Superusers need nothing: they hold every permission."""

from django.db import migrations, models

SCOPES = {
    "operator.read": ("operator_read", "operator.read: sessions, turns, nodes, environments, usage and logs"),
    "operator.write": (
        "operator_write",
        "operator.write: send, stop, create, fork, dispatch and move sessions (and read)",
    ),
    "operator.pairing": (
        "operator_pairing",
        "operator.pairing: approve, reject and remove devices and nodes, their tokens",
    ),
    "operator.approvals": ("operator_approvals", "operator.approvals: decide exec approvals"),
    "operator.admin": ("operator_admin", "operator.admin: every operator scope"),
}


def create_scope_permissions_and_groups(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    User = apps.get_model("auth", "User")
    # Made here rather than by post_migrate, which runs after every migration: the groups need them now.
    content_type, _ = ContentType.objects.get_or_create(app_label="gateway", model="operatorscope")
    groups = {}
    for scope, (codename, name) in SCOPES.items():
        permission, _ = Permission.objects.get_or_create(
            content_type=content_type, codename=codename, defaults={"name": name}
        )
        group, _ = Group.objects.get_or_create(name=scope)
        group.permissions.add(permission)
        groups[scope] = group
    existing = User.objects.filter(is_active=True, is_superuser=False)
    for user in existing.filter(is_staff=True):
        user.groups.add(groups["operator.admin"])
    for user in existing.filter(is_staff=False):
        user.groups.add(groups["operator.write"])


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0004_devices_moved_to_devices_app"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.CreateModel(
            name="OperatorScope",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
            ],
            options={
                "managed": False,
                "default_permissions": (),
                "permissions": [(codename, name) for codename, name in SCOPES.values()],
            },
        ),
        migrations.RunPython(create_scope_permissions_and_groups, migrations.RunPython.noop),
    ]
