"""Devices (Ed25519 identities) operators approved, their pairing requests and per-role tokens.

The tables were created by the gateway app and keep their names (``db_table``): moving the models
here changed Django's state only (migrations ``devices_app/0001`` and ``gateway/0004``).
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q


class PairedDevice(models.Model):
    """A device (Ed25519 identity) an operator approved, with the roles and scopes it may use."""

    device_id = models.CharField(primary_key=True, max_length=64)
    public_key = models.CharField(max_length=128)
    display_name = models.CharField(max_length=200, blank=True)
    # Set by node.rename; wins over the name the node announces when it connects.
    operator_label = models.CharField(max_length=200, blank=True)
    platform = models.CharField(max_length=100, blank=True)
    device_family = models.CharField(max_length=100, blank=True)
    model_identifier = models.CharField(max_length=100, blank=True)
    client_id = models.CharField(max_length=64, blank=True)
    client_mode = models.CharField(max_length=32, blank=True)
    client_version = models.CharField(max_length=100, blank=True)
    roles = models.JSONField(default=list)
    # Derived from roles on save: lets node.list select node devices in SQL on every backend.
    is_node = models.BooleanField(default=False, db_index=True, editable=False)
    approved_scopes = models.JSONField(default=list)
    # The node command surface an operator approved; invocations outside it are refused.
    approved_commands = models.JSONField(default=list)
    approved_caps = models.JSONField(default=list)
    approved_permissions = models.JSONField(default=dict)
    remote_ip = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    approved_at = models.DateTimeField()
    last_connected_at = models.DateTimeField(null=True, blank=True)
    last_disconnected_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    last_seen_reason = models.CharField(max_length=64, blank=True)
    # What a node host declares of itself while connected (node.skills.update, node.pluginTools.update): the
    # latest declaration replaces the previous one; bounded by devices_app.schemas (NODE_*_MAX_*).
    node_skills = models.JSONField(default=list, blank=True)
    node_skills_updated_at = models.DateTimeField(null=True, blank=True)
    node_plugin_tools = models.JSONField(default=list, blank=True)
    node_plugin_tools_updated_at = models.DateTimeField(null=True, blank=True)
    # The node host's latest node.host.stats sample with the gateway's receipt time (updatedAtMs), as OpenClaw's
    # paired node record keeps lastHostStats: shown on node.list by every gateway process, also once offline.
    host_stats = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "gateway_paireddevice"  # the table the gateway app created (devices_app/migrations/0001)
        ordering = ["-approved_at"]

    def __str__(self) -> str:
        return f"{self.label} ({self.device_id[:12]})"

    def save(self, *args, **kwargs):
        self.is_node = self.has_role("node")
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and "roles" in update_fields:
            kwargs["update_fields"] = {*update_fields, "is_node"}
        super().save(*args, **kwargs)

    @property
    def label(self) -> str:
        return self.operator_label or self.display_name or self.device_id[:12]

    def has_role(self, role: str) -> bool:
        return role in (self.roles or [])


class PairingStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


class DevicePairingRequest(models.Model):
    """A device asking to be paired (or for a higher role/more scopes); expires after 5 minutes."""

    request_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    device_id = models.CharField(max_length=64, db_index=True)
    public_key = models.CharField(max_length=128)
    display_name = models.CharField(max_length=200, blank=True)
    platform = models.CharField(max_length=100, blank=True)
    device_family = models.CharField(max_length=100, blank=True)
    model_identifier = models.CharField(max_length=100, blank=True)
    client_id = models.CharField(max_length=64, blank=True)
    client_mode = models.CharField(max_length=32, blank=True)
    client_version = models.CharField(max_length=100, blank=True)
    role = models.CharField(max_length=32)
    scopes = models.JSONField(default=list)
    commands = models.JSONField(default=list)
    caps = models.JSONField(default=list)
    permissions = models.JSONField(default=dict)
    remote_ip = models.CharField(max_length=64, blank=True)
    reason = models.CharField(max_length=32)
    is_repair = models.BooleanField(default=False)
    silent = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=PairingStatus.choices, default=PairingStatus.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=200, blank=True)

    class Meta:
        db_table = "gateway_devicepairingrequest"
        ordering = ["-created_at"]
        constraints = [
            # requestDevicePairing is idempotent per device: at most one open request each.
            models.UniqueConstraint(
                fields=["device_id"],
                condition=Q(status="pending"),
                name="one_pending_pairing_request_per_device",
            ),
        ]
        indexes = [
            # device.pair.list / node.pair.list and the expiry sweep read open requests by age.
            models.Index(fields=["status", "created_at"], name="pairing_status_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.role} pairing {self.request_id} ({self.status})"


class DeviceToken(models.Model):
    """A per-role bearer token of a paired device. Only its SHA-256 is stored."""

    device = models.ForeignKey(PairedDevice, on_delete=models.CASCADE, related_name="tokens")
    role = models.CharField(max_length=32)
    token_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    rotated_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "gateway_devicetoken"
        constraints = [
            models.UniqueConstraint(fields=["device", "role"], name="one_token_per_device_role"),
        ]

    def __str__(self) -> str:
        state = "revoked" if self.revoked_at else "active"
        return f"{self.role} token of {self.device_id[:12]} ({state})"
