"""The console's exec approvals: the commands agents wait to run, and the operator's decision on each.

For logins holding ``operator.approvals``, as ``exec.approval.*`` ask on the wire. The page reads the
approvals selectors; a decision calls the service behind ``exec.approval.resolve`` with the logged-in user
as the actor, so the service writes the audit row (and, for "Always allow here", the policy document's
entry) and its refusal — an approval decided, expired or withdrawn meanwhile — is shown word for word.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from approvals_app import selectors as approval_selectors
from approvals_app.models import ApprovalDecision
from approvals_app.services import approvals as approval_services
from gateway.audit import Actor
from gateway.exceptions import GatewayError

from .access import operator_required
from .views import _refusal

# The gateway events after which the page's parts are fetched again (``console.js``).
LIVE_EVENTS = ("exec.approval.requested", "exec.approval.resolved")
PENDING_SHOWN = 200
SETTLED_SHOWN = 50
DONE = {
    ApprovalDecision.ALLOW_ONCE: "Allowed once",
    ApprovalDecision.ALLOW_ALWAYS: "Always allowed here",
    ApprovalDecision.DENY: "Denied",
}


@require_GET
@operator_required("exec.approval.list")
def approvals(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "operator_ui/approvals.html",
        {
            "pending": list(approval_selectors.pending_approvals().order_by("created_at", "id")[:PENDING_SHOWN]),
            "settled": approval_selectors.settled_approvals(limit=SETTLED_SHOWN),
            "live_events": " ".join(LIVE_EVENTS),
            "nav": "approvals",
        },
    )


@require_POST
@operator_required("exec.approval.resolve")
def approval_decide(request: HttpRequest, approval_id: str, decision: str) -> HttpResponse:
    """``exec.approval.resolve`` for the approval; back to the page the form was on (``next``: the approvals
    page, or a session's page where the approval was shown inline)."""
    if decision not in DONE:
        raise Http404("no such decision")
    asked_at = timezone.now()
    try:
        approval = approval_services.exec_approval_resolve(
            approval_id=approval_id, decision=decision, actor=Actor.for_user(request.user)
        )
    except GatewayError as refused:
        messages.error(request, _refusal(refused))
    else:
        command = approval.request.get("command") or approval.command
        if approval.resolved_at is not None and approval.resolved_at < asked_at:
            # The service answers the same decision made earlier again, and changes nothing.
            messages.info(request, f"Already decided ({approval.decision}, by {approval.resolved_by}): {command}")
        else:
            messages.success(request, f"{DONE[decision]}: {command}")
    return redirect(_back(request))


def _back(request: HttpRequest) -> str:
    """Where the form said to go back to: a page of this console, else the approvals page."""
    target, approvals_page = request.POST.get("next", ""), reverse("ui:approvals")
    console = reverse("ui:sessions").removesuffix("sessions/")
    if target.startswith(console) and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=False
    ):
        return target
    return approvals_page
