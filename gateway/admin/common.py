"""Shared pieces of the project's admins: scoped actions and their runner, read-only mixins, liveness filters,
paginator."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.http import urlencode

from gateway.audit import Actor
from gateway.exceptions import GatewayError
from gateway.redaction import operator_text
from gateway.selectors import process_stale_before
from gateway.user_scopes import missing_scope

# --- shared helpers -------------------------------------------------------------------------


def short_id(value: object, size: int = 12) -> str:
    return str(value)[:size]


def join_or_dash(values: Iterable[str] | None) -> str:
    return ", ".join(values or []) or "—"


def audit_history_url(target_id: str, target_type: str | None = None) -> str:
    """The audit log's list filtered to one object (``target_id``, and its type when ids could clash)."""
    query = {"target_id__exact": target_id}
    if target_type is not None:
        query["target_type__exact"] = target_type
    return f"{reverse('admin:gateway_auditlog_changelist')}?{urlencode(query)}"


def audit_history_link(target_id: str, target_type: str | None = None) -> str:
    return format_html('<a href="{}">audit history</a>', audit_history_url(target_id, target_type))


def report_outcome(modeladmin: admin.ModelAdmin, request: HttpRequest, done: int, skipped: list[str]) -> None:
    message = f"{done} done, {len(skipped)} skipped"
    if skipped:
        message += ": " + "; ".join(skipped)
    modeladmin.message_user(request, message, level=messages.WARNING if skipped else messages.SUCCESS)


def per_object_action(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    objects: Iterable[Any],
    *,
    label: Callable[[Any], str],
    skip_reason: Callable[[Any], str | None],
    act: Callable[[Any, Actor], str],
    deletes: bool = False,
) -> None:
    """Run one audited service call per object; ``act`` returns the Django history message.

    Domain errors skip the object with the service's message; the summary says
    "N done, M skipped: <reasons>". With ``deletes`` the object is gone afterwards and Django's
    history records a deletion.
    """
    actor = Actor.for_user(request.user)
    done, skipped = 0, []
    for obj in objects:
        reason = skip_reason(obj)
        if reason is not None:
            skipped.append(f"{label(obj)}: {reason}")
            continue
        try:
            history = act(obj, actor)
        except GatewayError as exc:
            skipped.append(f"{label(obj)}: {operator_text(exc)}")
            continue
        done += 1
        if deletes:
            modeladmin.log_deletions(request, [obj])
        else:
            obj.refresh_from_db()
            modeladmin.log_change(request, obj, history)
    report_outcome(modeladmin, request, done, skipped)


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


def operator_action(
    *methods: str, scope: str | None = None, description: str, permissions: Sequence[str] = ("change",)
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``@admin.action`` for an action that does what the gateway ``methods`` do (``scope``: what it needs when no
    method does it). Besides the model ``permissions`` Django checks, :class:`OperatorActionsMixin` offers and
    runs it only for a user holding the wire's scope for the same work."""
    if bool(methods) == (scope is not None):
        raise TypeError("name the gateway methods the action does the work of, or the scope it needs")

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        action = admin.action(description=description, permissions=list(permissions))(func)
        action.operator_methods = methods  # type: ignore[attr-defined]
        action.operator_scope = scope  # type: ignore[attr-defined]
        return action

    return decorator


def action_allowed(user: Any, action: Callable[..., Any]) -> bool:
    """An action declared with :func:`operator_action` for a user holding its scope; any other action is
    refused (so an action added without a scope is never offered to anyone)."""
    if not hasattr(action, "operator_methods"):
        return False
    return missing_scope(user, action.operator_methods, action.operator_scope) is None


class OperatorActionsMixin:
    """Actions are offered (listed, and accepted when posted: Django runs only what this returns) to users who
    hold the operator scope each one needs, on top of Django's model permissions."""

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)  # type: ignore[misc]
        return {name: entry for name, entry in actions.items() if action_allowed(request.user, entry[0])}


class ViewOnlyObjectsMixin(OperatorActionsMixin):
    """Objects open read-only; the model-level change permission (with the action's operator scope) only
    unlocks the actions.

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


class ReadOnlyTabularInline(admin.TabularInline):
    """Related rows shown for inspection only (they change through services, never here)."""

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


class ReadOnlyAdmin(admin.ModelAdmin):
    """Fully read-only: rows are owned by the gateway processes (or are the audit trail)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- list filters ---------------------------------------------------------------------------


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
