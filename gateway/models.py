from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class GatewayProcess(models.Model):
    """A running gateway process; connections it registered die with its heartbeat."""

    boot_id = models.UUIDField(primary_key=True)
    hostname = models.CharField(max_length=200)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField(db_index=True)

    class Meta:
        verbose_name_plural = "gateway processes"

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


class OperatorScope(models.Model):
    """No table and no rows: the holder of the permissions that give a Django user operator scopes
    (``gateway/user_scopes.py`` maps each scope to one of them; the console and the admin ask there)."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("operator_read", "operator.read: sessions, turns, nodes, environments, usage and logs"),
            ("operator_write", "operator.write: send, stop, create, fork, dispatch and move sessions (and read)"),
            ("operator_pairing", "operator.pairing: approve, reject and remove devices and nodes, their tokens"),
            ("operator_approvals", "operator.approvals: decide exec approvals"),
            ("operator_admin", "operator.admin: every operator scope"),
        ]

    def __str__(self) -> str:
        return "operator scopes"
