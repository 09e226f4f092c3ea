"""The row fields ``sessions.list`` and ``sessions.describe`` add on request: ``derivedTitle``
(``includeDerivedTitles``) and ``lastMessagePreview`` (``includeLastMessage``), derived as OpenClaw derives them.

A derived title is the session's label, else its display name, else a title made from its first user message
(OpenClaw's ``deriveGoalSessionTitle``: whitespace collapsed, the first sentence that starts with a task verb or the
whole text, first letter upper-cased, cut at 60 UTF-16 units on a word with "…"); a message that is a slash command
gives none. The preview is the newest user or assistant text among the last 20 messages, trimmed, cut at 240 UTF-16
units (237 and "..."). OpenClaw also strips the metadata envelopes its channels wrap around inbound messages and
flattens Markdown in the preview; messages here carry no envelope, and the preview keeps the text as written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import JSONField, OuterRef, QuerySet, Subquery

from .models import Session, SessionWindow, TranscriptEvent

DERIVED_TITLE_MAX = 60
PREVIEW_MAX = 240
# OpenClaw reads the preview from the newest 20 messages.
PREVIEW_SCAN = 20
SPOKEN_ROLES = ("user", "assistant")

HOST_ENVELOPE_PREFIXES = (
    "# agents.md instructions for ",
    "<environment_context>",
    "<permissions instructions>",
    "<skills_instructions>",
    "<apps_instructions>",
    "<plugins_instructions>",
    "<recommended_plugins>",
    "<external_openclaw_",
    "openclaw runtime context",
)
TASK_VERBS = frozenset(
    "add analyze build check compare create debug design draft explain find fix give help implement investigate "
    "list make plan prepare recommend recover rename resume review summarize test update write".split()
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_LEADING_QUOTES = re.compile(r"^[\"'`(\[{]+")


def utf16_prefix(text: str, units: int) -> str:
    """The longest prefix of ``text`` of at most ``units`` UTF-16 code units, never half a surrogate pair
    (OpenClaw's ``truncateUtf16Safe``)."""
    used = 0
    for index, char in enumerate(text):
        used += 2 if ord(char) > 0xFFFF else 1
        if used > units:
            return text[:index]
    return text


def utf16_length(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _truncate_title(text: str, max_len: int) -> str:
    if utf16_length(text) <= max_len:
        return text
    cut = utf16_prefix(text, max_len - 1)
    last_space = cut.rfind(" ")
    if last_space > max_len * 0.6:
        return f"{cut[:last_space]}…"
    return f"{cut}…"


def _goal_sentence(text: str) -> str:
    for sentence in _SENTENCE_END.split(text):
        words = _LEADING_QUOTES.sub("", sentence).split()
        if words and words[0].lower() in TASK_VERBS:
            return sentence.strip()
    return text


def title_from_message(text: str | None) -> str | None:
    """OpenClaw's ``deriveGoalSessionTitle`` of a first user message (None: no usable task in it)."""
    if not text:
        return None
    collapsed = " ".join(text.split())
    if not collapsed or collapsed.lower().startswith(HOST_ENVELOPE_PREFIXES) or collapsed.startswith("/"):
        return None
    goal = _goal_sentence(collapsed)
    if not goal:
        return None
    if goal[0] == goal[0].lower():
        goal = goal[0].upper() + goal[1:]
    return _truncate_title(goal, DERIVED_TITLE_MAX)


def message_text(body: dict) -> str | None:
    """The text parts of a transcript message joined by newlines (None: no text)."""
    content = body.get("content")
    if isinstance(content, str):
        return content
    parts = [
        part["text"]
        for part in content or []
        if isinstance(part, dict) and part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str)
    ]
    return "\n".join(parts) if parts else None


def preview_of(bodies: Sequence[dict]) -> str | None:
    """The preview of the newest user or assistant message with text among ``bodies`` (newest first)."""
    for body in bodies:
        if body.get("role") not in SPOKEN_ROLES:
            continue
        text = (message_text(body) or "").strip()
        if text:
            return text if utf16_length(text) <= PREVIEW_MAX else f"{utf16_prefix(text, PREVIEW_MAX - 3)}..."
    return None


def _messages_of_window() -> QuerySet[TranscriptEvent]:
    return TranscriptEvent.objects.filter(window_id=OuterRef("pk"), type="message")


def _newest_bodies(window_id: str) -> list[dict]:
    return list(
        TranscriptEvent.objects.filter(window_id=window_id, type="message")
        .order_by("-seq")
        .values_list("body", flat=True)[:PREVIEW_SCAN]
    )


@dataclass(frozen=True)
class _WindowReads:
    """What one statement read of a window for its row fields: the first user message, the newest user or
    assistant message (and its position), and the position of the oldest message a preview may come from."""

    first_user: dict | None = None
    newest_spoken: dict | None = None
    newest_spoken_seq: int | None = None
    scan_floor_seq: int | None = None


def _window_reads(window_ids: list[str], *, titles: bool, last_message: bool) -> dict[str, _WindowReads]:
    """One statement for every window, each read an indexed probe of its transcript from its start or its end
    (``(window, seq)``), whatever the number of rows."""
    annotations = {}
    if titles:
        first = _messages_of_window().filter(body__role="user").order_by("seq")
        annotations["first_user"] = Subquery(first.values("body")[:1], output_field=JSONField())
    if last_message:
        spoken = _messages_of_window().filter(body__role__in=SPOKEN_ROLES).order_by("-seq")
        annotations["newest_spoken"] = Subquery(spoken.values("body")[:1], output_field=JSONField())
        annotations["newest_spoken_seq"] = Subquery(spoken.values("seq")[:1])
        floor = _messages_of_window().order_by("-seq").values("seq")[PREVIEW_SCAN - 1 : PREVIEW_SCAN]
        annotations["scan_floor_seq"] = Subquery(floor)
    rows = SessionWindow.objects.filter(pk__in=window_ids).annotate(**annotations).values("pk", *annotations)
    return {row.pop("pk"): _WindowReads(**row) for row in rows}


def _preview(window_id: str, reads: _WindowReads) -> str | None:
    """OpenClaw's preview from the newest ``PREVIEW_SCAN`` messages: the newest user or assistant message when it
    is among them and has text (the common case, read in the batch); otherwise those messages are read."""
    if reads.newest_spoken is None:
        return None
    if reads.scan_floor_seq is not None and reads.newest_spoken_seq < reads.scan_floor_seq:
        return None
    return preview_of([reads.newest_spoken]) or preview_of(_newest_bodies(window_id))


def derived_title(session: Session, first_user: dict | None) -> str | None:
    label = session.label.strip()
    if label:
        return label
    display_name = session.display_name.strip()
    if display_name:
        return display_name
    return title_from_message(message_text(first_user)) if first_user else None


def row_extras(sessions: Sequence[Session], *, titles: bool, last_message: bool) -> dict[str, dict]:
    """``derivedTitle`` and ``lastMessagePreview`` per session key, where there is one: one statement for all the
    rows (:func:`_window_reads`)."""
    reads = _window_reads([session.session_id for session in sessions], titles=titles, last_message=last_message)
    extras: dict[str, dict] = {}
    for session in sessions:
        window = reads.get(session.session_id, _WindowReads())
        fields = {}
        if titles and (title := derived_title(session, window.first_user)):
            fields["derivedTitle"] = title
        if last_message and (preview := _preview(session.session_id, window)):
            fields["lastMessagePreview"] = preview
        if fields:
            extras[session.key] = fields
    return extras
