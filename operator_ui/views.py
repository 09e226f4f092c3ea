"""Pages of the operators' console. Reads go through the apps' selectors, writes through the same
services the gateway's RPC methods call, with the same schemas bounding the input first; a refusal
shows the service's own error message and changes nothing."""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET, require_POST
from pydantic import ValidationError

from approvals_app import selectors as approval_selectors
from devices_app import selectors as device_selectors
from devices_app.services import pairing
from gateway import scopes
from gateway.audit import Actor
from gateway.exceptions import GatewayError, InvalidRequest
from gateway.protocol import error_path, validation_message
from gateway.redaction import operator_text
from gateway.user_scopes import user_has_scope, user_may_call
from openclaw_site.admin_site import rate_limited_login
from sessions_app import keys
from sessions_app import selectors as session_selectors
from sessions_app.models import RunStatus
from sessions_app.schemas import ChatSendParams, SessionsCreateParams, SessionsForkParams
from sessions_app.services import creation, forks, runs
from workers_app import operations
from workers_app import selectors as worker_selectors
from workers_app.profiles import profiles_all
from workers_app.services import reclaim

from .access import forbidden, operator_required
from .transcript import build as build_transcript
from .transcript import check_image

PAGE_SIZE = 50
# The session page's fallback title: the key's last part, cut to this many characters.
FALLBACK_TITLE_LENGTH = 24
_login_form = auth_views.LoginView.as_view(template_name="operator_ui/login.html")


def login(request: HttpRequest) -> HttpResponse:
    """Django's login, with failed attempts counted per address together with the admin's."""
    return rate_limited_login(request, lambda: _login_form(request))


# The pages a login lands on, first the one its scopes open (the view's own gateway method).
HOME_PAGES = (
    ("ui:sessions", "sessions.list"),
    ("ui:approvals", "exec.approval.list"),
    ("ui:pairing", "device.pair.list"),
)


@require_GET
@login_required(login_url="ui:login")
def home(request: HttpRequest) -> HttpResponse:
    """Where ``/ui/`` and a login go: the first page the user's scopes open; none at all is a 403 that says so."""
    for page, method in HOME_PAGES:
        if user_may_call(request.user, method):
            return redirect(page)
    return forbidden(request, "this login holds no operator scope: ask an administrator for one")


@require_GET
@operator_required("sessions.describe", "chat.history")
def session_detail(request: HttpRequest, key: str) -> HttpResponse:
    session = session_selectors.session_get(_canonical(key))
    if session is None:
        raise Http404("no such session")
    placement = worker_selectors.placement_for(session)
    environment = worker_selectors.environment_for(placement)
    recent = session_selectors.recent_runs(session, limit=20)
    history = session_selectors.chat_history(session, limit=200)
    # Approvals are for those who may decide them (operator.approvals): others see the calls, not the questions.
    pending = (
        list(approval_selectors.pending_approvals().filter(session_key=session.key))
        if user_may_call(request.user, "exec.approval.list")
        else []
    )
    transcript = build_transcript(
        history["messages"],
        run_statuses={run.run_id: run.status for run in recent},
        pending_approvals=pending,
        image_url=lambda entry_id, index: reverse(
            "ui:session-image", kwargs={"key": session.key, "entry_id": entry_id, "index": index}
        ),
    )
    active_runs = [item.run_id for item in recent if item.status in (RunStatus.QUEUED, RunStatus.RUNNING)]
    return render(
        request,
        "operator_ui/session.html",
        {
            "placement_history": worker_selectors.placement_history(session, limit=20),
            "dispatch_stages": worker_selectors.dispatch_stages(placement),
            "transcript": transcript.items,
            "unmatched_approvals": transcript.unmatched_approvals,
            "draft": request.session.pop(_draft_key(session.key), ""),
            "dispatch_nodes": worker_selectors.session_host_nodes(),
            "dispatch_profiles": [profile.id for profile in profiles_all()] if _dispatches_to_profiles(request) else [],
            "running": bool(active_runs),
            # The page's script compares a turn's end event with these (the runs stored as queued or running).
            "active_runs": " ".join(active_runs),
            "title": session_title(session),
            "session": session,
            "history": history,
            "runs": [{"run": run, "duration_ms": _duration_ms(run)} for run in recent],
            # One form, one turn: a resubmitted form (reload, double click) repeats this key.
            "idempotency_key": str(uuid.uuid4()),
            "placement": (
                worker_selectors.placement_projection(placement, environment) if placement is not None else None
            ),
            # The placement card links its environment's node (the nodes page's anchor).
            "placement_node_id": environment.node_device_id if environment is not None else None,
        },
    )


