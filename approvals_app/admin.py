"""Admin for exec approvals and exec policy documents.

Approvals are read-only; the one action denies the selected pending ones, each through the service
(``exec_approval_resolve`` with the admin user as actor: compare-and-set, audit row, events). A policy
document is edited as JSON and saved through ``exec_policy_set`` with the hash it was opened with, so an
edit made meanwhile (an operator, an allow-always decision) is not overwritten.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.utils import timezone
from django.utils.html import format_html

from gateway.admin.common import (
    EstimatedCountPaginator,
    ViewOnlyObjectsMixin,
    audit_history_link,
    operator_action,
    per_object_action,
    short_id,
)
from gateway.audit import Actor
from gateway.exceptions import GatewayError
from gateway.user_scopes import user_may_call
from openclaw_client.agent import exec_policy

from .models import ApprovalDecision, ApprovalStatus, ExecApproval, ExecApprovalPolicy
from .services import approvals, policies


def _pretty_json(value: Any) -> str:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def _preview(text: str, size: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= size else text[: size - 1] + "…"


# --- approvals ---------------------------------------------------------------------------------------


class ApprovalStateFilter(admin.SimpleListFilter):
    """Status, with pending split into still open and overdue (waiting for the expiry sweep)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [
            ("open", "Pending (open)"),
            ("overdue", "Pending (overdue)"),
            *[(status.value, status.label) for status in ApprovalStatus if status != ApprovalStatus.PENDING],
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == "open":
            return queryset.filter(status=ApprovalStatus.PENDING, expires_at__gt=timezone.now())
        if value == "overdue":
            return queryset.filter(status=ApprovalStatus.PENDING, expires_at__lte=timezone.now())
        if value in ApprovalStatus.values:
            return queryset.filter(status=value)
        return queryset


def _approval_label(approval: ExecApproval) -> str:
    return f"approval {short_id(approval.id, 8)} ({_preview(approval.command, 40)})"


@admin.register(ExecApproval)
class ExecApprovalAdmin(ViewOnlyObjectsMixin, admin.ModelAdmin):
    list_display = (
        "id_short",
        "status",
        "decision",
        "command_preview",
        "host",
        "node_id_short",
        "agent_id",
        "session_key",
        "created_at",
        "expires_at",
        "resolved_by",
        "resolved_at",
    )
    list_filter = (ApprovalStateFilter, "host", "decision", "agent_id")
    search_fields = ("=id", "session_key", "session_id", "run_id", "command")
    ordering = ("-created_at",)
    date_hierarchy = "created_at"
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    actions = ("deny_pending",)
    fields = (
        "id",
        "status",
        "decision",
        "terminal_reason",
        "command",
        "command_argv",
        "cwd",
        "host",
        "node_id",
        "agent_id",
        "session_key",
        "session_id",
        "run_id",
        "tool_call_id",
        "request_json",
        "requested_by",
        "requested_by_device",
        "requested_by_conn",
        "resolved_by",
        "resolved_by_device",
        "created_at",
        "expires_at",
        "resolved_at",
        "audit_history",
    )
    # Every field: an approval changes only through the services (the action below, the RPC, the API).
    readonly_fields = fields

    @admin.display(description="approval", ordering="id")
    def id_short(self, obj: ExecApproval) -> str:
        return short_id(obj.id, 12)

    @admin.display(description="command")
    def command_preview(self, obj: ExecApproval) -> str:
        return _preview(obj.command)

    @admin.display(description="node", ordering="node_id")
    def node_id_short(self, obj: ExecApproval) -> str:
        return short_id(obj.node_id) if obj.node_id else "—"

    @admin.display(description="request (as operators see it)")
    def request_json(self, obj: ExecApproval) -> str:
        return _pretty_json(obj.request)

    @admin.display(description="audit")
    def audit_history(self, obj: ExecApproval) -> str:
        return audit_history_link(obj.id, "exec_approval")

    def _not_open_reason(self, obj: ExecApproval) -> str | None:
        if obj.status != ApprovalStatus.PENDING:
            return f"{obj.status}, not pending"
        if obj.expires_at <= timezone.now():
            return "expired (awaiting the expiry sweep)"
        return None

    @operator_action("exec.approval.resolve", description="Deny selected pending approvals")
    def deny_pending(self, request: HttpRequest, queryset: QuerySet[ExecApproval]) -> None:
        def deny(obj: ExecApproval, actor: Actor) -> str:
            approvals.exec_approval_resolve(approval_id=obj.id, decision=ApprovalDecision.DENY, actor=actor)
            return "Denied via admin action."

        per_object_action(self, request, queryset, label=_approval_label, skip_reason=self._not_open_reason, act=deny)


# --- policy documents ----------------------------------------------------------------------------------


class ExecPolicyForm(forms.ModelForm):
    """The document as JSON, and the hash it was opened with (the compare-and-set token)."""

    document_json = forms.CharField(
        label="document",
        widget=forms.Textarea(attrs={"rows": 30, "cols": 100, "class": "vLargeTextField", "spellcheck": "false"}),
        help_text=(
            'OpenClaw\'s exec approvals file: {"version": 1, "defaults": {...}, "agents": {"<agentId>": '
            '{"security", "ask", "askFallback", "allowlist": [...]}}} (docs/exec-approvals.md).'
        ),
    )
    base_hash = forms.CharField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = ExecApprovalPolicy
        fields = ("scope",)
        help_texts = {"scope": '"gateway", or "node:<deviceId>" of a paired node'}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "scope" not in self.fields:
            return  # a viewer's form: the admin shows every field read-only
        instance = self.instance
        if not instance._state.adding:
            self.fields["scope"].disabled = True
            self.fields["document_json"].initial = json.dumps(instance.document, indent=2, sort_keys=True)
            self.fields["base_hash"].initial = instance.hash
        else:
            self.fields["document_json"].initial = json.dumps(exec_policy.empty_document(), indent=2)

    def clean_scope(self) -> str:
        scope = self.cleaned_data["scope"]
        if not self.fields["scope"].disabled:
            try:
                policies.policy_scope_check(scope)
            except GatewayError as error:
                raise forms.ValidationError(error.message) from None
            if ExecApprovalPolicy.objects.filter(scope=scope).exists():
                raise forms.ValidationError("this scope has a document already: edit it")
        return scope

    def clean_document_json(self) -> dict[str, Any]:
        try:
            document = json.loads(self.cleaned_data["document_json"])
        except ValueError as error:
            raise forms.ValidationError(f"not JSON: {error}") from None
        try:
            policies.document_from_file(document)
        except GatewayError as error:
            raise forms.ValidationError(error.message) from None
        return document

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        # Checked here too, so that the common case (someone saved first) is a form error and not a lost edit.
        if not self.instance._state.adding:
            current = (
                ExecApprovalPolicy.objects.filter(scope=self.instance.scope).values_list("hash", flat=True).first()
            )
            if current != cleaned.get("base_hash"):
                raise forms.ValidationError(
                    f"{policies.CHANGED_SINCE_LOAD.split(';')[0]}: reload this page to see the current document"
                )
        return cleaned


@admin.register(ExecApprovalPolicy)
class ExecApprovalPolicyAdmin(admin.ModelAdmin):
    form = ExecPolicyForm
    list_display = ("scope", "hash_short", "agents_count", "entries_count", "updated_at", "updated_by")
    search_fields = ("scope",)
    ordering = ("scope",)
    readonly_fields = ("hash", "updated_at", "updated_by", "resolved_defaults", "document_view", "audit_history")

    # The result of the last save of this request: a compare-and-set that lost between the form's check and
    # the write is reported instead of Django's success message (and no history entry is written).
    SAVE_ERROR = "exec_policy_save_error"

    def get_fields(self, request: HttpRequest, obj: ExecApprovalPolicy | None = None) -> list[str]:
        if obj is not None and not self.has_change_permission(request, obj):
            return ["scope", "document_view", "hash", "resolved_defaults", "updated_at", "updated_by", "audit_history"]
        if obj is None:
            return ["scope", "document_json"]
        return [
            "scope",
            "document_json",
            "base_hash",
            "hash",
            "resolved_defaults",
            "updated_at",
            "updated_by",
            "audit_history",
        ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Writing a policy is ``exec.approvals.set``: the wire's scope on top of the model permission.
        return super().has_add_permission(request) and user_may_call(request.user, "exec.approvals.set")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_change_permission(request, obj) and user_may_call(request.user, "exec.approvals.set")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # an empty document is written through the form, with its hash and an audit row

    @admin.display(description="hash")
    def hash_short(self, obj: ExecApprovalPolicy) -> str:
        return short_id(obj.hash, 12)

    @admin.display(description="agents")
    def agents_count(self, obj: ExecApprovalPolicy) -> int:
        return len(obj.document.get("agents", {}))

    @admin.display(description="allowlist entries")
    def entries_count(self, obj: ExecApprovalPolicy) -> int:
        return sum(len(agent.get("allowlist", [])) for agent in obj.document.get("agents", {}).values())

    @admin.display(description="resolved defaults")
    def resolved_defaults(self, obj: ExecApprovalPolicy) -> str:
        return _pretty_json(exec_policy.resolved_defaults(obj.document))

    @admin.display(description="document")
    def document_view(self, obj: ExecApprovalPolicy) -> str:
        return _pretty_json(obj.document)

    @admin.display(description="audit")
    def audit_history(self, obj: ExecApprovalPolicy) -> str:
        return audit_history_link(obj.scope, "exec_approval_policy")

    def save_model(self, request: HttpRequest, obj: ExecApprovalPolicy, form: ExecPolicyForm, change: bool) -> None:
        """Through the service (never ``obj.save()``): validation, compare-and-set on the hash, audit row."""
        try:
            saved = policies.exec_policy_set(
                scope=form.cleaned_data["scope"],
                file=form.cleaned_data["document_json"],
                base_hash=form.cleaned_data.get("base_hash") or None,
                actor=Actor.for_user(request.user),
            )
        except GatewayError as error:
            setattr(request, self.SAVE_ERROR, error.message)
            return
        obj.document, obj.hash, obj.updated_at, obj.updated_by = (
            saved.document,
            saved.hash,
            saved.updated_at,
            saved.updated_by,
        )

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        pass  # no relations; and form.save_m2m would need the ModelForm's own save

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if getattr(request, self.SAVE_ERROR, None) is None:
            return super().log_addition(request, obj, message)
        return None

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if getattr(request, self.SAVE_ERROR, None) is None:
            return super().log_change(request, obj, message)
        return None

    def response_add(self, request: HttpRequest, obj: ExecApprovalPolicy, post_url_continue: str | None = None):
        return self._refused(request) or super().response_add(request, obj, post_url_continue)

    def response_change(self, request: HttpRequest, obj: ExecApprovalPolicy):
        return self._refused(request) or super().response_change(request, obj)

    def _refused(self, request: HttpRequest) -> HttpResponseRedirect | None:
        error = getattr(request, self.SAVE_ERROR, None)
        if error is None:
            return None
        self.message_user(request, f"Not saved: {error}", messages.ERROR)
        return HttpResponseRedirect(request.path)
