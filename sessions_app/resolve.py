"""``sessions.resolve``: which session a key, a transcript id, a label, a chat link's short id or a reference
names, with OpenClaw's rules and words (its ``sessions-resolve.ts``).

A selector that matches nothing is an INVALID_REQUEST ``No session found: …`` (``allowMissing``: the answer
``{ok: false}``); a short id or reference slug that matches several sessions answers ``{ok: false, candidates}``
(at most 10) for the caller to choose; a label that matches several is refused, naming them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gateway.exceptions import InvalidRequest

from . import keys
from .models import Session
from .schemas import SessionsResolveParams

SHORT_SESSION_ID_RE = re.compile(r"^[0-9a-f]{8,32}$", re.IGNORECASE)
SESSION_UUID_SUFFIX_RE = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$", re.IGNORECASE)
MAX_CANDIDATES = 10
SLUG_MAX_LENGTH = 48
LABEL_MAX_LENGTH = 512


@dataclass(frozen=True)
class Resolution:
    """A session found (``session``), none (``missing``), or several to choose from (``candidates``)."""

    session: dict[str, Any] | None = None
    candidates: list[dict[str, Any]] | None = None

    @property
    def missing(self) -> bool:
        return self.session is None and not self.candidates

    def payload(self) -> dict[str, Any]:
        """``sessions.resolve``'s answer."""
        if self.session is not None:
            return {"ok": True, **self.session}
        if self.candidates:
            return {"ok": False, "candidates": self.candidates}
        return {"ok": False}


def display_name(session: Session) -> str | None:
    """The name a chat link's slug is made of: the label, else the display name (OpenClaw's order)."""
    return session.label.strip() or session.display_name or None


def control_ui_slug(name: str | None) -> str:
    """OpenClaw's ``controlUiSessionSlug``: the part of a chat link before its short id."""
    slug = re.sub(r"[^a-z0-9]+", "-", (name or "").lower()).strip("-")
    found = re.match(r"^.*[g-z][a-z0-9]*", slug)
    return (found.group(0) if found else "")[:SLUG_MAX_LENGTH].rstrip("-")


def key_uuid_hex(key: str) -> str | None:
    """The UUID a key ends with (``agent:main:dashboard:<uuid>``), lower-case and without dashes."""
    rest = key.split(":", 2)[2] if key.count(":") >= 2 else key
    found = SESSION_UUID_SUFFIX_RE.search(rest)
    return found.group(1).lower().replace("-", "") if found else None


def _candidate(session: Session) -> dict[str, Any]:
    name = display_name(session)
    return {"key": session.key, "agentId": session.agent_id, **({"displayName": name} if name else {})}


def _found(session: Session) -> dict[str, Any]:
    return {"key": session.key, "agentId": session.agent_id}


def _missing(params: SessionsResolveParams, message: str) -> Resolution:
    if params.allowMissing:
        return Resolution()
    raise InvalidRequest(message)


def _visible(params: SessionsResolveParams, *, archived: bool):
    """The sessions a selector looks among: the named agent's (all when none is named), children of
    ``spawnedBy`` only when it is given, archived ones only where OpenClaw includes them."""
    sessions = Session.objects.all()
    if params.agentId is not None:
        sessions = sessions.filter(agent_id=keys.normalize_agent_id(params.agentId))
    if params.spawnedBy is not None:
        sessions = sessions.filter(parent_session_key=keys.canonical_key(params.spawnedBy, params.agentId))
    if not archived:
        sessions = sessions.filter(archived_at__isnull=True)
    return sessions


def session_resolve(params: SessionsResolveParams) -> Resolution:
    selectors = [
        params.key is not None,
        params.sessionId is not None,
        params.label is not None,
        params.shortId is not None,
        params.reference is not None,
    ]
    if params.slugHint is not None and params.shortId is None:
        raise InvalidRequest("slugHint requires shortId")
    if sum(selectors) > 1:
        raise InvalidRequest("Provide either key, sessionId, label, shortId, or reference (not multiple)")
    if not any(selectors):
        raise InvalidRequest("Either key, sessionId, label, shortId, or reference is required")
    if params.reference is not None:
        return _by_reference(params)
    if params.key is not None:
        return _by_key(params)
    if params.sessionId is not None:
        return _by_session_id(params)
    if params.shortId is not None:
        return resolve_short_id(params.shortId, params.slugHint, params=params)
    return _by_label(params)