@require_POST
@operator_required("sessions.create")
def session_new(request: HttpRequest) -> HttpResponse:
    fields: dict[str, Any] = {"idempotencyKey": str(uuid.uuid4())}
    for name in ("key", "label"):
        value = request.POST.get(name, "").strip()
        if value:
            fields[name] = value
    try:
        created = creation.session_create_requested(request=SessionsCreateParams.model_validate(fields))
    except (ValidationError, GatewayError) as refused:
        messages.error(request, _refusal(refused))
        return redirect("ui:sessions")
    return redirect(reverse("ui:session", kwargs={"key": created.session.key}))


def session_title(session) -> dict[str, Any]:
    """The session page's title: its label, else its display name, else the key's last part shortened
    (``fallback``: the page then shows the whole key under it)."""
    named = session.label or session.display_name
    if named:
        return {"text": named, "fallback": False}
    last = session.key.rsplit(":", 1)[-1] or session.key
    if len(last) > FALLBACK_TITLE_LENGTH:
        last = last[: FALLBACK_TITLE_LENGTH - 1] + "…"
    return {"text": last, "fallback": True}


def wants_json(request: HttpRequest) -> bool:
    """The page's script posts a form with fetch and asks for JSON; a form posted without it gets the redirect."""
    return "application/json" in request.headers.get("Accept", "") or (
        request.headers.get("X-Requested-With") == "console"
    )


def json_refusal(text: str, *, status: int = 400) -> JsonResponse:
    return JsonResponse({"ok": False, "error": text}, status=status)


@require_POST
@operator_required("chat.send")
def session_send(request: HttpRequest, key: str) -> HttpResponse:
    """One turn per form: the form's ``idempotencyKey`` names the turn, so a resubmitted form names the same
    one. Asked for JSON (the page's script), it answers the run's id and a key for the next form, or the
    refusal; otherwise it goes back to the page."""
    canonical = _canonical(key)
    try:
        params = ChatSendParams.model_validate(
            {
                "sessionKey": canonical,
                "message": request.POST.get("message", ""),
                "idempotencyKey": request.POST.get("idempotencyKey") or str(uuid.uuid4()),
            }
        )
        submitted = runs.chat_send(
            session_key=params.sessionKey, message=params.message, idempotency_key=params.idempotencyKey
        )
    except (ValidationError, GatewayError) as refused:
        if wants_json(request):
            return json_refusal(_refusal(refused))
        messages.error(request, _refusal(refused))
        return redirect(reverse("ui:session", kwargs={"key": canonical}))
    if wants_json(request):
        return JsonResponse(
            {
                "ok": True,
                "runId": submitted.run.run_id,
                "status": submitted.run.status,
                "repeated": not submitted.created,
                "nextIdempotencyKey": str(uuid.uuid4()),
            }
        )
    return redirect(reverse("ui:session", kwargs={"key": canonical}))


def _dispatches_to_profiles(request: HttpRequest) -> bool:
    """A cloud profile is an admin's choice on the wire too (``sessions.dispatch`` with a ``profileId``)."""
    return user_has_scope(request.user, scopes.ADMIN)


