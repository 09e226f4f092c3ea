"""``chat.history`` with OpenClaw's params: pages from the newest (``limit``, ``offset``), a page around one message
(``messageId``, of an earlier window with ``sessionId``), a byte budget (``maxBytes``), each text cut at
``maxChars``, and the receipts of the turns a client sent (``inputRunIds``).

OpenClaw's rules, as its gateway applies them: an offset counts messages back from the newest; a byte budget drops
the oldest messages of the page (never the newest one) and the next page goes on from there; a page around a
message grows older and newer by turns while it fits; an unknown message answers no messages. A ``cursor`` asks
for what changed since an earlier answer, which this gateway does not keep: it answers ``{"kind": "reset"}``, as
OpenClaw's does when it cannot, and the client reloads the page.
"""

from __future__ import annotations

import json

from gateway.exceptions import InvalidRequest, NotFound

from . import keys, selectors
from .models import Run, RunStatus, Session, SessionWindow, TranscriptEvent
from .schemas import ChatHistoryParams
from .selectors import HISTORY_TEXT_LIMIT, history_message

# OpenClaw's ceiling on a history page's messages, whatever maxBytes asks (getMaxChatHistoryMessagesBytes).
MAX_HISTORY_BYTES = 6 * 1024 * 1024


def json_bytes(value: object) -> int:
    """The size of ``value`` as compact JSON in UTF-8 (JavaScript's ``JSON.stringify``)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def cap_by_bytes(messages: list[dict], max_bytes: int) -> list[dict]:
    """OpenClaw's ``capArrayByJsonBytes``: the newest messages whose JSON array fits ``max_bytes``, dropping the
    oldest first and never the newest."""
    if not messages:
        return messages
    sizes = [json_bytes(message) for message in messages]
    total = 2 + sum(sizes) + len(messages) - 1
    start = 0
    while total > max_bytes and start < len(messages) - 1:
        total -= sizes[start] + 1
        start += 1
    return messages[start:]


def around_message(older: list[dict], anchor: dict, newer: list[dict], *, limit: int, max_bytes: float) -> list[dict]:
    """A page around ``anchor``: older (newest first) and newer (oldest first) messages added by turns while the
    page holds at most ``limit`` messages and its JSON fits ``max_bytes``."""
    sides = (older, newer)
    taken = [0, 0]
    growing = [bool(older), bool(newer)]
    cost = json_bytes(anchor) + 1
    while any(growing) and 1 + sum(taken) < limit:
        for side in (0, 1):
            if not growing[side] or 1 + sum(taken) >= limit:
                continue
            size = json_bytes(sides[side][taken[side]]) + 1
            if cost + size > max_bytes - 1:
                growing[side] = False
                continue
            cost += size
            taken[side] += 1
            growing[side] = taken[side] < len(sides[side])
    return [*reversed(older[: taken[0]]), anchor, *newer[: taken[1]]]


def input_receipts(session: Session, window: SessionWindow, run_ids: list[str]) -> list[dict]:
    """OpenClaw's ``inputReceipts``: each named turn of this window, ``pending`` while its message waits in the
    queue, ``consumed`` (with the transcript entry it became) once the turn took it. Unknown ids are left out."""
    receipts = []
    runs = Run.objects.filter(session=session, window=window, run_id__in=run_ids).only(
        "run_id", "status", "user_event_id", "created_at"
    )
    for run in sorted(runs, key=lambda run: run.created_at):
        if run.user_event_id:
            receipts.append({"runId": run.run_id, "state": "consumed", "consumedByEventId": run.user_event_id})
        elif run.status == RunStatus.QUEUED:
            receipts.append({"runId": run.run_id, "state": "pending"})
    return receipts


def _messages(events: list[TranscriptEvent], text_limit: int) -> list[dict]:
    return [history_message(event, text_limit=text_limit) for event in events]


def session_for_page(key: str) -> Session | None:
    """The session whose history is asked for; ``None`` for an agent's main session that its first turn has not
    created yet (its page is empty, as OpenClaw answers it); any other unknown key is refused."""
    session = selectors.session_get(key)
    if session is None and not keys.is_main_key(key):
        raise NotFound(f"session not found: {key}")
    return session


def empty_main_page(requested_key: str) -> dict:
    return {"sessionKey": requested_key, "messages": [], "hasMore": False, "totalMessages": 0}


def chat_history_payload(session: Session, params: ChatHistoryParams) -> dict:
    """The ``chat.history`` answer for ``params`` (validated: positions that exclude each other are refused)."""
    if params.cursor is not None:
        return {"kind": "reset"}
    if params.sessionId is not None:
        window = SessionWindow.objects.filter(pk=params.sessionId, session=session).first()
        if window is None:
            raise InvalidRequest("sessionId does not belong to sessionKey")
    else:
        window = SessionWindow.objects.get(pk=session.session_id)
    text_limit = min(params.maxChars, HISTORY_TEXT_LIMIT) if params.maxChars is not None else HISTORY_TEXT_LIMIT
    max_bytes = min(params.maxBytes or MAX_HISTORY_BYTES, MAX_HISTORY_BYTES)
    messages_of_window = TranscriptEvent.objects.filter(window=window, type="message")
    result: dict = {"sessionKey": session.key, "sessionId": window.id}
    if params.messageId is not None:
        anchor = messages_of_window.filter(event_id=params.messageId).first()
        if anchor is None:
            messages: list[dict] = []
        else:
            before = messages_of_window.filter(seq__lt=anchor.seq).order_by("-seq")[: params.limit]
            after = messages_of_window.filter(seq__gt=anchor.seq).order_by("seq")[: params.limit]
            older, newer = _messages(list(before), text_limit), _messages(list(after), text_limit)
            messages = around_message(
                older, history_message(anchor, text_limit=text_limit), newer, limit=params.limit, max_bytes=max_bytes
            )
        result.update(messages=messages, totalMessages=window.message_count)
    else:
        offset = params.offset or 0
        newest = list(messages_of_window.order_by("-seq")[offset : offset + params.limit])
        newest.reverse()
        messages = _messages(newest, text_limit)
        messages = cap_by_bytes(messages, max_bytes)
        next_offset = offset + len(messages)
        has_more = next_offset < window.message_count
        result["messages"] = messages
        if params.offset is not None:
            result["offset"] = offset
        if has_more:
            result["nextOffset"] = next_offset
        result.update(totalMessages=window.message_count, hasMore=has_more)
    if params.inputRunIds is not None:
        receipts = input_receipts(session, window, params.inputRunIds) if params.messageId is None else []
        result["inputReceipts"] = receipts
        result["inputConsumptions"] = [
            {"runId": receipt["runId"], "consumedByEventId": receipt["consumedByEventId"]}
            for receipt in receipts
            if receipt["state"] == "consumed"
        ]
    return result
