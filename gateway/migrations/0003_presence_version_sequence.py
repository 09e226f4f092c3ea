"""The presence state version as a PostgreSQL sequence (other databases keep it in Django's cache).

A connect registers its connection, commits, raises this version and reads the presence list in one
round trip (``services.connections.connection_register``); with the counter in Redis that took a
round trip of its own between two database round trips.
"""

from django.db import migrations

SEQUENCE = "gateway_presence_version"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")


class Migration(migrations.Migration):
    dependencies = [("gateway", "0002_paireddevice_is_node")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