@require_GET
@operator_required("chat.history")
def artifact(request: HttpRequest, artifact_id: str) -> HttpResponse:
    """A tool's whole output (the transcript holds a truncated copy), as plain text the browser shows and
    never runs: ``nosniff``, and no HTML content type whatever the output looks like."""
    found = session_selectors.tool_artifact_get(artifact_id)
    if found is None:
        raise Http404("no such artifact")
    response = HttpResponse(found.content, content_type="text/plain; charset=utf-8")
    response["X-Content-Type-Options"] = "nosniff"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{found.tool_name}-{found.tool_call_id}")[:120] or "output"
    response["Content-Disposition"] = content_disposition_header(False, f"{name}.txt")
    return response


@require_GET
@operator_required("chat.history")
def session_image(request: HttpRequest, key: str, entry_id: str, index: int) -> HttpResponse:
    """An image part of a session's message (of any of its transcripts), as the bytes it proved to be: the page
    draws it from here rather than inline, so that a page of screenshots stays small and each is fetched once (a
    message never changes: the browser may keep it). ``nosniff`` and no script or style: the bytes are the
    model's or a tool's."""
    session = session_selectors.session_get(_canonical(key))
    part = None if session is None else session_selectors.transcript_part(session, entry_id, index)
    checked = check_image(part)
    if checked.data is None:
        raise Http404("no such image")
    response = HttpResponse(checked.data, content_type=checked.mime_type)
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = "private, max-age=31536000, immutable"
    return response


def _canonical(key: str) -> str:
    try:
        return keys.canonical_key(key, None)
    except GatewayError:
        raise Http404("no such session") from None


def _duration_ms(run) -> int | None:
    if run.started_at is None or run.ended_at is None:
        return None
    return int((run.ended_at - run.started_at).total_seconds() * 1000)


def _page_number(raw: str | None) -> int:
    try:
        return min(max(int(raw or 1), 1), 10_000)
    except ValueError:
        return 1


def _refusal(refused: ValidationError | GatewayError) -> str:
    if isinstance(refused, GatewayError):
        return operator_text(refused)
    return "; ".join(
        f"{error_path(tuple(item.get('loc', ())))}: {validation_message(item)}" for item in refused.errors()
    )


# --- nodes ---------------------------------------------------------------------------------------


@require_GET
@operator_required("node.list")
def nodes(request: HttpRequest) -> HttpResponse:
    """Paired and connected nodes for every reader; the pairing requests and the pairing fields of a node only
    for those who may decide them (``node.pair.list``), as ``node.list`` shows them on the wire."""
    pairs = user_may_call(request.user, "node.pair.list")
    catalog = device_selectors.node_catalog(include_pending=pairs)
    shown = [node for node in catalog if node.get("paired") or node.get("connected")]
    if not pairs:
        shown = [device_selectors.strip_pending_fields(node) for node in shown]
    hosted = worker_selectors.environments_on_nodes({node["nodeId"] for node in shown})
    return render(
        request,
        "operator_ui/nodes.html",
        {
            # Copies: the catalog's rows are shared (memoized), and each gains the environments it hosts here.
            "nodes": [{**node, "hostedEnvironments": hosted.get(node["nodeId"], [])} for node in shown],
            "awaiting_reconnect": {node["nodeId"] for node in shown if _approved_not_yet_reconnected(node)},
            "pending": device_selectors.node_pair_list()["pending"] if pairs else [],
            "pairs": pairs,
            "nav": "nodes",
            "live_topics": "nodes,pairing" if pairs else "nodes",
            "live_events": " ".join(NODE_LIVE_EVENTS),
        },
    )


# After these the nodes page fetches its parts again: a request, its decision, and a connection coming or going
# (``presence``, which is how the page learns that an approved node has connected).
NODE_LIVE_EVENTS = ("node.pair.requested", "node.pair.resolved", "presence")


def _approved_not_yet_reconnected(node: dict) -> bool:
    """Paired, offline, and not connected since its (latest) approval: the node was refused while it waited
    and has yet to connect again, which its host does within seconds."""
    if not node.get("paired") or node.get("connected"):
        return False
    return node.get("lastConnectedAtMs", 0) < node.get("approvedAtMs", 0)


