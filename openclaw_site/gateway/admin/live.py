"""Admin for live state owned by the gateway processes, and the audit log (all read-only)."""

from __future__ import annotations

import json

from django.contrib import admin
from django.db.models import BooleanField, Count, ExpressionWrapper, Q, QuerySet
from django.http import HttpRequest

from openclaw_site.gateway.models import (
    AuditLog,
    GatewayConnection,
    GatewayProcess,
)
from openclaw_site.gateway.selectors import process_stale_before

from .common import (
    ConnectionLiveFilter,
    EstimatedCountPaginator,
    LiveFilter,
    ReadOnlyAdmin,
    short_id,
)

# --- live state (owned by the gateway processes) --------------------------------------------


@admin.register(GatewayConnection)
class GatewayConnectionAdmin(ReadOnlyAdmin):
    list_display = (
        "conn_id_short",
        "role",
        "client_id",
        "client_mode",
        "display_name",
        "device_id_short",
        "node_id",
        "auth_method",
        "process_column",
        "is_live",
        "connected_at",
    )
    list_filter = (ConnectionLiveFilter, "role", "auth_method", "client_mode")
    list_select_related = ("process",)
    search_fields = (
        "conn_id",
        "device_id",
        "node_id",
        "client_id",
        "display_name",
        "channel_name",
        "instance_id",
        "remote_ip",
    )
    ordering = ("-connected_at",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[GatewayConnection]:
        return (
            super()
            .get_queryset(request)
            .annotate(
                live=ExpressionWrapper(
                    Q(process__heartbeat_at__gte=process_stale_before()), output_field=BooleanField()
                )
            )
        )

    @admin.display(description="connection", ordering="conn_id")
    def conn_id_short(self, obj: GatewayConnection) -> str:
        return short_id(obj.conn_id, 8)

    @admin.display(description="device id", ordering="device_id")
    def device_id_short(self, obj: GatewayConnection) -> str:
        return short_id(obj.device_id) or "—"

    @admin.display(description="process", ordering="process__hostname")
    def process_column(self, obj: GatewayConnection) -> str:
        return f"{obj.process.hostname}:{obj.process.pid}"

    @admin.display(description="live", boolean=True, ordering="live")
    def is_live(self, obj: GatewayConnection) -> bool:
        return obj.live  # type: ignore[attr-defined]


@admin.register(GatewayProcess)
class GatewayProcessAdmin(ReadOnlyAdmin):
    list_display = ("boot_id", "hostname", "pid", "is_alive", "connection_count", "started_at", "heartbeat_at")
    list_filter = (LiveFilter, "hostname")
    search_fields = ("boot_id", "hostname")
    ordering = ("-heartbeat_at",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[GatewayProcess]:
        return super().get_queryset(request).annotate(n_connections=Count("connections"))

    @admin.display(description="alive", boolean=True, ordering="heartbeat_at")
    def is_alive(self, obj: GatewayProcess) -> bool:
        return obj.heartbeat_at >= process_stale_before()

    @admin.display(description="connections", ordering="n_connections")
    def connection_count(self, obj: GatewayProcess) -> int:
        return obj.n_connections  # type: ignore[attr-defined]


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "actor_user", "action", "target_type", "target_id", "data_summary")
    list_filter = ("action", "target_type")
    list_select_related = ("actor_user",)
    search_fields = ("actor", "action", "target_id", "actor_user__username")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    @admin.display(description="data")
    def data_summary(self, obj: AuditLog) -> str:
        text = json.dumps(obj.data, sort_keys=True)
        return text if len(text) <= 120 else text[:117] + "..."
