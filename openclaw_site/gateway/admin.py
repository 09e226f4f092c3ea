"""Admin for inspecting the gateway core and for audited recovery.

Everything the protocol creates is read-only here. State changes only through the actions below,
each of which calls a service once per selected object with ``Actor.for_user(request.user)``: the
service validates the transition and writes our ``AuditLog`` row; the admin adds Django's history
entry and reports "N done, M skipped: <reasons>".
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.auth import get_permission_codename
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import BooleanField, Count, Exists, ExpressionWrapper, OuterRef, Q, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join

from . import services
from .exceptions import GatewayError
from .models import (
    AuditLog,
    DevicePairingRequest,
    DeviceToken,
    GatewayConnection,
    GatewayProcess,
    PairedDevice,
    PairingStatus,
)
from .scopes import ROLES
from .selectors import live_connections, process_stale_before

# --- shared helpers -------------------------------------------------------------------------


def _short(value: object, size: int = 12) -> str:
    return str(value)[:size]


def _join(values: Iterable[str] | None) -> str:
    return ", ".join(values or []) or "—"


def _report(modeladmin: admin.ModelAdmin, request: HttpRequest, done: int, skipped: list[str]) -> None:
    message = f"{done} done, {len(skipped)} skipped"
    if skipped:
        message += ": " + "; ".join(skipped)
    modeladmin.message_user(request, message, level=messages.WARNING if skipped else messages.SUCCESS)


class EstimatedCountPaginator(Paginator):
    """Pages a big table without counting it.

    An unfiltered COUNT(*) is a full scan on PostgreSQL; for a large table the planner's row
    estimate is good enough to page by. Filtered lists and small tables are counted exactly.
    """

    ESTIMATE_ABOVE = 10_000

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if isinstance(queryset, QuerySet) and not queryset.query.where:
            connection = connections[queryset.db]
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT reltuples::bigint FROM pg_class WHERE relname = %s", [queryset.model._meta.db_table]
                    )
                    row = cursor.fetchone()
                if row and row[0] > self.ESTIMATE_ABOVE:
                    return int(row[0])
        return super().count


class ViewOnlyObjectsMixin:
    """Objects open read-only; the model-level change permission only unlocks the actions.

    Editing a field here would bypass the services (no compare-and-set, no audit row, no event),
    so the change form never saves. Built-in delete is off for the same reason.
    """

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None:
            return False
        return super().has_change_permission(request)  # type: ignore[misc]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    """Fully read-only: rows are owned by the gateway processes (or are the audit trail)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- list filters ---------------------------------------------------------------------------


class RoleFilter(admin.SimpleListFilter):
    title = "role"
    parameter_name = "role"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(role, role) for role in ROLES]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() not in ROLES:
            return queryset
        # ``roles`` is a JSON list; JSON ``contains`` is not available on SQLite, but the quoted
        # element is unambiguous in the serialized list on both backends.
        return queryset.filter(roles__icontains=json.dumps(self.value()))


class ConnectedFilter(admin.SimpleListFilter):
    title = "connected"
    parameter_name = "connected"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("yes", "Connected"), ("no", "Not connected")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        live = Exists(live_connections().filter(device_id=OuterRef("pk")))
        if self.value() == "yes":
            return queryset.filter(live)
        if self.value() == "no":
            return queryset.filter(~live)
        return queryset