def _nodes_page(request: HttpRequest) -> str:
    """Back to the nodes page, or to the pairing page for a login that may pair but not read (``node.list``)."""
    return "ui:nodes" if user_may_call(request.user, "node.list") else "ui:pairing"


@require_POST
@operator_required("node.pair.approve", "node.pair.reject")
def node_request_decide(request: HttpRequest, request_id: str, decision: str) -> HttpResponse:
    if decision not in ("approve", "reject"):
        raise Http404("no such decision")
    actor = Actor.for_user(request.user)
    try:
        if decision == "approve":
            device = pairing.pairing_request_approve(request_id=request_id, actor=actor, role=scopes.ROLE_NODE)
            messages.success(request, f"Approved node {device.device_id}; waiting for it to reconnect.")
        else:
            rejected = pairing.pairing_request_reject(request_id=request_id, actor=actor, role=scopes.ROLE_NODE)
            messages.success(request, f"Rejected the pairing request of node {rejected.device_id}.")
    except GatewayError as refused:
        messages.error(request, _refusal(refused))
    return redirect(_nodes_page(request))


@operator_required("node.pair.remove")
def node_remove(request: HttpRequest, node_id: str) -> HttpResponse:
    """GET asks for confirmation (removing a node fails the sessions placed on it); POST removes it."""
    if request.method == "POST":
        try:
            pairing.node_pair_remove(node_id=node_id, actor=Actor.for_user(request.user))
            messages.success(request, f"Removed node {node_id}.")
        except GatewayError as refused:
            messages.error(request, _refusal(refused))
        return redirect(_nodes_page(request))
    if request.method != "GET":
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    # Not the memoized catalog: the confirmation must show the node as it is now.
    catalog = device_selectors.node_catalog(include_pending=False)
    node = next((entry for entry in catalog if entry["nodeId"] == node_id), None)
    if node is None or not node.get("paired"):
        raise Http404("no such paired node")
    return render(request, "operator_ui/node_remove.html", {"node": node, "nav": "nodes"})


# --- runs and environments -----------------------------------------------------------------------


@require_GET
@operator_required(scope=scopes.READ)
def runs_list(request: HttpRequest) -> HttpResponse:
    status = request.GET.get("status", "")
    page = _page_number(request.GET.get("page"))
    runs_shown, has_more = session_selectors.runs_page(
        limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE, status=status if status in RunStatus.values else None
    )
    return render(
        request,
        "operator_ui/runs.html",
        {
            "runs": [{"run": run, "duration_ms": _duration_ms(run)} for run in runs_shown],
            "status": status if status in RunStatus.values else "",
            "statuses": RunStatus.values,
            "page": page,
            "has_more": has_more,
            "nav": "runs",
        },
    )


@require_GET
@operator_required("environments.list")
def environments(request: HttpRequest) -> HttpResponse:
    rows = [row for row in worker_selectors.environments_list() if row["type"] == "worker"]
    keys = worker_selectors.session_keys_of({sid for row in rows for sid in row["worker"]["attachedSessionIds"]})
    for row in rows:
        # Each attached session as a link to its page; an id no session holds any more stays a bare id.
        row["sessions"] = [{"id": sid, "key": keys.get(sid)} for sid in row["worker"]["attachedSessionIds"]]
    return render(request, "operator_ui/environments.html", {"environments": rows, "nav": "environments"})


# --- a session's turn and placement actions --------------------------------------------------------


def _session_action(request: HttpRequest, key: str, act) -> HttpResponse:
    """Run one service call for the session; its refusal is shown as the service words it (as JSON when the
    page's script asked for it: ``{"ok", "message"}`` or ``{"ok": false, "error"}``)."""
    session = session_selectors.session_get(_canonical(key))
    if session is None:
        raise Http404("no such session")
    try:
        done = act(session, Actor.for_user(request.user))
    except (ValidationError, GatewayError) as refused:
        if wants_json(request):
            return json_refusal(_refusal(refused))
        messages.error(request, _refusal(refused))
    else:
        if wants_json(request):
            return JsonResponse({"ok": True, "message": done or ""})
        if done:
            messages.success(request, done)
    return redirect(reverse("ui:session", kwargs={"key": session.key}))


