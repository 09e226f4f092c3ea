"""Admin of workers_app: placements with their history, environments with their error (inspection only;
recovery actions arrive with the placement RPCs, through the same services)."""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html, format_html_join

from openclaw_site.gateway.admin.common import EstimatedCountPaginator, ReadOnlyAdmin

from .models import Placement, PlacementHistory, PlacementMove, WorkerEnvironment

HISTORY_SHOWN = 200


@admin.register(Placement)
class PlacementAdmin(ReadOnlyAdmin):
    list_display = ("session_key", "state", "generation", "environment_id", "terminal_reason", "updated_at_ms")
    list_filter = ("state", "execution_mode")
    search_fields = ("session_key", "environment_id")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    readonly_fields = [*(field.name for field in Placement._meta.fields), "history"]

    @admin.display(description="history (newest first)")
    def history(self, obj: Placement) -> str:
        # Keyed on the session, not the placement row: the history outlives a retired placement.
        rows = PlacementHistory.objects.filter(session_id=obj.pk).order_by("-id")[:HISTORY_SHOWN]
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{} → {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (r.at_ms, r.from_state or "—", r.to_state, r.generation, r.environment_id, r.actor, r.reason)
                for r in rows
            ),
        )
        return format_html(
            "<table><tr><th>at (ms)</th><th>change</th><th>generation</th><th>environment</th>"
            "<th>actor</th><th>reason</th></tr>{}</table>",
            body,
        )


@admin.register(PlacementHistory)
class PlacementHistoryAdmin(ReadOnlyAdmin):
    list_display = ("session_key", "from_state", "to_state", "generation", "environment_id", "actor", "at_ms")
    list_filter = ("to_state",)
    search_fields = ("session_key", "environment_id", "actor")
    show_full_result_count = False
    paginator = EstimatedCountPaginator


@admin.register(WorkerEnvironment)
class WorkerEnvironmentAdmin(ReadOnlyAdmin):
    list_display = (
        "environment_id",
        "provider_id",
        "profile_id",
        "state",
        "owner_epoch",
        "last_error",
        "updated_at_ms",
    )
    list_filter = ("state", "provider_id")
    search_fields = ("environment_id", "lease_id", "node_device_id")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    # The SSH key reference stays out of the admin as it stays out of every API.
    exclude = ("ssh_key_ref",)
    readonly_fields = [field.name for field in WorkerEnvironment._meta.fields if field.name != "ssh_key_ref"]


@admin.register(PlacementMove)
class PlacementMoveAdmin(ReadOnlyAdmin):
    """Moves in flight (a row outlives its driver only until recovery finishes or fails the move)."""

    list_display = ("operation_id", "session", "source_environment_id", "target_kind", "target_id", "last_error")
    list_filter = ("target_kind",)
    search_fields = ("operation_id", "source_environment_id")
    list_select_related = ("session",)
