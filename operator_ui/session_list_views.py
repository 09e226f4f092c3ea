"""The sessions list: an index with a search over names and transcripts, sortable columns, a page size, and
archive / unarchive / reset of the sessions ticked.

The bulk actions are ``sessions.patch`` (archive flag: ``operator.write``) and ``sessions.reset``
(``operator.admin``) once per session, through the same services as the session page's buttons, each with the
revision the list showed (a ``<revision>:<key>`` checkbox value), so a session written since is skipped and
says why; every change is audited per session by the service.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from pydantic import ValidationError

from gateway.audit import Actor
from gateway.exceptions import Conflict, GatewayError
from sessions_app import selectors as session_selectors
from sessions_app.schemas import SessionsPatchParams
from sessions_app.services import sessions
from sessions_app.session_index import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_SORT,
    PAGE_SIZES,
    page_size_choice,
    sessions_index_page,
    sort_choice,
)
from workers_app import selectors as worker_selectors

from .access import operator_required
from .views import _page_number, _refusal

SEARCH_LENGTH = 200
ARCHIVED_CHOICES = {"no": False, "yes": True, "all": "all"}
# The column headers that sort, and the direction of a first click (names A→Z; figures and times biggest first).
SORTABLE = (
    ("label", "Session", ""),
    ("messages", "Messages", "-"),
    ("tokens", "Tokens", "-"),
    ("updated", "Updated", "-"),
    ("created", "Created", "-"),
)


def _filters(data) -> dict[str, str]:
    """The list's query as the page showed it, each value on its allow-list (a bad one is the default)."""
    archived = data.get("archived", "no")
    return {
        "q": data.get("q", "").strip()[:SEARCH_LENGTH],
        "archived": archived if archived in ARCHIVED_CHOICES else "no",
        "sort": sort_choice(data.get("sort")),
        "size": str(page_size_choice(data.get("size"))),
    }


def _query(filters: dict[str, str], **changes: object) -> str:
    """The list's URL query for these filters, defaults left out."""
    merged = {**filters, **{name: str(value) for name, value in changes.items()}}
    defaults = {"q": "", "archived": "no", "sort": DEFAULT_SORT, "size": str(DEFAULT_PAGE_SIZE), "page": "1"}
    return urlencode({name: value for name, value in merged.items() if defaults.get(name) != value})


def _sort_headers(filters: dict[str, str]) -> list[dict[str, str]]:
    headers = []
    current = filters["sort"]
    for name, title, first in SORTABLE:
        shown = current.removeprefix("-") == name
        if shown:
            direction = "descending" if current.startswith("-") else "ascending"
            following = name if current.startswith("-") else f"-{name}"
        else:
            direction, following = "", f"{first}{name}"
        headers.append({"name": name, "title": title, "aria_sort": direction, "query": _query(filters, sort=following)})
    return headers


@require_GET
@operator_required("sessions.list")
def sessions_list(request: HttpRequest) -> HttpResponse:
    filters = _filters(request.GET)
    page = _page_number(request.GET.get("page"))
    size = int(filters["size"])
    rows, has_more = sessions_index_page(
        search=filters["q"] or None,
        archived=ARCHIVED_CHOICES[filters["archived"]],
        sort=filters["sort"],
        limit=size,
        offset=(page - 1) * size,
    )
    placements = worker_selectors.placement_fields([row.session for row in rows])
    return render(
        request,
        "operator_ui/sessions.html",
        {
            "rows": [{"row": row, "placement": placements.get(row.session.key, {}).get("placement")} for row in rows],
            "filters": filters,
            "search": filters["q"],
            "archived": filters["archived"],
            "sizes": PAGE_SIZES,
            "headers": _sort_headers(filters),
            "page": page,
            "has_more": has_more,
            "previous_query": _query(filters, page=page - 1),
            "next_query": _query(filters, page=page + 1),
            "nav": "sessions",
        },
    )


# A revision is a positive bigint: 19 digits at most; a longer number is not one the list drew.
MAX_REVISION_DIGITS = 19


