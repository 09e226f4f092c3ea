"""The session page's transcript as the template draws it: every message and every content part of it.

Tool calls become cards inside their assistant message; each tool result is attached to the card of its call
(same turn, same ``toolCallId``), or drawn on its own where its call is not on the page (older than the
newest 200 messages). A pending exec approval is attached to the call it asks about (its run and
``toolCallId``); the ones no card on the page belongs to are listed apart, so none is hidden.

Which turn a message belongs to is read from the transcript itself: a turn's user message carries the
idempotency key ``<runId>:user`` (``runs.run_claim``), and every message up to the next user message is that
turn's (one turn of a session runs at a time).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from approvals_app.models import ExecApproval
from openclaw_client.agent.loop import RAW_ARGUMENTS_KEY

EXEC_TOOL = "exec"
SUMMARY_LIMIT = 160
# The argument a card's one-line summary shows, per tool (the exec command; a path; a pattern).
SUMMARY_ARGUMENTS = {
    "exec": ("command",),
    "read": ("path",),
    "write": ("path",),
    "edit": ("path",),
    "ls": ("path",),
    "find": ("pattern", "path"),
    "grep": ("pattern", "path"),
}
USER_KEY_SUFFIX = ":user"


@dataclass
class ToolResultCard:
    tool_name: str
    call_id: str
    # ok | error | denied | aborted | timed-out: the words shown, never the colour alone.
    status: str
    output: str
    exit_code: int | None = None
    duration_ms: int | None = None
    cwd: str = ""
    artifact_id: str = ""
    output_bytes: int | None = None
    truncated: bool = False

    @property
    def status_label(self) -> str:
        return self.status.replace("-", " ")

    @property
    def output_lines(self) -> int:
        return len(self.output.splitlines())


@dataclass
class ToolCallCard:
    call_id: str
    name: str
    summary: str
    arguments: str
    run_id: str | None
    result: ToolResultCard | None = None
    approval: ExecApproval | None = None
    # What a call without a result is doing: running (its turn runs), waiting (for an operator), none.
    pending: str = ""


@dataclass
class Part:
    # text | thinking | tool-call | image | other
    kind: str
    text: str = ""
    call: ToolCallCard | None = None
    label: str = ""


@dataclass
class TranscriptItem:
    message: dict[str, Any]
    role: str
    entry_id: str
    run_id: str | None
    parts: list[Part] = field(default_factory=list)
    # A tool result drawn on its own (its call is not on the page).
    result: ToolResultCard | None = None


@dataclass
class Transcript:
    items: list[TranscriptItem]
    # Pending approvals of the session no card on the page belongs to.
    unmatched_approvals: list[ExecApproval]


def build(
    messages: Iterable[dict[str, Any]],
    *,
    run_statuses: Mapping[str, str],
    pending_approvals: Iterable[ExecApproval] = (),
) -> Transcript:
    """The page's transcript. ``run_statuses``: the status of the session's recent turns (a call without a
    result is "running" only while its turn runs); ``pending_approvals``: the session's (staff only)."""
    items: list[TranscriptItem] = []
    run_id: str | None = None
    # Calls of the current turn still without a result, by id, in order (a model may reuse an id).
    open_calls: dict[str, list[ToolCallCard]] = {}
    cards: list[ToolCallCard] = []
    for message in messages:
        role = str(message.get("role", ""))
        if role == "user":
            run_id = _run_of(message)
            open_calls = {}
        entry_id = message.get("__openclaw", {}).get("id", "")
        if role == "toolResult":
            result = _result_card(message)
            waiting = open_calls.get(result.call_id)
            if waiting:
                waiting.pop(0).result = result
                continue
            items.append(TranscriptItem(message, role, entry_id, run_id, result=result))
            continue
        item = TranscriptItem(message, role, entry_id, run_id)
        for part in message.get("content", []) if isinstance(message.get("content"), list) else []:
            drawn = _part(part, run_id)
            if drawn.call is not None:
                open_calls.setdefault(drawn.call.call_id, []).append(drawn.call)
                cards.append(drawn.call)
            item.parts.append(drawn)
        if isinstance(message.get("content"), str):  # an older shape: the text itself
            item.parts.append(Part("text", text=message["content"]))
        items.append(item)
    unmatched = _attach_approvals(cards, pending_approvals)
    for card in cards:
        if card.result is None and card.approval is None:
            card.pending = "running" if card.run_id and run_statuses.get(card.run_id) == "running" else ""
    return Transcript(items=items, unmatched_approvals=unmatched)


