"""Admin of workers_app: placements with their history, environments with their error, and the recovery
actions of the RPCs (``sessions.reclaim``, its recover-to-gateway form, ``environments.destroy``) through
the same services: each refuses with the service's own message when the state moved on, and writes an
audit row (who, what, before, after)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from django.contrib import admin
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from gateway import scopes as sc
from gateway.admin.common import (
    EstimatedCountPaginator,
    ReadOnlyAdmin,
    ViewOnlyObjectsMixin,
    audit_history_link,
    operator_action,
    per_object_action,
)
from gateway.audit import Actor
from gateway.redaction import host_paths_out

from .models import TERMINAL_ENVIRONMENT_STATES, Placement, PlacementHistory, PlacementMove, WorkerEnvironment
from .profiles import profile_shown
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
    # The workspace directory as clients see it (a local worker's lies under this host's state directory).
    readonly_fields = [
        *(field.name if field.name != "remote_workspace_dir" else "workspace_dir" for field in Placement._meta.fields),
        "history",
        "audit_history",
    ]
    exclude = ("remote_workspace_dir",)
    actions = ("stop_workers", "recover_to_gateway", "fail_placements")

    @admin.display(description="remote workspace dir")
    def workspace_dir(self, obj: Placement) -> str:
        return host_paths_out(obj.remote_workspace_dir) if obj.remote_workspace_dir else "—"

    @operator_action("sessions.reclaim", description="Stop the worker / reclaim (sessions.reclaim)")
    def stop_workers(self, request: HttpRequest, queryset: QuerySet[Placement]) -> None:
        """Active → reclaimed; a dispatch in flight is canceled; failed → local once its teardown is done."""

        def stop(placement: Placement, actor: Actor) -> str:
            before = f"{placement.state}@{placement.generation}"
            after = reclaim.reclaim(session=placement.session, actor=actor)
            return f"Reclaimed via admin action: {before} -> {after.state}@{after.generation}."

        per_object_action(self, request, queryset, label=_placement_label, skip_reason=lambda p: None, act=stop)

    @operator_action("sessions.reclaim", description="Recover a failed placement to the gateway")
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

    @operator_action(scope=sc.ADMIN, description="Fail placement (gives its worker up; asks for confirmation)")
    def fail_placements(self, request: HttpRequest, queryset: QuerySet[Placement]) -> TemplateResponse | None:
        """Fail a dispatch or move that stopped moving, or a worker given up, as recovery fails an interrupted
        one: the worker loses ownership, its environment is torn down, the placement ends ``failed`` (then
        "Recover a failed placement to the gateway" continues the session here).

        1. First POST (from the action bar): the confirmation page, with each placement as it is now.
        2. Second POST (``post=yes``): ``placement_force_fail`` once per placement, for the state and
           generation shown on the confirmation page (a placement that moved on since is refused).
        """
        placements = list(queryset.select_related("session"))
        if request.POST.get("post") != "yes":
            return self._fail_confirmation(request, placements)

        def fail(placement: Placement, actor: Actor) -> str:
            shown = request.POST.get(f"expected-{placement.pk}", "")
            state, _, generation = shown.partition("@")
            before = f"{placement.state}@{placement.generation}"
            after = reclaim.placement_force_fail(
                session=placement.session,
                expected_state=state or placement.state,
                expected_generation=int(generation) if generation.isdigit() else placement.generation,
                actor=actor,
            )
            return f"Failed via admin action: {before} -> {after.state}@{after.generation}: {after.recovery_error}"

        per_object_action(self, request, placements, label=_placement_label, skip_reason=lambda p: None, act=fail)
        return None

    def _fail_confirmation(self, request: HttpRequest, placements: list[Placement]) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": "Fail worker placements?",
            "subtitle": None,
            "opts": self.opts,
            "intro": (
                f'Each placement fails with "{reclaim.FAILED_BY_OPERATOR}": a worker that owns it loses ownership, '
                "its environment is torn down, and the session's work on the worker is given up. Only placements "
                "still in the state shown here are failed; each is recorded in the audit log."
            ),
            "columns": ("Session", "State now", "Environment", "Updated (ms)"),
            "rows": [
                (p.session_key, f"{p.state}@{p.generation}", p.environment_id or "—", p.updated_at_ms)
                for p in placements
            ],
            "queryset": placements,
            "expected": [(f"expected-{p.pk}", f"{p.state}@{p.generation}") for p in placements],
            "action_name": "fail_placements",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "confirm_label": f"Yes, fail {len(placements)} placement{'s' if len(placements) != 1 else ''}",
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/action_confirmation.html", context)

    @admin.display(description="audit")
    def audit_history(self, obj: Placement) -> str:
        return audit_history_link(obj.session_key, "session")

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
    """Every placement transition of every session, newest first (a placement's page shows its own)."""

    list_display = ("at", "session_key", "from_state", "to_state", "generation", "environment_id", "actor", "reason")
    list_filter = ("to_state", "from_state")
    search_fields = ("=session_key", "=environment_id", "actor")
    search_help_text = "A session's exact key, an environment's exact id, or an actor."
    ordering = ("-id",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    @admin.display(description="at (UTC)", ordering="at_ms")
    def at(self, obj: PlacementHistory) -> str:
        return datetime.fromtimestamp(obj.at_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _teardown_pending(environment: WorkerEnvironment) -> bool:
    return environment.destroy_requested_at_ms is not None and environment.state not in TERMINAL_ENVIRONMENT_STATES


def _no_teardown_pending(environment: WorkerEnvironment) -> str | None:
    if environment.state in TERMINAL_ENVIRONMENT_STATES:
        return f"already {environment.state}"
    return None if _teardown_pending(environment) else "no teardown pending"


class TeardownPendingFilter(admin.SimpleListFilter):
    """Environments whose teardown was asked for and has not finished (what "Retry teardown" is for)."""

    title = "teardown"
    parameter_name = "teardown"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("pending", "Pending")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "pending":
            return queryset.filter(destroy_requested_at_ms__isnull=False).exclude(state__in=TERMINAL_ENVIRONMENT_STATES)
        return queryset


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
    list_filter = (TeardownPendingFilter, "state", "provider_id")
    search_fields = ("environment_id", "lease_id", "node_device_id")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    # The SSH key reference stays out of the admin as it stays out of every API; the profile is shown with its key
    # file named, not located (the path is the gateway host's).
    exclude = ("ssh_key_ref", "profile_snapshot")
    readonly_fields = [
        *(
            field.name if field.name != "profile_snapshot" else "profile"
            for field in WorkerEnvironment._meta.fields
            if field.name != "ssh_key_ref"
        ),
        "audit_history",
    ]
    actions = ("destroy_environments", "retry_teardowns")

    @admin.display(description="audit")
    def audit_history(self, obj: WorkerEnvironment) -> str:
        return audit_history_link(obj.environment_id, "environment")

    @admin.display(description="profile snapshot")
    def profile(self, obj: WorkerEnvironment) -> str:
        return json.dumps(profile_shown(obj.profile_snapshot), indent=2, sort_keys=True)

    @operator_action("environments.destroy", description="Retry teardown (environments.destroy, no force)")
    def retry_teardowns(self, request: HttpRequest, queryset: QuerySet[WorkerEnvironment]) -> None:
        """An environment whose teardown was requested but did not finish (its provider failed to release
        the lease): the same service as "Destroy environment" asks the provider again. A refusal or a new
        provider failure is reported with the service's message; the environment keeps its last error."""

        def retry(environment: WorkerEnvironment, actor: Actor) -> str:
            after = reclaim.environment_destroy(environment_id=environment.pk, force=False, actor=actor)
            return f"Teardown retried via admin action: {environment.state} -> {after.state}."

        per_object_action(
            self,
            request,
            queryset,
            label=lambda environment: environment.pk,
            skip_reason=_no_teardown_pending,
            act=retry,
        )

    @operator_action("environments.destroy", description="Destroy environment (environments.destroy, no force)")
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

    list_display = (
        "operation_id",
        "session",
        "source_environment_id",
        "target_kind",
        "target_id",
        "driver",
        "last_error",
    )
    list_filter = ("target_kind",)
    search_fields = ("operation_id", "source_environment_id")
    list_select_related = ("session",)
