"""Admin for sessions, transcripts and chat runs: inspection first, recovery through audited services.

Everything here is written by the services (RPC, JSON API, the turn runner), so the rows are
read-only. State changes only through the two actions, which call a service once per selected
object with ``Actor.for_user(request.user)``: the service checks the state and writes our
``AuditLog`` row; the admin adds Django's history entry and reports "N done, M skipped: <reasons>".
"""

from __future__ import annotations

import json
from typing import get_args

from django.contrib import admin
from django.contrib.admin.utils import flatten_fieldsets
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from gateway import scopes as sc
from gateway.admin.common import (
    EstimatedCountPaginator,
    ReadOnlyAdmin,
    ReadOnlyTabularInline,
    ViewOnlyObjectsMixin,
    audit_history_link,
    operator_action,
    per_object_action,
    short_id,
)
from gateway.audit import Actor
from gateway.exceptions import Conflict
from gateway.redaction import shown_path

from .model_providers.base import ModelProviderErrorKind
from .models import Run, RunStatus, Session, SessionWindow, ToolArtifact, TranscriptEvent
from .services import initialization, runs, sessions
from .tasks import STALE_RUN_AFTER

ACTIVE_RUN_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING)


def _changelist_link(model: type, query: str, text: str) -> str:
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    return format_html('<a href="{}?{}">{}</a>', url, query, text)