class PairingStateFilter(admin.SimpleListFilter):
    """Status, with pending split into still open and overdue (waiting for the expiry sweep)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [
            ("open", "Pending (open)"),
            ("overdue", "Pending (overdue)"),
            (PairingStatus.APPROVED, "Approved"),
            (PairingStatus.REJECTED, "Rejected"),
            (PairingStatus.EXPIRED, "Expired"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == "open":
            return queryset.filter(status=PairingStatus.PENDING, expires_at__gt=timezone.now())
        if value == "overdue":
            return queryset.filter(status=PairingStatus.PENDING, expires_at__lte=timezone.now())
        if value in PairingStatus.values:
            return queryset.filter(status=value)
        return queryset


class TokenStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("active", "Active"), ("revoked", "Revoked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "active":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


class LiveFilter(admin.SimpleListFilter):
    """Alive = the (owning) gateway process still heartbeats."""

    title = "alive"
    parameter_name = "alive"
    heartbeat_field = "heartbeat_at"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("yes", "Alive"), ("no", "Stale")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        fresh = Q(**{f"{self.heartbeat_field}__gte": process_stale_before()})
        if self.value() == "yes":
            return queryset.filter(fresh)
        if self.value() == "no":
            return queryset.exclude(fresh)
        return queryset


class ConnectionLiveFilter(LiveFilter):
    heartbeat_field = "process__heartbeat_at"


# --- paired devices -------------------------------------------------------------------------


class DeviceTokenInline(admin.TabularInline):
    model = DeviceToken
    # Never token_hash: declared explicitly so a new model field cannot appear here by default.
    fields = ("role", "scopes", "created_at", "rotated_at", "revoked_at", "last_used_at")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(PairedDevice)
class PairedDeviceAdmin(ViewOnlyObjectsMixin, admin.ModelAdmin):
    list_display = (
        "label_column",
        "device_id_short",
        "roles_column",
        "scopes_column",
        "is_connected",
        "active_tokens",
        "last_seen_at",
        "last_seen_reason",
        "platform",
        "approved_at",
    )
    list_filter = (RoleFilter, ConnectedFilter, "platform", "client_mode")
    search_fields = ("device_id", "public_key", "display_name", "operator_label", "client_id", "remote_ip")
    ordering = ("-approved_at",)
    inlines = (DeviceTokenInline,)
    actions = ("remove_devices", "revoke_device_tokens")
    fieldsets = (
        (None, {"fields": ("device_id", "public_key", "display_name", "operator_label", "live_connections")}),
        ("Approval", {"fields": ("roles", "approved_scopes", "approved_commands", "approved_caps")}),
        ("Approval (node permissions)", {"fields": ("approved_permissions",), "classes": ("collapse",)}),
        (
            "Client",
            {
                "fields": (
                    "platform",
                    "device_family",
                    "model_identifier",
                    "client_id",
                    "client_mode",
                    "client_version",
                    "remote_ip",
                )
            },
        ),
        (
            "Timestamps",
            {
                "fields": (
                    "created_at",
                    "approved_at",
                    "last_connected_at",
                    "last_disconnected_at",
                    "last_seen_at",
                    "last_seen_reason",
                )
            },
        ),
    )
    # Every field, including state and timestamps: a device changes only through services.
    readonly_fields = tuple(flatten_fieldsets(fieldsets))

    def get_queryset(self, request: HttpRequest) -> QuerySet[PairedDevice]:
        return (
            super()
            .get_queryset(request)
            .annotate(
                connected=Exists(live_connections().filter(device_id=OuterRef("pk"))),
                active_token_count=Count("tokens", filter=Q(tokens__revoked_at__isnull=True)),
            )
        )

    @admin.display(description="device", ordering="display_name")
    def label_column(self, obj: PairedDevice) -> str:
        return obj.label

    @admin.display(description="device id", ordering="device_id")
    def device_id_short(self, obj: PairedDevice) -> str:
        return _short(obj.device_id)

    @admin.display(description="roles")
    def roles_column(self, obj: PairedDevice) -> str:
        return _join(obj.roles)

    @admin.display(description="approved scopes")
    def scopes_column(self, obj: PairedDevice) -> str:
        return _join(obj.approved_scopes)

    @admin.display(description="connected", boolean=True, ordering="connected")
    def is_connected(self, obj: PairedDevice) -> bool:
        return obj.connected  # type: ignore[attr-defined]

    @admin.display(description="active tokens", ordering="active_token_count")
    def active_tokens(self, obj: PairedDevice) -> int:
        return obj.active_token_count  # type: ignore[attr-defined]

    @admin.display(description="live connections")
    def live_connections(self, obj: PairedDevice) -> str:
        rows = live_connections().filter(device_id=obj.pk).select_related("process").order_by("connected_at")
        if not rows:
            return "—"
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                '<li><a href="{}">{} {}</a> on {} since {}</li>',
                (
                    (
                        reverse("admin:gateway_gatewayconnection_change", args=[c.pk]),
                        c.role,
                        c.client_id,
                        c.process.hostname,
                        c.connected_at.isoformat(timespec="seconds"),
                    )
                    for c in rows
                ),
            ),
        )

    def has_remove_permission(self, request: HttpRequest) -> bool:
        """Removing goes through the service, so it is gated by the model's delete permission."""
        codename = get_permission_codename("delete", self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    @admin.action(description="Remove selected devices", permissions=["remove"])
    def remove_devices(self, request: HttpRequest, queryset: QuerySet[PairedDevice]) -> TemplateResponse | None:
        """Destructive: tokens die with the device and its live connections are closed.

        1. First POST (from the action bar): render the confirmation page.
        2. Second POST (``post=yes``): call ``paired_device_remove`` once per device.
        """
        if request.POST.get("post") != "yes":
            return self._remove_confirmation(request, queryset)
        actor = services.Actor.for_user(request.user)
        done, skipped = 0, []
        for device in queryset:
            try:
                services.paired_device_remove(device_id=device.device_id, actor=actor)
            except GatewayError as exc:
                skipped.append(f"{device}: {exc.message}")
                continue
            done += 1
            # The row is gone; the in-memory object still carries its pk and label for history.
            self.log_deletions(request, [device])
        _report(self, request, done, skipped)
        return None

    def _remove_confirmation(self, request: HttpRequest, queryset: QuerySet[PairedDevice]) -> TemplateResponse:
        devices = list(queryset.prefetch_related("tokens"))
        live_by_device = dict(
            live_connections()
            .filter(device_id__in=[d.pk for d in devices])
            .values_list("device_id")
            .annotate(n=Count("pk"))
            .order_by()
        )
        rows = [
            {
                "device": d,
                "tokens": [t for t in d.tokens.all() if t.revoked_at is None],
                "live_connections": live_by_device.get(d.pk, 0),
            }
            for d in devices
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": "Remove paired devices?",
            "subtitle": None,
            "opts": self.opts,
            "rows": rows,
            "queryset": devices,
            "action_name": "remove_devices",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/gateway/paireddevice/remove_confirmation.html", context)

    @admin.action(description="Revoke all device tokens", permissions=["change"])
    def revoke_device_tokens(self, request: HttpRequest, queryset: QuerySet[PairedDevice]) -> None:
        actor = services.Actor.for_user(request.user)
        done, skipped = 0, []
        for device in queryset.prefetch_related("tokens"):
            active = sorted(t.role for t in device.tokens.all() if t.revoked_at is None)
            if not active:
                skipped.append(f"{device}: no active tokens")
                continue
            revoked = []
            for role in active:
                try:
                    services.device_token_revoke(device_id=device.device_id, role=role, actor=actor)
                except GatewayError as exc:
                    skipped.append(f"{device} ({role} token): {exc.message}")
                    continue
                revoked.append(role)
            if revoked:
                done += 1
                self.log_change(request, device, f"Revoked device tokens ({', '.join(revoked)}) via admin action.")
        _report(self, request, done, skipped)


# --- pairing requests -----------------------------------------------------------------------


def _request_label(obj: DevicePairingRequest) -> str:
    return f"{obj.role} request {_short(obj.request_id, 8)} of {obj.display_name or _short(obj.device_id)}"


@admin.register(DevicePairingRequest)
class DevicePairingRequestAdmin(ViewOnlyObjectsMixin, admin.ModelAdmin):
    list_display = (
        "request_id_short",
        "device_column",
        "role",
        "scopes_column",
        "commands_column",
        "status",
        "is_open",
        "reason",
        "is_repair",
        "created_at",
        "expires_at",
        "resolved_by",
        "resolved_at",
    )
    list_filter = (PairingStateFilter, "role", "is_repair", "reason")
    search_fields = ("request_id", "device_id", "public_key", "display_name", "client_id", "remote_ip")
    ordering = ("-created_at",)
    date_hierarchy = "created_at"
    show_full_result_count = False
    actions = ("approve_requests", "reject_requests")
    readonly_fields = (
        "request_id",
        "device_id",
        "paired_device",
        "public_key",
        "display_name",
        "role",
        "scopes",
        "commands",
        "caps",
        "permissions",
        "reason",
        "is_repair",
        "silent",
        "status",
        "created_at",
        "expires_at",
        "resolved_at",
        "resolved_by",
        "platform",
        "device_family",
        "model_identifier",
        "client_id",
        "client_mode",
        "client_version",
        "remote_ip",
    )
    fields = readonly_fields

    @admin.display(description="request", ordering="request_id")
    def request_id_short(self, obj: DevicePairingRequest) -> str:
        return _short(obj.request_id, 8)

    @admin.display(description="device", ordering="device_id")
    def device_column(self, obj: DevicePairingRequest) -> str:
        return f"{obj.display_name or '—'} ({_short(obj.device_id)})"

    @admin.display(description="scopes")
    def scopes_column(self, obj: DevicePairingRequest) -> str:
        return _join(obj.scopes)

    @admin.display(description="commands")
    def commands_column(self, obj: DevicePairingRequest) -> str:
        return _join(obj.commands)

    @admin.display(description="open", boolean=True)
    def is_open(self, obj: DevicePairingRequest) -> bool:
        return obj.status == PairingStatus.PENDING and obj.expires_at > timezone.now()

    @admin.display(description="paired device")
    def paired_device(self, obj: DevicePairingRequest) -> str:
        device = PairedDevice.objects.filter(device_id=obj.device_id).first()
        if device is None:
            return "—"
        return format_html(
            '<a href="{}">{}</a>', reverse("admin:gateway_paireddevice_change", args=[device.pk]), str(device)
        )

    def _not_open_reason(self, obj: DevicePairingRequest) -> str | None:
        if obj.status != PairingStatus.PENDING:
            return f"{obj.status}, not pending"
        if obj.expires_at <= timezone.now():
            return "expired (awaiting the expiry sweep)"
        return None

    @admin.action(description="Approve selected pairing requests", permissions=["change"])
    def approve_requests(self, request: HttpRequest, queryset: QuerySet[DevicePairingRequest]) -> None:
        actor = services.Actor.for_user(request.user)
        done, skipped = 0, []
        for obj in queryset:
            reason = self._not_open_reason(obj)
            if reason is not None:
                skipped.append(f"{_request_label(obj)}: {reason}")
                continue
            try:
                device = services.pairing_request_approve(request_id=str(obj.request_id), actor=actor)
            except GatewayError as exc:
                skipped.append(f"{_request_label(obj)}: {exc.message}")
                continue
            done += 1
            obj.refresh_from_db()
            self.log_change(request, obj, f"Approved via admin action: device {device.device_id} paired as {obj.role}.")
        _report(self, request, done, skipped)

    @admin.action(description="Reject selected pairing requests", permissions=["change"])
    def reject_requests(self, request: HttpRequest, queryset: QuerySet[DevicePairingRequest]) -> None:
        actor = services.Actor.for_user(request.user)
        done, skipped = 0, []
        for obj in queryset:
            reason = self._not_open_reason(obj)
            if reason is not None:
                skipped.append(f"{_request_label(obj)}: {reason}")
                continue
            try:
                services.pairing_request_reject(request_id=str(obj.request_id), actor=actor)
            except GatewayError as exc:
                skipped.append(f"{_request_label(obj)}: {exc.message}")
                continue
            done += 1
            obj.refresh_from_db()
            self.log_change(request, obj, "Rejected via admin action.")
        _report(self, request, done, skipped)


# --- device tokens --------------------------------------------------------------------------


@admin.register(DeviceToken)
class DeviceTokenAdmin(ViewOnlyObjectsMixin, admin.ModelAdmin):
    # The secret is never stored and its hash is never shown, searched or put in a form:
    # ``fields`` is explicit (``exclude`` alone would not stop a readonly field from rendering).
    list_display = (
        "__str__",
        "device_link",
        "role",
        "scopes_column",
        "is_active",
        "created_at",
        "rotated_at",
        "revoked_at",
        "last_used_at",
    )
    list_filter = (TokenStateFilter, "role")
    list_select_related = ("device",)
    search_fields = ("device__device_id", "device__display_name", "device__operator_label")
    ordering = ("-created_at",)
    actions = ("revoke_tokens",)
    fields = ("device", "role", "scopes", "created_at", "rotated_at", "revoked_at", "last_used_at")
    readonly_fields = fields
    exclude = ("token_hash",)

    @admin.display(description="device", ordering="device__display_name")
    def device_link(self, obj: DeviceToken) -> str:
        return format_html(
            '<a href="{}">{}</a>', reverse("admin:gateway_paireddevice_change", args=[obj.device_id]), obj.device.label
        )

    @admin.display(description="scopes")
    def scopes_column(self, obj: DeviceToken) -> str:
        return _join(obj.scopes)

    @admin.display(description="active", boolean=True, ordering="revoked_at")
    def is_active(self, obj: DeviceToken) -> bool:
        return obj.revoked_at is None

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[DeviceToken]) -> None:
        actor = services.Actor.for_user(request.user)
        done, skipped = 0, []
        for token in queryset.select_related("device"):
            if token.revoked_at is not None:
                skipped.append(f"{token}: already revoked")
                continue
            try:
                services.device_token_revoke(device_id=token.device_id, role=token.role, actor=actor)
            except GatewayError as exc:
                skipped.append(f"{token}: {exc.message}")
                continue
            done += 1
            token.refresh_from_db()
            self.log_change(request, token, "Revoked via admin action.")
        _report(self, request, done, skipped)


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
        return _short(obj.conn_id, 8)

    @admin.display(description="device id", ordering="device_id")
    def device_id_short(self, obj: GatewayConnection) -> str:
        return _short(obj.device_id) or "—"

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
