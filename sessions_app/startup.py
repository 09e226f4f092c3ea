"""``chat.startup``: what OpenClaw's Control UI chat page reads when it opens (its ``chat-startup-handler``).

The first history page of the session (as ``chat.history`` shows messages, newest ``limit``, cut to
``maxBytes``), the input it accepted and has not started yet (``pendingInputs``: the session's queued turns),
the receipts of the inputs it asks about (``inputRunIds``: queued, or consumed by the transcript's user
message), the session's row with its running turns (``sessionInfo``, ``inFlightRun``) and the defaults — all
read from the database in one hop. A chat link's short id is resolved first (``sessions.resolve``'s rules);
what it does not name uniquely is answered as ``{resolution: {ok: false, candidates?}}``.

This gateway keeps no history delta cursors: a ``cursor`` (which only a ``deltaCursor`` it never hands out
could give) is answered ``{kind: "reset"}``, OpenClaw's word for "read the page again".
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q

from gateway.exceptions import InvalidRequest, NotFound

from . import keys, selectors
from .models import Run, RunStatus, Session, SessionWindow, TranscriptEvent
from .resolve import resolve_short_id
from .schemas import ChatStartupParams, SessionsResolveParams

DEFAULT_LIMIT = 200
# OpenClaw's ceiling on a history page's messages, whatever maxBytes asks (getMaxChatHistoryMessagesBytes).
MAX_HISTORY_BYTES = 6 * 1024 * 1024
# Pending inputs shown per page (OpenClaw's listSessionPendingInputs takes at most 20).
PENDING_INPUTS_LIMIT = 20
PENDING_INPUT_PREFIX = "pending:"
TRUNCATED_MARK = "\n...(truncated)..."


def _ms(value) -> int | None:
    return int(value.timestamp() * 1000) if value else None


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def chat_startup(params: ChatStartupParams) -> dict[str, Any]:
    if params.shortId is not None:
        resolution = resolve_short_id(
            params.shortId,
            params.slugHint,
            params=SessionsResolveParams(shortId=params.shortId, agentId=params.agentId, allowMissing=True),
        )
        if resolution.session is None:
            return {"resolution": resolution.payload()}
        page = chat_startup_page(
            ChatStartupParams(
                sessionKey=resolution.session["key"],
                agentId=resolution.session["agentId"],
                limit=params.limit,
                maxBytes=params.maxBytes,
            )
        )
        return {**page, "resolution": resolution.payload()}
    return chat_startup_page(params)


def _check_combination(params: ChatStartupParams) -> None:
    """OpenClaw's refusals of params that contradict each other, in its words and order."""
    if params.offset is not None and params.messageId is not None:
        raise InvalidRequest("offset and messageId cannot be used together")
    if params.cursor is not None and (params.offset is not None or params.messageId is not None):
        raise InvalidRequest("cursor cannot be used with offset or messageId")
    if params.sessionId is not None and params.messageId is None:
        raise InvalidRequest("sessionId requires messageId")


def chat_startup_page(params: ChatStartupParams) -> dict[str, Any]:
    _check_combination(params)
    key = keys.canonical_key(params.sessionKey, params.agentId)
    session = selectors.session_get(key)
    if session is None:
        if not keys.is_main_key(key):
            raise NotFound(f"session not found: {key}")
        # The agent's main session is created by its first turn: until then its page is empty.
        return _empty_main_page(params.sessionKey, key)
    if params.cursor is not None:
        return {"kind": "reset"}
    window = _window(session, params)
    limit = params.limit or DEFAULT_LIMIT
    events, skipped = _page_events(window, params, limit)
    messages = [_shown(selectors.history_message(event), params.maxChars) for event in events]
    budget = min(params.maxBytes or MAX_HISTORY_BYTES, MAX_HISTORY_BYTES)
    while messages and _json_bytes(messages) > budget:
        messages.pop(0)  # the oldest goes first: the page is for reading from the newest back
    older = window.message_count - skipped - len(messages)
    running = list(
        Run.objects.filter(session=session, status=RunStatus.RUNNING)
        .order_by("created_at")
        .values("run_id", "started_at")
    )
    payload: dict[str, Any] = {
        "sessionKey": params.sessionKey,
        "sessionId": window.id,
        "messages": messages,
        "pendingInputs": _pending_inputs(session, window, params.pendingBefore, min(limit, PENDING_INPUTS_LIMIT)),
    }
    if params.inputRunIds is not None:
        receipts = _input_receipts(session, window, params.inputRunIds)
        payload["inputReceipts"] = receipts
        payload["inputConsumptions"] = [
            {"runId": receipt["runId"], "consumedByEventId": receipt["consumedByEventId"]}
            for receipt in receipts
            if receipt["state"] == "consumed"
        ]
    if params.offset is not None:
        payload["offset"] = params.offset
    if older > 0:
        payload["nextOffset"] = skipped + len(messages)
    payload["hasMore"] = older > 0
    payload["totalMessages"] = window.message_count
    payload["defaults"] = selectors.session_defaults()
    payload["sessionInfo"] = _session_info(session, [run["run_id"] for run in running])
    if running:
        payload["inFlightRun"] = {
            "runId": running[0]["run_id"],
            # The text streamed so far lives in the executing turn, not here: the run's next delta carries it whole.
            "text": "",
            **({"startedAt": _ms(running[0]["started_at"])} if running[0]["started_at"] else {}),
            "sessionAbortable": True,
        }
    return payload


