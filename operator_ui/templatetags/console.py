"""Template tags of the console's base page."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html

from approvals_app import selectors as approval_selectors
from gateway.user_scopes import user_has_scope, user_may_call

register = template.Library()


@register.simple_tag
def pending_approval_count() -> int:
    """The header's badge: one COUNT, drawn only on the pages of users who may decide approvals (the template
    asks for it there)."""
    return approval_selectors.pending_approvals().count()


@register.filter
def may_call(user: Any, method: str) -> bool:
    """``{% if user|may_call:"node.pair.approve" %}``: a link or a form only for a user whose scopes allow the
    gateway method behind it (the view checks the same)."""
    return user_may_call(user, method)


@register.filter
def holds(user: Any, scope: str) -> bool:
    """``{% if user|holds:"operator.admin" %}``, for a page no gateway method mirrors."""
    return user_has_scope(user, scope)


SHORT_ID_LENGTH = 12


@register.inclusion_tag("operator_ui/short_id.html")
def short_id(value: Any, link: str = "") -> dict[str, Any]:
    """``{% short_id session.session_id %}``: the first 12 characters of an id, the whole id in a tooltip and a
    copy button (shown once the script runs; without it the tooltip still holds the id). ``link``: a page of the
    object the id names."""
    full = "" if value is None else str(value)
    return {"full": full, "short": full[:SHORT_ID_LENGTH], "cut": len(full) > SHORT_ID_LENGTH, "link": link}


def _as_datetime(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if timezone.is_aware(value) else timezone.make_aware(value, UTC)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        try:
            return datetime.fromtimestamp(value / 1000, tz=UTC)  # the protocol's epoch milliseconds
        except (ValueError, OverflowError, OSError):
            return None  # a timestamp a node or a model made up, past year 9999: shown as no time at all
    return None


def relative_words(moment: datetime, now: datetime) -> str:
    """ "just now", "5 min ago", "3 h ago", "2 days ago", or "in 4 min" for a time to come."""
    seconds = int((now - moment).total_seconds())
    future, seconds = seconds < 0, abs(seconds)
    if seconds < 10:
        return "just now"
    for limit, unit, size in ((60, "s", 1), (3600, "min", 60), (86400, "h", 3600), (86400 * 60, "days", 86400)):
        if seconds < limit:
            amount = seconds // size
            words = f"{amount} {'day' if unit == 'days' and amount == 1 else unit}"
            return f"in {words}" if future else f"{words} ago"
    return moment.strftime("%Y-%m-%d")


@register.simple_tag
def when(value: Any) -> str:
    """``{% when run.started_at %}``: a ``<time>`` saying how long ago (or in how long), with the absolute UTC time
    in its tooltip and ``datetime`` attribute. Takes a datetime or epoch milliseconds; "–" for none."""
    moment = _as_datetime(value)
    if moment is None:
        return "–"
    moment = moment.astimezone(UTC)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        moment.isoformat(timespec="seconds"),
        moment.strftime("%Y-%m-%d %H:%M:%S UTC"),
        relative_words(moment, timezone.now()),
    )


# The pill variant of each status the console shows (console.css, "Status pills"): runs, placements, worker
# environments, exec approvals, gateway processes. A status not named here is drawn muted.
STATUS_TONES = {
    "ok": "ok",
    "active": "ok",
    "ready": "ok",
    "attached": "ok",
    "approved": "ok",
    "live": "ok",
    "online": "ok",
    "queued": "info",
    "running": "info",
    "requested": "info",
    "provisioning": "info",
    "bootstrapping": "info",
    "syncing": "info",
    "starting": "info",
    "pending": "warn",
    "draining": "warn",
    "reconciling": "warn",
    "destroying": "warn",
    "orphaned": "warn",
    "silent": "warn",
    "aborted": "warn",
    "error": "error",
    "failed": "error",
    "denied": "error",
}


@register.filter
def tone(status: Any) -> str:
    """``<span class="pill pill-{{ run.status|tone }}">{{ run.status }}</span>``: ok, info, warn, error or muted."""
    return STATUS_TONES.get(str(status), "muted")
