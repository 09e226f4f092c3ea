"""Admin for live state owned by the gateway processes, and the audit log (all read-only)."""

from __future__ import annotations

import json

from django.contrib import admin
from django.db.models import BooleanField, Count, ExpressionWrapper, Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from gateway.models import (
    AuditLog,
    GatewayConnection,
    GatewayProcess,
)
from gateway.selectors import process_stale_before

from .common import (
    ConnectionLiveFilter,
    EstimatedCountPaginator,
    LiveFilter,
    ReadOnlyAdmin,
    audit_history_url,
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
    """The processes' heartbeats (the console's System page shows the same rows): a silent one is stale."""

    list_display = ("boot_id", "hostname", "pid", "is_alive", "connection_count", "started_at", "heartbeat_at")
    list_filter = (LiveFilter, "hostname")
    search_fields = ("boot_id", "hostname")
    search_help_text = "Part of a boot id, or a host name."
    ordering = ("-heartbeat_at",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    def get_queryset(self, request: HttpRequest) -> QuerySet[GatewayProcess]:
        return super().get_queryset(request).annotate(n_connections=Count("connections"))

    @admin.display(description="alive", boolean=True, ordering="heartbeat_at")
    def is_alive(self, obj: GatewayProcess) -> bool:
        return obj.heartbeat_at >= process_stale_before()

    @admin.display(description="connections", ordering="n_connections")
    def connection_count(self, obj: GatewayProcess) -> int:
        return obj.n_connections  # type: ignore[attr-defined]


class AuditTargetTypeFilter(admin.SimpleListFilter):
    """Fixed choices: a DISTINCT over the audit table would scan it."""

    title = "object type"
    parameter_name = "target_type__exact"
    TYPES = ("device", "node", "session", "environment")

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(kind, kind) for kind in self.TYPES]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value():
            return queryset.filter(target_type=self.value())
        return queryset


def _audit_value(value: object, *, limit: int | None = 80) -> str:
    if value is None:
        return "—"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdmin):
    """Who did what to which object, with the state before and after. One object's history is the list
    filtered by ``target_id__exact`` (and ``target_type__exact``): the "audit history" link of the
    devices, tokens, pairing requests, sessions, placements and environments in this admin."""

    list_display = (
        "created_at",
        "actor",
        "actor_user",
        "action",
        "object_column",
        "before_column",
        "after_column",
        "data_summary",
    )
    list_filter = ("action", AuditTargetTypeFilter)
    list_select_related = ("actor_user",)
    search_fields = ("actor", "action", "=target_id", "actor_user__username")
    search_help_text = "Actor, action, user name, or an object's exact id (device id, session key, environment id)."
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fields = ("created_at", "actor", "actor_user", "action", "target_type", "target_id", "before", "after", "data")
    readonly_fields = fields

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        target_id = request.GET.get("target_id__exact")
        if target_id:
            target_type = request.GET.get("target_type__exact")
            what = f"{target_type} {target_id}" if target_type else target_id
            extra_context = {**(extra_context or {}), "subtitle": f"Audit history of {what}"}
        return super().changelist_view(request, extra_context)

    @admin.display(description="object", ordering="target_id")
    def object_column(self, obj: AuditLog) -> str:
        return format_html(
            '<a href="{}" title="audit history of this object">{}: {}</a>',
            audit_history_url(obj.target_id, obj.target_type),
            obj.target_type,
            short_id(obj.target_id, 40),
        )

    @admin.display(description="before")
    def before_column(self, obj: AuditLog) -> str:
        return _audit_value(obj.data.get("before") if isinstance(obj.data, dict) else None)

    @admin.display(description="after")
    def after_column(self, obj: AuditLog) -> str:
        return _audit_value(obj.data.get("after") if isinstance(obj.data, dict) else None)

    @admin.display(description="before")
    def before(self, obj: AuditLog) -> str:
        return _audit_value(obj.data.get("before") if isinstance(obj.data, dict) else None, limit=None)

    @admin.display(description="after")
    def after(self, obj: AuditLog) -> str:
        return _audit_value(obj.data.get("after") if isinstance(obj.data, dict) else None, limit=None)

    @admin.display(description="data")
    def data_summary(self, obj: AuditLog) -> str:
        text = json.dumps(obj.data, sort_keys=True)
        return text if len(text) <= 120 else text[:117] + "..."