def _empty_main_page(requested_key: str, key: str) -> dict[str, Any]:
    return {
        "sessionKey": requested_key,
        "messages": [],
        "pendingInputs": {"items": [], "total": 0},
        "hasMore": False,
        "totalMessages": 0,
        "defaults": selectors.session_defaults(),
        "sessionInfo": {"key": key, "agentId": keys.agent_of(key), "kind": "direct", "hasActiveRun": False},
    }


def _window(session: Session, params: ChatStartupParams) -> SessionWindow:
    """The transcript read: the session's current one, or (``sessionId``) an earlier one of the same session."""
    if params.sessionId is None or params.sessionId == session.session_id:
        return SessionWindow.objects.get(pk=session.session_id)
    window = SessionWindow.objects.filter(pk=params.sessionId, session=session).first()
    if window is None:
        raise InvalidRequest("sessionId does not belong to sessionKey")
    return window


def _page_events(window: SessionWindow, params: ChatStartupParams, limit: int) -> tuple[list[TranscriptEvent], int]:
    """The page's message events, oldest first, and how many newer messages it leaves out.

    ``offset`` skips that many of the newest; ``messageId`` centres the page on that message."""
    messages = TranscriptEvent.objects.filter(window=window, type="message")
    skipped = params.offset or 0
    if params.messageId is not None:
        target = messages.filter(event_id=params.messageId).values_list("seq", flat=True).first()
        if target is None:
            raise NotFound(f"message not found: {params.messageId}")
        newer = list(messages.filter(seq__gt=target).order_by("seq").values_list("seq", flat=True)[: limit // 2])
        last = newer[-1] if newer else target
        skipped = messages.filter(seq__gt=last).count()
    newest = list(messages.order_by("-seq")[skipped : skipped + limit])
    newest.reverse()
    return newest, skipped


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + TRUNCATED_MARK


def _shown(message: dict[str, Any], max_chars: int | None) -> dict[str, Any]:
    """``maxChars``: every text part cut to that many characters (marked), as OpenClaw's projection does."""
    if max_chars is None:
        return message
    content = [
        {**part, "text": _cut(part["text"], max_chars)}
        if part.get("type") == "text" and isinstance(part.get("text"), str)
        else part
        for part in message.get("content", [])
    ]
    return {**message, "content": content}


def _pending_inputs(session: Session, window: SessionWindow, before: int | None, limit: int) -> dict[str, Any]:
    """The turns the session accepted and has not started: OpenClaw's pending inputs, oldest first.

    ``before`` (a page's ``nextBefore``) is an acceptance time in epoch ms: only inputs accepted earlier."""
    queued = Run.objects.filter(session=session, window=window, status=RunStatus.QUEUED)
    total = queued.count()
    if before is not None:
        queued = queued.filter(created_at__lt=_datetime_of_ms(before))
    newest = list(queued.order_by("-created_at", "-run_id")[: limit + 1])
    more = len(newest) > limit
    page = list(reversed(newest[:limit]))
    items = [_pending_item(run) for run in page]
    result: dict[str, Any] = {"items": items, "total": total}
    if more and page:
        result["nextBefore"] = items[0]["acceptedAt"]
    return result


def _datetime_of_ms(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1000, tz=UTC)


def _pending_item(run: Run) -> dict[str, Any]:
    accepted = _ms(run.created_at)
    return {
        "id": run.run_id,
        "runId": run.run_id,
        "message": {
            "role": "user",
            "content": [{"type": "text", "text": _cut(run.message, selectors.HISTORY_TEXT_LIMIT)}],
            "timestamp": accepted,
            "__openclaw": {"id": f"{PENDING_INPUT_PREFIX}{run.run_id}"},
        },
        "acceptedAt": accepted,
        "state": "queued",
    }


def _input_receipts(session: Session, window: SessionWindow, run_ids: list[str]) -> list[dict[str, Any]]:
    """Of the inputs the caller sent (their run ids): each still waiting, or consumed by its user message."""
    found = {
        run["run_id"]: run
        for run in Run.objects.filter(session=session, window=window, run_id__in=run_ids)
        .filter(Q(status=RunStatus.QUEUED) | ~Q(user_event_id=""))
        .values("run_id", "status", "user_event_id")
    }
    receipts = []
    for run_id in run_ids:
        run = found.get(run_id)
        if run is None:
            continue
        if run["user_event_id"]:
            receipts.append({"runId": run_id, "state": "consumed", "consumedByEventId": run["user_event_id"]})
        else:
            receipts.append({"runId": run_id, "state": "pending"})
    return receipts


def _session_info(session: Session, running_run_ids: list[str]) -> dict[str, Any]:
    """The session's row (``sessions.describe``'s) with what runs in it now."""
    info = selectors.session_row(session)
    info["hasActiveRun"] = bool(running_run_ids)
    info["activeRunIds"] = running_run_ids
    if running_run_ids:
        info["status"] = "running"
    return info