def _by_key(params: SessionsResolveParams) -> Resolution:
    key = keys.canonical_key(params.key, params.agentId)
    session = _visible(params, archived=True).filter(key=key).first()
    if session is None:
        return _missing(params, f"No session found: {params.key}")
    return Resolution(session=_found(session))


def _by_session_id(params: SessionsResolveParams) -> Resolution:
    """A transcript's id (``sessionId``), or a key given as one. Transcript ids are unique here (OpenClaw's
    ``Multiple sessions found for sessionId`` cannot happen), and one that is a session's id wins over a key."""
    session_id = params.sessionId.strip()
    visible = _visible(params, archived=True)
    session = visible.filter(session_id=session_id).first() or visible.filter(key=session_id.lower()).first()
    if session is None:
        return _missing(params, f"No session found: {session_id}")
    return Resolution(session=_found(session))


def _by_label(params: SessionsResolveParams) -> Resolution:
    label = params.label.strip()
    if not label:
        raise InvalidRequest("invalid label: empty")
    if len(label) > LABEL_MAX_LENGTH:
        raise InvalidRequest(f"invalid label: too long (max {LABEL_MAX_LENGTH})")
    matches = list(_visible(params, archived=False).filter(label=label).order_by("-updated_at", "-id")[:2])
    if not matches:
        return _missing(params, f"No session found with label: {label}")
    if len(matches) > 1:
        names = ", ".join(session.key for session in matches)
        raise InvalidRequest(f"Multiple sessions found with label: {label} ({names})")
    return Resolution(session=_found(matches[0]))


def resolve_short_id(short_id: str, slug_hint: str | None, *, params: SessionsResolveParams) -> Resolution:
    """The session a chat link ``/chat/<agent>/<slug>-<shortId>`` names: the one key ending in a UUID whose hex
    digits start with ``shortId``; among several, those whose display name makes ``slugHint``."""
    if not SHORT_SESSION_ID_RE.match(short_id.strip()):
        raise InvalidRequest("shortId must be 8-32 hexadecimal characters")
    prefix = short_id.strip().lower()
    # The prefix with the UUID's dashes, so the database narrows the rows to those containing it.
    dashed = "-".join(
        prefix[start:end] for start, end in ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32)) if prefix[start:end]
    )
    rows = _visible(params, archived=True).filter(key__icontains=dashed).order_by("-updated_at", "-id")
    matches = [session for session in rows if (key_uuid_hex(session.key) or "").startswith(prefix)]
    named = [session for session in matches if slug_hint and control_ui_slug(display_name(session)) == slug_hint]
    narrowed = named or matches
    if not narrowed:
        return _missing(params, f"No session found: {prefix}")
    if len(narrowed) > 1:
        return Resolution(candidates=[_candidate(session) for session in narrowed[:MAX_CANDIDATES]])
    return Resolution(session=_candidate(narrowed[0]))


def _by_reference(params: SessionsResolveParams) -> Resolution:
    """A key the caller saw, else (with ``slug``) the sessions with a UUID key whose display name makes it."""
    reference = params.reference
    exact = _visible(params, archived=True).filter(key=keys.canonical_key(reference.key, params.agentId)).first()
    if exact is not None:
        return Resolution(session=_candidate(exact))
    matches = []
    if reference.slug is not None:
        rows = _visible(params, archived=True).exclude(label="", display_name="").order_by("-updated_at", "-id")
        matches = [
            session
            for session in rows
            if key_uuid_hex(session.key) and control_ui_slug(display_name(session)) == reference.slug
        ][:MAX_CANDIDATES]
    if len(matches) > 1:
        return Resolution(candidates=[_candidate(session) for session in matches])
    if matches:
        return Resolution(session=_candidate(matches[0]))
    return _missing(params, f"No session found: {reference.key}")
