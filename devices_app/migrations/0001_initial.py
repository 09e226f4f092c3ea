"""The device models move from the gateway app to this one: Django's state only; the tables keep their
names (``db_table``) and rows. gateway/0004 removes them from the gateway app's state."""

import django.db.models.deletion
import uuid
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        # The tables exist already: the gateway app created them (gateway/0001, 0002).
        ('gateway', '0003_presence_version_sequence'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name='PairedDevice',
                    fields=[
                        ('device_id', models.CharField(max_length=64, primary_key=True, serialize=False)),
                        ('public_key', models.CharField(max_length=128)),
                        ('display_name', models.CharField(blank=True, max_length=200)),
                        ('operator_label', models.CharField(blank=True, max_length=200)),
                        ('platform', models.CharField(blank=True, max_length=100)),
                        ('device_family', models.CharField(blank=True, max_length=100)),
                        ('model_identifier', models.CharField(blank=True, max_length=100)),
                        ('client_id', models.CharField(blank=True, max_length=64)),
                        ('client_mode', models.CharField(blank=True, max_length=32)),
                        ('client_version', models.CharField(blank=True, max_length=100)),
                        ('roles', models.JSONField(default=list)),
                        ('is_node', models.BooleanField(db_index=True, default=False, editable=False)),
                        ('approved_scopes', models.JSONField(default=list)),
                        ('approved_commands', models.JSONField(default=list)),
                        ('approved_caps', models.JSONField(default=list)),
                        ('approved_permissions', models.JSONField(default=dict)),
                        ('remote_ip', models.CharField(blank=True, max_length=64)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('approved_at', models.DateTimeField()),
                        ('last_connected_at', models.DateTimeField(blank=True, null=True)),
                        ('last_disconnected_at', models.DateTimeField(blank=True, null=True)),
                        ('last_seen_at', models.DateTimeField(blank=True, null=True)),
                        ('last_seen_reason', models.CharField(blank=True, max_length=64)),
                    ],
                    options={
                        'db_table': 'gateway_paireddevice',
                        'ordering': ['-approved_at'],
                    },
                ),
                migrations.CreateModel(
                    name='DevicePairingRequest',
                    fields=[
                        ('request_id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('device_id', models.CharField(db_index=True, max_length=64)),
                        ('public_key', models.CharField(max_length=128)),
                        ('display_name', models.CharField(blank=True, max_length=200)),
                        ('platform', models.CharField(blank=True, max_length=100)),
                        ('device_family', models.CharField(blank=True, max_length=100)),
                        ('model_identifier', models.CharField(blank=True, max_length=100)),
                        ('client_id', models.CharField(blank=True, max_length=64)),
                        ('client_mode', models.CharField(blank=True, max_length=32)),
                        ('client_version', models.CharField(blank=True, max_length=100)),
                        ('role', models.CharField(max_length=32)),
                        ('scopes', models.JSONField(default=list)),
                        ('commands', models.JSONField(default=list)),
                        ('caps', models.JSONField(default=list)),
                        ('permissions', models.JSONField(default=dict)),
                        ('remote_ip', models.CharField(blank=True, max_length=64)),
                        ('reason', models.CharField(max_length=32)),
                        ('is_repair', models.BooleanField(default=False)),
                        ('silent', models.BooleanField(default=False)),
                        ('status', models.CharField(choices=[('pending', 'Pending'), ('approved', 'Approved'), ('rejected', 'Rejected'), ('expired', 'Expired')], default='pending', max_length=16)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('expires_at', models.DateTimeField()),
                        ('resolved_at', models.DateTimeField(blank=True, null=True)),
                        ('resolved_by', models.CharField(blank=True, max_length=200)),
                    ],
                    options={
                        'db_table': 'gateway_devicepairingrequest',
                        'ordering': ['-created_at'],
                        'indexes': [models.Index(fields=['status', 'created_at'], name='pairing_status_created_idx')],
                        'constraints': [models.UniqueConstraint(condition=models.Q(('status', 'pending')), fields=('device_id',), name='one_pending_pairing_request_per_device')],
                    },
                ),
                migrations.CreateModel(
                    name='DeviceToken',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('role', models.CharField(max_length=32)),
                        ('token_hash', models.CharField(max_length=64, unique=True)),
                        ('scopes', models.JSONField(default=list)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('rotated_at', models.DateTimeField(blank=True, null=True)),
                        ('revoked_at', models.DateTimeField(blank=True, null=True)),
                        ('last_used_at', models.DateTimeField(blank=True, null=True)),
                        ('device', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='tokens', to='devices_app.paireddevice')),
                    ],
                    options={
                        'db_table': 'gateway_devicetoken',
                        'constraints': [models.UniqueConstraint(fields=('device', 'role'), name='one_token_per_device_role')],
                    },
                ),
            ],
        ),
    ]