def _preview(text: str, size: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= size else text[: size - 1] + "…"


# --- list filters ---------------------------------------------------------------------------


class ArchivedFilter(admin.SimpleListFilter):
    title = "archived"
    parameter_name = "archived"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("no", "Active"), ("yes", "Archived")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "no":
            return queryset.filter(archived_at__isnull=True)
        if self.value() == "yes":
            return queryset.filter(archived_at__isnull=False)
        return queryset


class RunStateFilter(admin.SimpleListFilter):
    """Active turns, and the running ones whose executor went quiet (what the sweep will fail)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [
            ("active", "Queued or running"),
            ("stale", f"Running, no heartbeat for {int(STALE_RUN_AFTER.total_seconds())} s"),
            ("abort", "Stop requested, still active"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == "active":
            return queryset.filter(status__in=ACTIVE_RUN_STATUSES)
        if value == "stale":
            stale = Q(heartbeat_at__lt=timezone.now() - STALE_RUN_AFTER) | Q(heartbeat_at__isnull=True)
            return queryset.filter(stale, status=RunStatus.RUNNING)
        if value == "abort":
            return queryset.filter(status__in=ACTIVE_RUN_STATUSES, abort_requested_at__isnull=False)
        return queryset


class ErrorKindFilter(admin.SimpleListFilter):
    """Fixed choices: a DISTINCT over the runs table would scan it."""

    title = "error kind"
    parameter_name = "error_kind"
    KINDS = (*get_args(ModelProviderErrorKind), "interrupted", runs.WORKER_MISSING)

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(kind, kind) for kind in self.KINDS]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() in self.KINDS:
            return queryset.filter(error_kind=self.value())
        return queryset


# --- sessions -------------------------------------------------------------------------------


class SessionWindowInline(ReadOnlyTabularInline):
    model = SessionWindow
    fields = ("id", "reason", "previous_session_id", "created_at", "transcript_link")
    readonly_fields = fields
    ordering = ("-created_at",)

    @admin.display(description="transcript")
    def transcript_link(self, obj: SessionWindow) -> str:
        return _changelist_link(TranscriptEvent, f"window__id__exact={obj.pk}", "entries")


def _session_label(session: Session) -> str:
    return session.key


@admin.register(Session)
class SessionAdmin(ViewOnlyObjectsMixin, admin.ModelAdmin):
    list_display = (
        "key",
        "agent_id",
        "label",
        "status",
        "is_pending",
        "is_archived",
        "is_pinned",
        "last_run_id",
        "updated_at",
    )
    list_filter = (ArchivedFilter, "status", "initialization_pending", "agent_id", "created_via")
    search_fields = ("key", "label", "display_name", "=session_id")
    ordering = ("-updated_at",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    inlines = (SessionWindowInline,)
    actions = ("reset_sessions", "clear_stuck_initializations")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "key",
                    "agent_id",
                    "session_id",
                    "lifecycle_revision",
                    "revision",
                    "initialization_pending",
                    "status",
                    "last_run_id",
                    "runs_link",
                    "audit_history",
                )
            },
        ),
        ("Display", {"fields": ("label", "display_name", "category", "archived_at", "pinned_at")}),
        (
            "Origin",
            {
                "fields": (
                    "created_via",
                    "parent_session_key",
                    "fork_source_session_key",
                    "fork_source_session_id",
                    "fork_source_entry_id",
                    "working_directory",
                    "worktree_shown",
                )
            },
        ),
        ("Model", {"fields": ("model_provider", "model", "input_tokens", "output_tokens")}),
        ("Timestamps", {"fields": ("created_at", "updated_at", "last_interaction_at")}),
    )
    # Every field: a session changes only through services (guarded by sessionId/lifecycleRevision/revision).
    readonly_fields = tuple(flatten_fieldsets(fieldsets))

    # Paths on the gateway host are named as sessions.describe names them (relative to the state directory).
    @admin.display(description="cwd")
    def working_directory(self, obj: Session) -> str:
        return shown_path(obj.cwd) if obj.cwd else "—"

    @admin.display(description="worktree")
    def worktree_shown(self, obj: Session) -> str:
        if not obj.worktree:
            return "—"
        paths = {
            name: shown_path(value) for name, value in obj.worktree.items() if name in ("path", "repoRoot") and value
        }
        return json.dumps({**obj.worktree, **paths}, sort_keys=True)

    @admin.display(description="pending", boolean=True, ordering="initialization_pending")
    def is_pending(self, obj: Session) -> bool:
        return obj.initialization_pending

    @admin.display(description="archived", boolean=True, ordering="archived_at")
    def is_archived(self, obj: Session) -> bool:
        return obj.archived_at is not None

    @admin.display(description="pinned", boolean=True, ordering="pinned_at")
    def is_pinned(self, obj: Session) -> bool:
        return obj.pinned_at is not None

    @admin.display(description="runs")
    def runs_link(self, obj: Session) -> str:
        return _changelist_link(Run, f"session__id__exact={obj.pk}", "runs of this session")

    @admin.display(description="audit")
    def audit_history(self, obj: Session) -> str:
        return audit_history_link(obj.key, "session")

    @operator_action("sessions.reset", description="Reset selected sessions")
    def reset_sessions(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        """A new transcript generation per session; queued turns fail, a running turn blocks it."""

        def reset(session: Session, actor: Actor) -> str:
            previous = session.session_id
            new = sessions.session_reset(key=session.key, reason="reset", actor=actor)
            return f"Reset via admin action: sessionId {previous} -> {new.session_id}."

        per_object_action(
            self,
            request,
            queryset,
            label=_session_label,
            skip_reason=lambda session: "initializing" if session.initialization_pending else None,
            act=reset,
        )

    @operator_action(scope=sc.ADMIN, description="Clear stuck initialization (guarded rollback)")
    def clear_stuck_initializations(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        """Remove sessions left initializing (a process died mid-fork) through the guarded rollback:
        exactly what the initialization still owns is undone; anything a successor took is kept."""

        def clear(session: Session, actor: Actor) -> str:
            initialization.clear_stuck_initialization(key=session.key, actor=actor)
            return "Cleared a stuck initialization via admin action."

        per_object_action(
            self,
            request,
            queryset,
            label=_session_label,
            skip_reason=lambda session: None if session.initialization_pending else "not initializing",
            act=clear,
            deletes=True,
        )


@admin.register(SessionWindow)
class SessionWindowAdmin(ReadOnlyAdmin):
    list_display = ("id", "session_link", "reason", "previous_session_id", "created_at", "transcript_link")
    list_filter = ("reason",)
    list_select_related = ("session",)
    search_fields = ("=id", "=previous_session_id", "session__key")
    ordering = ("-created_at",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fields = ("id", "session", "reason", "previous_session_id", "created_at", "transcript_link")
    readonly_fields = fields

    @admin.display(description="session", ordering="session__key")
    def session_link(self, obj: SessionWindow) -> str:
        url = reverse("admin:sessions_app_session_change", args=[obj.session_id])
        return format_html('<a href="{}">{}</a>', url, obj.session.key)

    @admin.display(description="transcript")
    def transcript_link(self, obj: SessionWindow) -> str:
        return _changelist_link(TranscriptEvent, f"window__id__exact={obj.pk}", "entries")


@admin.register(TranscriptEvent)
class TranscriptEventAdmin(ReadOnlyAdmin):
    """The biggest table: exact-match search on indexed ids, no full count, no DISTINCT filters."""

    list_display = ("session_key", "window_short", "seq", "type", "role", "text_preview", "event_short", "created_at")
    list_select_related = ("window__session",)
    search_fields = ("=event_id", "=window__id", "=window__session__key", "=idempotency_key")
    ordering = ("-id",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fields = ("window", "seq", "event_id", "parent_id", "type", "idempotency_key", "created_at", "body_json")
    readonly_fields = fields

    @admin.display(description="session", ordering="window__session__key")
    def session_key(self, obj: TranscriptEvent) -> str:
        return obj.window.session.key

    @admin.display(description="window (sessionId)", ordering="window_id")
    def window_short(self, obj: TranscriptEvent) -> str:
        return short_id(obj.window_id, 8)

    @admin.display(description="entry", ordering="event_id")
    def event_short(self, obj: TranscriptEvent) -> str:
        return short_id(obj.event_id, 8)

    @admin.display(description="role")
    def role(self, obj: TranscriptEvent) -> str:
        return str(obj.body.get("role", "—")) if isinstance(obj.body, dict) else "—"

    @admin.display(description="text")
    def text_preview(self, obj: TranscriptEvent) -> str:
        content = obj.body.get("content", []) if isinstance(obj.body, dict) else []
        return _preview("".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"))

    @admin.display(description="body")
    def body_json(self, obj: TranscriptEvent) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.body, indent=2, ensure_ascii=False, sort_keys=True))


# --- runs -----------------------------------------------------------------------------------


def _run_label(run: Run) -> str:
    return f"run {run.run_id} of {run.session_key}"


def _not_active_reason(run: Run) -> str | None:
    return None if run.status in ACTIVE_RUN_STATUSES else f"{run.status}, not queued or running"


@admin.register(Run)
class RunAdmin(ViewOnlyObjectsMixin, admin.ModelAdmin):
    list_display = (
        "run_id",
        "session_key",
        "status",
        "abort_requested",
        "executor",
        "heartbeat_at",
        "started_at",
        "ended_at",
        "error_short",
    )
    list_filter = (RunStateFilter, "status", ErrorKindFilter)
    search_fields = ("run_id", "session_key")
    ordering = ("-created_at",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    actions = ("abort_runs",)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "run_id",
                    "session",
                    "session_key",
                    "window",
                    "status",
                    "executor",
                    "heartbeat_at",
                    "abort_requested_at",
                )
            },
        ),
        ("Turn", {"fields": ("message", "output_text", "stop_reason", "error", "error_kind", "usage")}),
        ("Model", {"fields": ("model_provider", "model")}),
        ("Transcript", {"fields": ("user_event_id", "assistant_event_id")}),
        ("Timestamps", {"fields": ("created_at", "started_at", "ended_at")}),
    )
    # Every field: a run moves queued -> running -> ok|error|aborted by compare-and-set in services.
    readonly_fields = tuple(flatten_fieldsets(fieldsets))

    @admin.display(description="stop requested", boolean=True, ordering="abort_requested_at")
    def abort_requested(self, obj: Run) -> bool:
        return obj.abort_requested_at is not None

    @admin.display(description="error", ordering="error")
    def error_short(self, obj: Run) -> str:
        return _preview(obj.error, 60) or "—"

    @operator_action("chat.abort", description="Abort selected turns")
    def abort_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        """Queued turns end at once; a running turn is asked to stop (its runner keeps the partial text)."""

        def abort(run: Run, actor: Actor) -> str:
            if not runs.run_abort(session_key=run.session_key, run_id=run.run_id, actor=actor):
                raise Conflict("ended meanwhile")
            if run.status == RunStatus.QUEUED:
                return "Aborted via admin action (was queued)."
            return "Stop requested via admin action (was running)."

        per_object_action(
            self,
            request,
            queryset,
            label=_run_label,
            skip_reason=_not_active_reason,
            act=abort,
        )


@admin.register(ToolArtifact)
class ToolArtifactAdmin(ReadOnlyAdmin):
    """The whole outputs of tool calls whose transcript copy was truncated (``details.artifactId``)."""

    list_display = (
        "id",
        "session_key",
        "run_link",
        "tool_name",
        "tool_call_id",
        "size_bytes",
        "total_bytes",
        "created_at",
    )
    list_filter = ("tool_name",)
    search_fields = ("=id", "=run__run_id", "session_key", "tool_call_id")
    list_select_related = ("run",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fields = (
        "id",
        "session_key",
        "run",
        "message_key",
        "tool_call_id",
        "tool_name",
        "size_bytes",
        "total_bytes",
        "created_at",
        "output",
    )
    readonly_fields = fields
    raw_id_fields = ("run",)

    @admin.display(description="run")
    def run_link(self, obj: ToolArtifact) -> str:
        url = reverse("admin:sessions_app_run_change", args=[obj.run_id])
        return format_html('<a href="{}">{}</a>', url, short_id(obj.run_id))

    @admin.display(description="output")
    def output(self, obj: ToolArtifact) -> str:
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', obj.content)
