"""Paired devices, pairing requests and device tokens belong to devices_app now (devices_app/0001): removed
from this app's state only, their tables and rows stay."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('gateway', '0003_presence_version_sequence'),
        ('devices_app', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.RemoveIndex(
                    model_name='devicepairingrequest',
                    name='pairing_status_created_idx',
                ),
                migrations.RemoveConstraint(
                    model_name='devicepairingrequest',
                    name='one_pending_pairing_request_per_device',
                ),
                migrations.DeleteModel(
                    name='DevicePairingRequest',
                ),
                migrations.RemoveConstraint(
                    model_name='devicetoken',
                    name='one_token_per_device_role',
                ),
                migrations.DeleteModel(
                    name='DeviceToken',
                ),
                migrations.DeleteModel(
                    name='PairedDevice',
                ),
            ],
        ),
    ]