def _chosen(request: HttpRequest) -> list[tuple[int | None, str]]:
    """The ticked sessions as ``(revision the list showed, key)``; a value that is not ``<revision>:<key>`` keeps
    its text as the key with no revision (skipped: the list was not drawn by this console)."""
    chosen = []
    for value in dict.fromkeys(request.POST.getlist("session")):
        revision, _, key = value.partition(":")
        well_formed = revision.isascii() and revision.isdigit() and len(revision) <= MAX_REVISION_DIGITS and key
        chosen.append((int(revision), key) if well_formed else (None, value))
    return chosen


def _back(filters: dict[str, str], request: HttpRequest) -> str:
    """The list as the operator left it (the form carries its filters, sort, size and page)."""
    query = _query(filters, page=_page_number(request.POST.get("page")))
    return f"{reverse('ui:sessions')}?{query}" if query else reverse("ui:sessions")


def _bulk(request: HttpRequest, verb: str, act: Callable[[str, int, Actor], str | None]) -> HttpResponse:
    """``act`` once per ticked session (its own transaction, in the service); a refusal skips that session with
    the service's reason. ``act`` returns a reason to skip without calling the service, or None when done."""
    back = _back(_filters(request.POST), request)
    chosen = _chosen(request)
    if not chosen:
        messages.error(request, f"{verb}: no session was ticked. Nothing was changed.")
        return redirect(back)
    if len(chosen) > max(PAGE_SIZES):
        messages.error(request, f"{verb}: at most {max(PAGE_SIZES)} sessions at once. Nothing was changed.")
        return redirect(back)
    actor = Actor.for_user(request.user)
    done, skipped = 0, []
    for revision, key in chosen:
        if revision is None:
            skipped.append(f"{key}: the list did not show its revision; reload it")
            continue
        try:
            reason = act(key, revision, actor)
        except Conflict as refused:
            if (refused.details or {}).get("code") == "SESSION_CHANGED":
                current = (refused.details or {}).get("revision")
                reason = f"changed after the list showed it (revision {revision}, now {current})"
            else:
                reason = _refusal(refused)
        except (ValidationError, GatewayError) as refused:
            reason = _refusal(refused)
        if reason is None:
            done += 1
        else:
            skipped.append(f"{key}: {reason.rstrip('.')}")
    summary = f"{verb}: {done} done, {len(skipped)} skipped"
    if skipped:
        messages.warning(request, f"{summary}: {'; '.join(skipped)}.")
    else:
        messages.success(request, f"{summary}.")
    return redirect(back)


@require_POST
@operator_required("sessions.patch")
def sessions_archive(request: HttpRequest) -> HttpResponse:
    """Archive (``archive=true``) or unarchive (``archive=false``) the ticked sessions."""
    choice = request.POST.get("archive")
    if choice not in ("true", "false"):
        messages.error(request, "Choose Archive or Unarchive. Nothing was changed.")
        return redirect(_back(_filters(request.POST), request))
    archive = choice == "true"

    def patch(key: str, revision: int, actor: Actor) -> str | None:
        session = session_selectors.session_get(key)
        if session is None:
            return "no such session"
        if (session.archived_at is not None) == archive:
            return "already archived" if archive else "not archived"
        params = SessionsPatchParams.model_validate({"key": key, "expectedRevision": revision, "archived": archive})
        sessions.session_patch(key=key, changes=params.changes(), expected_revision=revision, actor=actor)
        return None

    return _bulk(request, "Archive" if archive else "Unarchive", patch)


@require_POST
@operator_required("sessions.reset")
def sessions_reset(request: HttpRequest) -> HttpResponse:
    """Reset the ticked sessions: each starts a new transcript (the previous one is kept)."""

    def reset(key: str, revision: int, actor: Actor) -> str | None:
        if session_selectors.session_get(key) is None:
            return "no such session"
        sessions.session_reset(key=key, expected_revision=revision, actor=actor)
        return None

    return _bulk(request, "Reset", reset)
