from __future__ import annotations

import uuid

from django.conf import settings
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

    class Meta:
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
        constraints = [
            models.UniqueConstraint(fields=["device", "role"], name="one_token_per_device_role"),
        ]

    def __str__(self) -> str:
        state = "revoked" if self.revoked_at else "active"
        return f"{self.role} token of {self.device_id[:12]} ({state})"


class GatewayProcess(models.Model):
    """A running gateway process; connections it registered die with its heartbeat."""

    boot_id = models.UUIDField(primary_key=True)
    hostname = models.CharField(max_length=200)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.hostname}:{self.pid} ({self.boot_id})"


class GatewayConnection(models.Model):
    """A live, authenticated WebSocket connection, visible to every gateway process.

    Nodes are invoked through the channel named here, whichever process holds the socket.
    """

    conn_id = models.UUIDField(primary_key=True)
    process = models.ForeignKey(GatewayProcess, on_delete=models.CASCADE, related_name="connections")
    channel_name = models.CharField(max_length=200)
    role = models.CharField(max_length=32)
    scopes = models.JSONField(default=list)
    auth_method = models.CharField(max_length=32)
    device_id = models.CharField(max_length=64, blank=True, db_index=True)
    node_id = models.CharField(max_length=200, blank=True)
    client_id = models.CharField(max_length=64)
    client_mode = models.CharField(max_length=32)
    client_version = models.CharField(max_length=100, blank=True)
    display_name = models.CharField(max_length=200, blank=True)
    platform = models.CharField(max_length=100, blank=True)
    device_family = models.CharField(max_length=100, blank=True)
    model_identifier = models.CharField(max_length=100, blank=True)
    instance_id = models.CharField(max_length=200, blank=True)
    remote_ip = models.CharField(max_length=64, blank=True)
    caps = models.JSONField(default=list)
    commands = models.JSONField(default=list)
    permissions = models.JSONField(default=dict)
    path_env = models.TextField(blank=True)
    connected_at = models.DateTimeField()

    class Meta:
        constraints = [
            # A newer connection of the same node replaces the older one.
            models.UniqueConstraint(fields=["node_id"], condition=Q(role="node"), name="one_live_connection_per_node"),
        ]

    def __str__(self) -> str:
        return f"{self.role} {self.client_id} {self.conn_id}"


class AuditLog(models.Model):
    """Who changed what: every pairing decision, token change and recovery action."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    # "user:<name>", "device:<id>", "gateway", "cli" — who acted when no Django user did.
    actor = models.CharField(max_length=200)
    action = models.CharField(max_length=100, db_index=True)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=200, db_index=True)
    data = models.JSONField(default=dict)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target_type}:{self.target_id}"
