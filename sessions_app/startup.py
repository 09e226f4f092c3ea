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

from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from gateway.exceptions import InvalidRequest

from . import history, keys, selectors
from .models import Run, RunStatus, Session, SessionWindow
from .resolve import resolve_short_id
from .schemas import ChatHistoryParams, ChatStartupParams, SessionsResolveParams

DEFAULT_LIMIT = 200
# Pending inputs shown per page (OpenClaw's listSessionPendingInputs takes at most 20).
PENDING_INPUTS_LIMIT = 20
PENDING_INPUT_PREFIX = "pending:"


def _ms(value) -> int | None:
    return int(value.timestamp() * 1000) if value else None


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


def chat_startup_page(params: ChatStartupParams) -> dict[str, Any]:
    history_params = _history_params(params)
    key = keys.canonical_key(params.sessionKey, params.agentId)
    session = history.session_for_page(key)
    if session is None:
        return _empty_main_page(params.sessionKey, key)
    # The page itself is chat.history's, params for params (sessions_app/history.py).
    page = history.chat_history_payload(session, history_params)
    if params.cursor is not None:
        return page
    window = SessionWindow.objects.get(pk=page["sessionId"])
    running = list(
        Run.objects.filter(session=session, status=RunStatus.RUNNING)
        .order_by("created_at")
        .values("run_id", "started_at")
    )
    limit = history_params.limit
    payload: dict[str, Any] = {
        **page,
        "sessionKey": params.sessionKey,
        "pendingInputs": _pending_inputs(session, window, params.pendingBefore, min(limit, PENDING_INPUTS_LIMIT)),
        "defaults": selectors.session_defaults(),
        "sessionInfo": _session_info(session, [run["run_id"] for run in running]),
    }
    if running:
        payload["inFlightRun"] = {
            "runId": running[0]["run_id"],
            # The text streamed so far lives in the executing turn, not here: the run's next delta carries it whole.
            "text": "",
            **({"startedAt": _ms(running[0]["started_at"])} if running[0]["started_at"] else {}),
            "sessionAbortable": True,
        }
    return payload


def _history_params(params: ChatStartupParams) -> ChatHistoryParams:
    """chat.history's params of a startup by session key (refused in OpenClaw's words where they contradict each
    other, before anything is read)."""
    fields = params.model_dump(
        include={"sessionKey", "agentId", "cursor", "offset", "messageId", "sessionId", "maxChars", "inputRunIds"},
        exclude_none=True,
    )
    try:
        return ChatHistoryParams(
            **fields,
            limit=params.limit or DEFAULT_LIMIT,
            **({"maxBytes": params.maxBytes} if params.maxBytes is not None else {}),
        )
    except ValidationError as refused:
        raise InvalidRequest(refused.errors()[0]["msg"].removeprefix("Value error, ")) from None


def _empty_main_page(requested_key: str, key: str) -> dict[str, Any]:
    return {
        **history.empty_main_page(requested_key),
        "pendingInputs": {"items": [], "total": 0},
        "defaults": selectors.session_defaults(),
        "sessionInfo": {"key": key, "agentId": keys.agent_of(key), "kind": "direct", "hasActiveRun": False},
    }


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
            "content": [{"type": "text", "text": selectors.history_text(run.message)}],
            "timestamp": accepted,
            "__openclaw": {"id": f"{PENDING_INPUT_PREFIX}{run.run_id}"},
        },
        "acceptedAt": accepted,
        "state": "queued",
    }


def _session_info(session: Session, running_run_ids: list[str]) -> dict[str, Any]:
    """The session's row (``sessions.describe``'s) with what runs in it now."""
    info = selectors.session_row(session)
    info["hasActiveRun"] = bool(running_run_ids)
    info["activeRunIds"] = running_run_ids
    if running_run_ids:
        info["status"] = "running"
    return info
