"""The session page's settings card: change the label, archive, reset, delete.

These are ``sessions.patch|reset|delete``: a login needs each method's scope on the wire (``operator_required``),
else 403 and nothing is read or done. Each form carries the session's ``revision`` as the page
showed it and sends it as ``expectedRevision``, so an operator whose page is older than the session (another
operator, or a turn, wrote it since) changes nothing and is told so; the page they return to shows the
session as it is now.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST
from pydantic import ValidationError

from gateway.audit import Actor
from gateway.exceptions import Conflict, GatewayError, InvalidRequest
from sessions_app import selectors as session_selectors
from sessions_app.models import Session
from sessions_app.schemas import ExpectedRevision, SessionsPatchParams
from sessions_app.services import sessions

from .access import operator_required
from .views import _canonical, _refusal, json_refusal, session_title, wants_json

# What the patch form may send (the label field, the archive button).
PATCH_FIELDS = ("label", "archived")


def _changed_first(expected: int | None, refused: Conflict) -> str:
    current = (refused.details or {}).get("revision")
    return (
        f"Not saved: this session changed after the page showed it (revision {expected}, now {current}), by another "
        "operator or a turn. Nothing was changed; the page shows the session as it is now — check it and try again."
    )


def _settings_action(
    request: HttpRequest, key: str, act: Callable[[Session, int | None, Actor], tuple[str, str | None]]
) -> HttpResponse:
    """Run one guarded change of the session with the revision the page showed; ``act`` returns the message and
    where to go (None: back to the session's page)."""
    session = session_selectors.session_get(_canonical(key))
    if session is None:
        raise Http404("no such session")
    page = reverse("ui:session", kwargs={"key": session.key})
    expected: int | None = None
    try:
        if "revision" not in request.POST:
            raise InvalidRequest("the page is out of date: reload it")
        expected = ExpectedRevision.model_validate({"expectedRevision": request.POST["revision"]}).expectedRevision
        done, target = act(session, expected, Actor.for_user(request.user))
    except Conflict as refused:
        stale_revision = (refused.details or {}).get("code") == "SESSION_CHANGED"
        text = _changed_first(expected, refused) if stale_revision else _refusal(refused)
        if wants_json(request):
            return json_refusal(text, status=409)
        messages.error(request, text)
        return redirect(page)
    except (ValidationError, GatewayError) as refused:
        if wants_json(request):
            return json_refusal(_refusal(refused))
        messages.error(request, _refusal(refused))
        return redirect(page)
    if wants_json(request):
        return JsonResponse({"ok": True, "message": done, **_settings_answer(session.key)})
    messages.success(request, done)
    return redirect(target or page)


def _settings_answer(key: str) -> dict[str, Any]:
    """The session as it is after the change (none after a delete): what the page shows of it."""
    session = session_selectors.session_get(key)
    if session is None:
        return {}
    title = session_title(session)
    return {"label": session.label, "revision": session.revision, "title": title["text"], "fallback": title["fallback"]}


@require_POST
@operator_required("sessions.patch")
def session_patch(request: HttpRequest, key: str) -> HttpResponse:
    def patch(session: Session, expected: int | None, actor: Actor) -> tuple[str, str | None]:
        fields: dict[str, Any] = {name: request.POST[name] for name in PATCH_FIELDS if name in request.POST}
        params = SessionsPatchParams.model_validate({"key": session.key, "expectedRevision": expected, **fields})
        changes = params.changes()
        sessions.session_patch(key=session.key, changes=changes, expected_revision=expected, actor=actor)
        if "archived" in changes:
            return ("Archived." if changes["archived"] else "Unarchived."), None
        return "Label saved.", None

    return _settings_action(request, key, patch)


@require_POST
@operator_required("sessions.reset")
def session_reset(request: HttpRequest, key: str) -> HttpResponse:
    def reset(session: Session, expected: int | None, actor: Actor) -> tuple[str, str | None]:
        sessions.session_reset(key=session.key, expected_revision=expected, actor=actor)
        return "Reset: a new transcript starts; the previous one is kept.", None

    return _settings_action(request, key, reset)


@require_POST
@operator_required("sessions.delete")
def session_delete(request: HttpRequest, key: str) -> HttpResponse:
    def delete(session: Session, expected: int | None, actor: Actor) -> tuple[str, str | None]:
        if not sessions.session_delete(key=session.key, expected_revision=expected, actor=actor):
            raise InvalidRequest(f"session not found: {session.key}")
        return f"Deleted {session.key}.", reverse("ui:sessions")

    return _settings_action(request, key, delete)
