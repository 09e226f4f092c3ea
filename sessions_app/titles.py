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

from .models import Session, TranscriptEvent

DERIVED_TITLE_MAX = 60
PREVIEW_MAX = 240
# OpenClaw reads the preview from the newest 20 messages.
PREVIEW_SCAN = 20

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
        if body.get("role") not in ("user", "assistant"):
            continue
        text = (message_text(body) or "").strip()
        if text:
            return text if utf16_length(text) <= PREVIEW_MAX else f"{utf16_prefix(text, PREVIEW_MAX - 3)}..."
    return None


def _first_user_text(window_id: str) -> str | None:
    body = (
        TranscriptEvent.objects.filter(window_id=window_id, type="message", body__role="user")
        .order_by("seq")
        .values_list("body", flat=True)
        .first()
    )
    return message_text(body) if body else None


def _newest_bodies(window_id: str) -> list[dict]:
    return list(
        TranscriptEvent.objects.filter(window_id=window_id, type="message")
        .order_by("-seq")
        .values_list("body", flat=True)[:PREVIEW_SCAN]
    )


def derived_title(session: Session) -> str | None:
    label = session.label.strip()
    if label:
        return label
    display_name = session.display_name.strip()
    if display_name:
        return display_name
    return title_from_message(_first_user_text(session.session_id))


def row_extras(sessions: Sequence[Session], *, titles: bool, last_message: bool) -> dict[str, dict]:
    """``derivedTitle`` and ``lastMessagePreview`` per session key, where there is one (each an indexed read of
    the session's active transcript from its start or its end)."""
    extras: dict[str, dict] = {}
    for session in sessions:
        fields = {}
        if titles and (title := derived_title(session)):
            fields["derivedTitle"] = title
        if last_message and (preview := preview_of(_newest_bodies(session.session_id))):
            fields["lastMessagePreview"] = preview
        if fields:
            extras[session.key] = fields
    return extras
