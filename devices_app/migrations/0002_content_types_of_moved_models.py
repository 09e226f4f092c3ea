"""The content types (and so the permissions and admin history) of the moved device models follow them.

A database made before the move has ``gateway.paireddevice`` and friends in ``django_content_type``; renamed
in place, their permissions and admin log entries keep pointing at the models. A fresh database has none
yet (Django creates content types after migrating): nothing to do then.
"""

from django.db import migrations

MOVED = ("paireddevice", "devicepairingrequest", "devicetoken")


def follow_the_models(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    alias = schema_editor.connection.alias
    for model in MOVED:
        if ContentType.objects.using(alias).filter(app_label="devices_app", model=model).exists():
            continue
        ContentType.objects.using(alias).filter(app_label="gateway", model=model).update(app_label="devices_app")


def back_to_the_gateway(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    alias = schema_editor.connection.alias
    for model in MOVED:
        if ContentType.objects.using(alias).filter(app_label="gateway", model=model).exists():
            continue
        ContentType.objects.using(alias).filter(app_label="devices_app", model=model).update(app_label="gateway")


class Migration(migrations.Migration):

    dependencies = [
        ("devices_app", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(follow_the_models, back_to_the_gateway, elidable=False),
    ]
