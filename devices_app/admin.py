"""Admin for paired devices, pairing requests and device tokens, with audited actions."""

from __future__ import annotations

import json

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.auth import get_permission_codename
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from gateway import scopes as sc
from gateway.admin.common import (
    ReadOnlyTabularInline,
    ViewOnlyObjectsMixin,
    audit_history_link,
    join_or_dash,
    operator_action,
    per_object_action,
    report_outcome,
    short_id,
)
from gateway.audit import Actor
from gateway.exceptions import GatewayError
from gateway.redaction import operator_text
from gateway.scopes import ROLES
from gateway.selectors import live_connections

from .models import DevicePairingRequest, DeviceToken, PairedDevice, PairingStatus
from .services import pairing, tokens

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


# --- paired devices -------------------------------------------------------------------------


class DeviceTokenInline(ReadOnlyTabularInline):
    model = DeviceToken
    # Never token_hash: declared explicitly so a new model field cannot appear here by default.
    fields = ("role", "scopes", "created_at", "rotated_at", "revoked_at", "last_used_at")
    readonly_fields = fields


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
        (
            None,
            {
                "fields": (
                    "device_id",
                    "public_key",
                    "display_name",
                    "operator_label",
                    "live_connections",
                    "audit_history",
                )
            },
        ),
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
        return short_id(obj.device_id)

    @admin.display(description="roles")
    def roles_column(self, obj: PairedDevice) -> str:
        return join_or_dash(obj.roles)

    @admin.display(description="approved scopes")
    def scopes_column(self, obj: PairedDevice) -> str:
        return join_or_dash(obj.approved_scopes)

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

    @admin.display(description="audit")
    def audit_history(self, obj: PairedDevice) -> str:
        # By id only: a device's rows are under "device" and, for its node role, "node".
        return audit_history_link(obj.device_id)

    def has_remove_permission(self, request: HttpRequest) -> bool:
        """Removing goes through the service, so it is gated by the model's delete permission."""
        codename = get_permission_codename("delete", self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    @operator_action("device.pair.remove", description="Remove selected devices", permissions=["remove"])
    def remove_devices(self, request: HttpRequest, queryset: QuerySet[PairedDevice]) -> TemplateResponse | None:
        """Destructive: tokens die with the device and its live connections are closed.

        1. First POST (from the action bar): render the confirmation page.
        2. Second POST (``post=yes``): call ``paired_device_remove`` once per device.
        """
        if request.POST.get("post") != "yes":
            return self._remove_confirmation(request, queryset)
        actor = Actor.for_user(request.user)
        done, skipped = 0, []
        for device in queryset:
            try:
                pairing.paired_device_remove(device_id=device.device_id, actor=actor)
            except GatewayError as exc:
                skipped.append(f"{device}: {operator_text(exc)}")
                continue
            done += 1
            # The row is gone; the in-memory object still carries its pk and label for history.
            self.log_deletions(request, [device])
        report_outcome(self, request, done, skipped)
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
        return TemplateResponse(request, "admin/devices_app/paireddevice/remove_confirmation.html", context)

    @operator_action("device.token.revoke", description="Revoke all device tokens")
    def revoke_device_tokens(self, request: HttpRequest, queryset: QuerySet[PairedDevice]) -> None:
        actor = Actor.for_user(request.user)
        done, skipped = 0, []
        for device in queryset.prefetch_related("tokens"):
            active = sorted(t.role for t in device.tokens.all() if t.revoked_at is None)
            if not active:
                skipped.append(f"{device}: no active tokens")
                continue
            revoked = []
            for role in active:
                try:
                    tokens.device_token_revoke(device_id=device.device_id, role=role, actor=actor)
                except GatewayError as exc:
                    skipped.append(f"{device} ({role} token): {operator_text(exc)}")
                    continue
                revoked.append(role)
            if revoked:
                done += 1
                self.log_change(request, device, f"Revoked device tokens ({', '.join(revoked)}) via admin action.")
        report_outcome(self, request, done, skipped)


# --- pairing requests -----------------------------------------------------------------------


def _request_label(obj: DevicePairingRequest) -> str:
    return f"{obj.role} request {short_id(obj.request_id, 8)} of {obj.display_name or short_id(obj.device_id)}"


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
        "audit_history",
    )
    fields = readonly_fields

    @admin.display(description="request", ordering="request_id")
    def request_id_short(self, obj: DevicePairingRequest) -> str:
        return short_id(obj.request_id, 8)

    @admin.display(description="device", ordering="device_id")
    def device_column(self, obj: DevicePairingRequest) -> str:
        return f"{obj.display_name or '—'} ({short_id(obj.device_id)})"

    @admin.display(description="scopes")
    def scopes_column(self, obj: DevicePairingRequest) -> str:
        return join_or_dash(obj.scopes)

    @admin.display(description="commands")
    def commands_column(self, obj: DevicePairingRequest) -> str:
        return join_or_dash(obj.commands)

    @admin.display(description="open", boolean=True)
    def is_open(self, obj: DevicePairingRequest) -> bool:
        return obj.status == PairingStatus.PENDING and obj.expires_at > timezone.now()

    @admin.display(description="paired device")
    def paired_device(self, obj: DevicePairingRequest) -> str:
        device = PairedDevice.objects.filter(device_id=obj.device_id).first()
        if device is None:
            return "—"
        return format_html(
            '<a href="{}">{}</a>',
            reverse("admin:devices_app_paireddevice_change", args=[device.pk]),
            str(device),
        )

    @admin.display(description="audit")
    def audit_history(self, obj: DevicePairingRequest) -> str:
        return audit_history_link(obj.device_id)

    def _not_open_reason(self, obj: DevicePairingRequest) -> str | None:
        if obj.status != PairingStatus.PENDING:
            return f"{obj.status}, not pending"
        if obj.expires_at <= timezone.now():
            return "expired (awaiting the expiry sweep)"
        return None

    @operator_action("device.pair.approve", description="Approve selected pairing requests")
    def approve_requests(self, request: HttpRequest, queryset: QuerySet[DevicePairingRequest]) -> None:
        def approve(obj: DevicePairingRequest, actor: Actor) -> str:
            device = pairing.pairing_request_approve(request_id=str(obj.request_id), actor=actor)
            return f"Approved via admin action: device {device.device_id} paired as {obj.role}."

        per_object_action(self, request, queryset, label=_request_label, skip_reason=self._not_open_reason, act=approve)

    @operator_action("device.pair.reject", description="Reject selected pairing requests")
    def reject_requests(self, request: HttpRequest, queryset: QuerySet[DevicePairingRequest]) -> None:
        def reject(obj: DevicePairingRequest, actor: Actor) -> str:
            pairing.pairing_request_reject(request_id=str(obj.request_id), actor=actor)
            return "Rejected via admin action."

        per_object_action(self, request, queryset, label=_request_label, skip_reason=self._not_open_reason, act=reject)


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
    actions = ("revoke_tokens", "rotate_tokens")
    fields = ("device", "role", "scopes", "created_at", "rotated_at", "revoked_at", "last_used_at", "audit_history")
    readonly_fields = fields
    exclude = ("token_hash",)

    @admin.display(description="device", ordering="device__display_name")
    def device_link(self, obj: DeviceToken) -> str:
        return format_html(
            '<a href="{}">{}</a>',
            reverse("admin:devices_app_paireddevice_change", args=[obj.device_id]),
            obj.device.label,
        )

    @admin.display(description="scopes")
    def scopes_column(self, obj: DeviceToken) -> str:
        return join_or_dash(obj.scopes)

    @admin.display(description="active", boolean=True, ordering="revoked_at")
    def is_active(self, obj: DeviceToken) -> bool:
        return obj.revoked_at is None

    @admin.display(description="audit")
    def audit_history(self, obj: DeviceToken) -> str:
        return audit_history_link(obj.device_id, "device")

    @operator_action("device.token.revoke", description="Revoke selected tokens")
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[DeviceToken]) -> None:
        def revoke(token: DeviceToken, actor: Actor) -> str:
            tokens.device_token_revoke(device_id=token.device_id, role=token.role, actor=actor)
            return "Revoked via admin action."

        per_object_action(
            self,
            request,
            queryset.select_related("device"),
            label=str,
            skip_reason=lambda token: "already revoked" if token.revoked_at is not None else None,
            act=revoke,
        )

    @operator_action("device.token.rotate", description="Rotate selected tokens (shows the new tokens once)")
    def rotate_tokens(self, request: HttpRequest, queryset: QuerySet[DeviceToken]) -> TemplateResponse:
        """Destructive: the old secret stops working and the device's connections with that role close.

        1. First POST (from the action bar): render the confirmation page.
        2. Second POST (``post=yes``): ``device_token_rotate`` once per token (as ``device.token.rotate``
           with the device's approved scopes), then a page that shows each new secret this once.
        """
        selected = list(queryset.select_related("device"))
        if request.POST.get("post") != "yes":
            return self._rotate_confirmation(request, selected)
        actor = Actor.for_user(request.user)
        rotated, skipped = [], []
        for token in selected:
            try:
                result = tokens.device_token_rotate(
                    device_id=token.device_id, role=token.role, scopes=None, actor=actor, show_to_operator=True
                )
            except GatewayError as exc:
                skipped.append(f"{token}: {operator_text(exc)}")
                continue
            token.refresh_from_db()
            self.log_change(request, token, "Rotated via admin action.")
            rotated.append(
                {
                    "device": token.device.label,
                    "device_id": token.device_id,
                    "role": token.role,
                    "scopes": result["scopes"],
                    "token": result["token"],
                }
            )
        report_outcome(self, request, len(rotated), skipped)
        context = {
            **self.admin_site.each_context(request),
            "title": "New device tokens",
            "subtitle": None,
            "opts": self.opts,
            "rotated": rotated,
        }
        request.current_app = self.admin_site.name
        response = TemplateResponse(request, "admin/devices_app/devicetoken/rotated.html", context)
        response["Cache-Control"] = "no-store"  # the secrets must not stay in a cache or the history
        return response

    def _rotate_confirmation(self, request: HttpRequest, selected: list[DeviceToken]) -> TemplateResponse:
        live_by_device = dict(
            live_connections()
            .filter(device_id__in={t.device_id for t in selected})
            .values_list("device_id")
            .annotate(n=Count("pk"))
            .order_by()
        )
        rows = [
            (
                token.device.label,
                token.role,
                "active" if token.revoked_at is None else "revoked",
                join_or_dash(token.device.approved_scopes if token.role == sc.ROLE_OPERATOR else []),
                live_by_device.get(token.device_id, 0),
            )
            for token in selected
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": "Rotate device tokens?",
            "subtitle": None,
            "opts": self.opts,
            "intro": (
                "Each selected token gets a new secret, shown once on the next page: the old one stops working "
                "and the device's live connections with that role are closed until it connects with the new "
                "token. Each rotation is recorded in the audit log."
            ),
            "columns": ("Device", "Role", "State now", "Scopes after", "Live connections of the device"),
            "rows": rows,
            "queryset": selected,
            "action_name": "rotate_tokens",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "confirm_label": f"Yes, rotate {len(rows)} token{'s' if len(rows) != 1 else ''}",
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/action_confirmation.html", context)
