"""Admin of workers_app: placements with their history, environments with their error, and the recovery
actions of the RPCs (``sessions.reclaim``, its recover-to-gateway form, ``environments.destroy``) through
the same services: each refuses with the service's own message when the state moved on, and writes an
audit row (who, what, before, after)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from openclaw_site.gateway.admin.common import (
    EstimatedCountPaginator,
    ReadOnlyAdmin,
    ViewOnlyObjectsMixin,
    per_object_action,
)
from openclaw_site.gateway.audit import Actor

from .models import Placement, PlacementHistory, PlacementMove, WorkerEnvironment
from .services import reclaim

HISTORY_SHOWN = 200


def _placement_label(placement: Placement) -> str:
    return f"{placement.session_key} ({placement.state}@{placement.generation})"


@admin.register(Placement)
class PlacementAdmin(ViewOnlyObjectsMixin, admin.ModelAdmin):
    list_display = ("session_key", "state", "generation", "environment_id", "terminal_reason", "updated_at_ms")
    list_filter = ("state", "execution_mode")
    search_fields = ("session_key", "environment_id")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_select_related = ("session",)
    readonly_fields = [*(field.name for field in Placement._meta.fields), "history"]
    actions = ("stop_workers", "recover_to_gateway")

    @admin.action(description="Stop the worker / reclaim (sessions.reclaim)", permissions=["change"])
    def stop_workers(self, request: HttpRequest, queryset: QuerySet[Placement]) -> None:
        """Active → reclaimed; a dispatch in flight is canceled; failed → local once its teardown is done."""

        def stop(placement: Placement, actor: Actor) -> str:
            before = f"{placement.state}@{placement.generation}"
            after = reclaim.reclaim(session=placement.session, actor=actor)
            return f"Reclaimed via admin action: {before} -> {after.state}@{after.generation}."

        per_object_action(self, request, queryset, label=_placement_label, skip_reason=lambda p: None, act=stop)

    @admin.action(description="Recover a failed placement to the gateway", permissions=["change"])
    def recover_to_gateway(self, request: HttpRequest, queryset: QuerySet[Placement]) -> None:
        """Continue on the gateway: failed@generation → local, even when the worker's teardown cannot finish
        (it stays pending for the sweep). Only for the generation read now: a placement that changed since
        is refused by the service."""

        def recover(placement: Placement, actor: Actor) -> str:
            after = reclaim.reclaim(
                session=placement.session, recover_to_gateway_generation=placement.generation, actor=actor
            )
            return f"Recovered to the gateway via admin action: failed@{placement.generation} -> {after.state}."

        per_object_action(self, request, queryset, label=_placement_label, skip_reason=lambda p: None, act=recover)

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
class WorkerEnvironmentAdmin(ViewOnlyObjectsMixin, admin.ModelAdmin):
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
    actions = ("destroy_environments",)

    @admin.action(description="Destroy environment (environments.destroy, no force)", permissions=["change"])
    def destroy_environments(self, request: HttpRequest, queryset: QuerySet[WorkerEnvironment]) -> None:
        """Tear the environment down; one attached to a session is refused (stop its worker first)."""

        def destroy(environment: WorkerEnvironment, actor: Actor) -> str:
            after = reclaim.environment_destroy(environment_id=environment.pk, force=False, actor=actor)
            return f"Destroyed via admin action: {environment.state} -> {after.state}."

        per_object_action(
            self,
            request,
            queryset,
            label=lambda environment: environment.pk,
            skip_reason=lambda environment: None,
            act=destroy,
        )


@admin.register(PlacementMove)
class PlacementMoveAdmin(ReadOnlyAdmin):
    """Moves in flight (a row outlives its driver only until recovery finishes or fails the move)."""

    list_display = ("operation_id", "session", "source_environment_id", "target_kind", "target_id", "last_error")
    list_filter = ("target_kind",)
    search_fields = ("operation_id", "source_environment_id")
    list_select_related = ("session",)