def _run_of(message: dict[str, Any]) -> str | None:
    key = message.get("idempotencyKey")
    if isinstance(key, str) and key.endswith(USER_KEY_SUFFIX):
        return key.removesuffix(USER_KEY_SUFFIX) or None
    return None


def _attach_approvals(cards: list[ToolCallCard], approvals: Iterable[ExecApproval]) -> list[ExecApproval]:
    """Each pending approval on the newest card of its run with its tool call id and no result yet."""
    unmatched = []
    for approval in approvals:
        card = next(
            (
                card
                for card in reversed(cards)
                if card.result is None
                and card.approval is None
                and card.call_id == approval.tool_call_id
                and card.run_id is not None
                and card.run_id == approval.run_id
            ),
            None,
        )
        if card is None:
            unmatched.append(approval)
        else:
            card.approval, card.pending = approval, "waiting"
    return unmatched


def _part(part: Any, run_id: str | None) -> Part:
    if not isinstance(part, dict):
        return Part("other", text=_json(part), label="part")
    kind = part.get("type")
    if kind == "text":
        return Part("text", text=str(part.get("text", "")))
    if kind == "toolCall":
        return Part("tool-call", call=_call_card(part, run_id))
    if kind == "thinking":
        return Part("thinking", text=str(part.get("thinking", "")))
    if kind == "image":
        # The picture's data stays out of the page; what it is shows.
        return Part("image", label=str(part.get("mimeType") or "image"))
    return Part("other", text=_json(part), label=str(kind or "part"))


def _call_card(part: dict[str, Any], run_id: str | None) -> ToolCallCard:
    name = str(part.get("name", ""))
    arguments = part.get("arguments")
    if isinstance(arguments, dict) and set(arguments) == {RAW_ARGUMENTS_KEY}:
        shown = str(arguments[RAW_ARGUMENTS_KEY])  # not JSON: the text the model sent
    else:
        shown = _json(arguments)
    return ToolCallCard(
        call_id=str(part.get("id", "")),
        name=name,
        summary=summary(name, arguments),
        arguments=shown,
        run_id=run_id,
    )


def summary(name: str, arguments: Any) -> str:
    """One line about a call: the exec command, the path or pattern of a file tool, else its arguments."""
    if not isinstance(arguments, dict):
        text = _json(arguments)
    else:
        keys = SUMMARY_ARGUMENTS.get(name, ())
        picked = [str(arguments[key]) for key in keys if arguments.get(key) not in (None, "")]
        text = " in ".join(picked) if picked else _json(arguments, indent=None)
    # One line: a newline in a command is shown, not hidden (the whole of it is in the arguments).
    text = text.replace("\r\n", "\n").replace("\n", " ⏎ ")
    return text if len(text) <= SUMMARY_LIMIT else text[: SUMMARY_LIMIT - 1] + "…"


def _result_card(message: dict[str, Any]) -> ToolResultCard:
    details = message.get("details") if isinstance(message.get("details"), dict) else {}
    content = message.get("content")
    if isinstance(content, list):
        output = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    else:
        output = str(content or "")
    if details.get("denied"):
        status = "denied"
    elif details.get("aborted"):
        status = "aborted"
    elif details.get("timedOut"):
        status = "timed-out"
    elif message.get("isError"):
        status = "error"
    else:
        status = "ok"
    return ToolResultCard(
        tool_name=str(message.get("toolName", "")),
        call_id=str(message.get("toolCallId", "")),
        status=status,
        output=output,
        exit_code=details.get("exitCode") if isinstance(details.get("exitCode"), int) else None,
        duration_ms=details.get("durationMs") if isinstance(details.get("durationMs"), int) else None,
        cwd=str(details.get("cwd") or ""),
        artifact_id=str(details.get("artifactId") or ""),
        output_bytes=details.get("outputBytes") if isinstance(details.get("outputBytes"), int) else None,
        truncated=bool(details.get("truncated")),
    )


def _json(value: Any, indent: int | None = 2) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=False, default=str)