def _int(raw: str | None) -> int:
    try:
        return int(raw or "")
    except ValueError:
        raise InvalidRequest("the page's placement is out of date: reload it") from None


@require_POST
@operator_required("chat.abort")
def session_abort(request: HttpRequest, key: str) -> HttpResponse:
    def abort(session, actor) -> str:
        stopped = runs.run_abort(session_key=session.key, actor=actor)
        return f"Asked {len(stopped)} turn(s) to stop." if stopped else "No turn was running."

    return _session_action(request, key, abort)


@require_POST
@operator_required("sessions.dispatch")
def session_dispatch(request: HttpRequest, key: str) -> HttpResponse:
    target = request.POST.get("target", "")
    kind, _, name = target.partition(":")

    def start(session, actor) -> str:
        if kind == "device" and name:
            operations.start_dispatch(session=session, profile_id=None, device_id=name, actor=actor)
        elif kind == "profile" and name and _dispatches_to_profiles(request):
            operations.start_dispatch(session=session, profile_id=name, device_id=None, actor=actor)
        else:
            raise InvalidRequest("choose a node or a profile to dispatch to")
        return "Dispatch started: its stages show in the placement card."

    return _session_action(request, key, start)


@require_POST
@operator_required("sessions.move")
def session_move_to_gateway(request: HttpRequest, key: str) -> HttpResponse:
    """Compare-and-set on the placement the page showed (generation, environment, owner epoch)."""

    def move(session, actor) -> str:
        started = operations.start_move(
            session=session,
            target="gateway",
            expected_generation=_int(request.POST.get("generation")),
            expected_environment_id=request.POST.get("environmentId", ""),
            expected_owner_epoch=_int(request.POST.get("ownerEpoch")),
            abandon_source=False,
            actor=actor,
        )
        if started.joined is not None:
            return (
                "This move is already under way (another request drives it); its outcome shows on the placement card."
            )
        return "Moved back to this gateway."

    return _session_action(request, key, move)


@require_POST
@operator_required("sessions.reclaim")
def session_reclaim(request: HttpRequest, key: str) -> HttpResponse:
    """Stop the worker; with ``recoverGeneration``, continue a failed placement on the gateway (that
    generation only)."""
    raw_generation = request.POST.get("recoverGeneration")

    def stop(session, actor) -> str:
        generation = _int(raw_generation) if raw_generation is not None else None
        placement = reclaim.reclaim(session=session, recover_to_gateway_generation=generation, actor=actor)
        return f"Placement is now {placement.state}."

    return _session_action(request, key, stop)


# --- fork a session from one of its messages -------------------------------------------------------


def _draft_key(session_key: str) -> str:
    return f"ui:draft:{session_key}"


@require_POST
@operator_required("sessions.fork")
def session_fork(request: HttpRequest, key: str) -> HttpResponse:
    """``sessions.fork`` before one of the session's user messages: the new session holds the history
    before it and opens with that message in its composer; a refusal stays on the source's page."""
    session = session_selectors.session_get(_canonical(key))
    if session is None:
        raise Http404("no such session")
    try:
        fields = {"sessionKey": session.key}
        if "entryId" in request.POST:
            fields["entryId"] = request.POST["entryId"]
        params = SessionsForkParams.model_validate(fields)
        forked = forks.session_fork(
            session_key=params.sessionKey, entry_id=params.entryId, actor=Actor.for_user(request.user)
        )
    except (ValidationError, GatewayError) as refused:
        messages.error(request, _refusal(refused))
        return redirect(reverse("ui:session", kwargs={"key": session.key}))
    request.session[_draft_key(forked["sessionKey"])] = forked["editorText"]
    messages.success(request, f"Forked from {session.key}: the message you forked at is in the composer.")
    return redirect(reverse("ui:session", kwargs={"key": forked["sessionKey"]}))
