"""The session page's transcript as the template draws it: every message and every content part of it.

Tool calls become cards inside their assistant message; each tool result is attached to the card of its call
(same turn, same ``toolCallId``), or drawn on its own where its call is not on the page (older than the
newest 200 messages). A pending exec approval is attached to the call it asks about (its run and
``toolCallId``); the ones no card on the page belongs to are listed apart, so none is hidden.

Text and thinking are Markdown, drawn as the sanitised HTML of ``operator_ui.markdown``. An image part with its
data (base64, as OpenClaw stores it) of a raster type browsers draw safely (PNG, JPEG, GIF, WebP: never SVG,
which can carry script) is drawn from a ``data:`` URI made anew from the decoded bytes, when its bytes start
as that type's do and are at most ``IMAGE_BYTES_LIMIT``; any other image is named with its type and size and
why it is not shown. A message's time, and an assistant message's model and token usage, come from its own
fields (``timestamp``, ``provider``/``model``, ``usage.input``/``usage.output``, as the turn runner writes them).

Which turn a message belongs to is read from the transcript itself: a turn's user message carries the
idempotency key ``<runId>:user`` (``runs.run_claim``), and every message up to the next user message is that
turn's (one turn of a session runs at a time).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from approvals_app.models import ExecApproval
from openclaw_client.agent.loop import RAW_ARGUMENTS_KEY

from . import markdown

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
IMAGE_BYTES_LIMIT = 2 * 1024 * 1024
# The console's address of a message's image part: (entry id, index of the part in the message's content).
type ImageUrl = Callable[[str, int], str]
# The raster types drawn, by the bytes their data starts with (a WebP's "WEBP" follows the RIFF size).
IMAGE_SIGNATURES = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
}


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
    # Its content parts other than text (an image a tool returned; a part of a kind not known here).
    parts: list[Part] = field(default_factory=list)

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
    # Text and thinking: the Markdown as sanitised HTML.
    html: SafeString | None = None
    # An image: the data: URI it is drawn from, or why it is not drawn; its decoded size when known.
    image_src: str = ""
    not_shown: str = ""
    size: int | None = None

    @property
    def opens_alone(self) -> bool:
        """The image has an address of its own, which a link may open at full size (a browser opens no ``data:``)."""
        return bool(self.image_src) and not self.image_src.startswith("data:")


@dataclass
class TranscriptItem:
    message: dict[str, Any]
    role: str
    entry_id: str
    run_id: str | None
    parts: list[Part] = field(default_factory=list)
    # A tool result drawn on its own (its call is not on the page).
    result: ToolResultCard | None = None

    @property
    def timestamp(self) -> int | None:
        value = self.message.get("timestamp")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def model(self) -> str:
        model, provider = self.message.get("model"), self.message.get("provider")
        if not isinstance(model, str) or not model:
            return ""
        return f"{provider}/{model}" if isinstance(provider, str) and provider else model

    @property
    def input_tokens(self) -> int | None:
        return _usage(self.message, "input")

    @property
    def output_tokens(self) -> int | None:
        return _usage(self.message, "output")


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
    image_url: ImageUrl | None = None,
) -> Transcript:
    """The page's transcript. ``run_statuses``: the status of the session's recent turns (a call without a
    result is "running" only while its turn runs); ``pending_approvals``: the session's (staff only);
    ``image_url``: the console's address of a message's image part (its entry id, the part's index)."""
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
        image_src = _image_sources(image_url, entry_id)
        if role == "toolResult":
            result = _result_card(message, image_src)
            waiting = open_calls.get(result.call_id)
            if waiting:
                waiting.pop(0).result = result
                continue
            items.append(TranscriptItem(message, role, entry_id, run_id, result=result))
            continue
        item = TranscriptItem(message, role, entry_id, run_id)
        # Unique on the page (the ids of its code blocks start with it), the same on every drawing of it.
        block_id = f"m-{entry_id or len(items)}"
        content = message.get("content")
        if isinstance(content, str):  # an older shape: the text itself
            content = [{"type": "text", "text": content}]
        elif content is not None and not isinstance(content, list):
            content = [content]
        for index, part in enumerate(content or []):
            drawn = _part(part, run_id, f"{block_id}-{index}", image_src(index))
            if drawn.call is not None:
                open_calls.setdefault(drawn.call.call_id, []).append(drawn.call)
                cards.append(drawn.call)
            item.parts.append(drawn)
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


def _image_sources(image_url: ImageUrl | None, entry_id: str) -> Callable[[int], str]:
    """The address of each part of one message by its index ("" draws the image inline)."""
    if image_url is None or not entry_id:
        return lambda index: ""
    return lambda index: image_url(entry_id, index)


def _part(part: Any, run_id: str | None, block_id: str, image_src: str = "") -> Part:
    if not isinstance(part, dict):
        return _other_part(part)
    kind = part.get("type")
    if kind in ("text", "thinking"):
        text = str(part.get(kind) or "")
        # Sanitised by markdown.render: no markup of the model's own reaches the page.
        return Part(kind, text=text, html=mark_safe(markdown.render(text, block_id)))
    if kind == "toolCall":
        return Part("tool-call", call=_call_card(part, run_id))
    if kind == "image":
        return image_part(part, image_src)
    return _other_part(part)


def _other_part(part: Any) -> Part:
    """A part of a kind not known here: its JSON."""
    kind = part.get("type") if isinstance(part, dict) else None
    return Part("other", text=_json(part), label=str(kind or "part"))


@dataclass(frozen=True)
class CheckedImage:
    """An image part's data as the console would serve it (``data``), or why it is not shown (``not_shown``)."""

    label: str
    mime_type: str = ""
    size: int | None = None
    data: bytes | None = None
    not_shown: str = ""


def check_image(part: Any) -> CheckedImage:
    """An image part's bytes, once they prove to be the raster type they claim and no larger than 2 MB: OpenClaw's
    ``{data, mimeType}`` and the ``{source: {data, media_type}}`` of Anthropic's messages."""
    if not isinstance(part, dict):
        return CheckedImage("image of unknown type", not_shown="the transcript holds no image there")
    source = part.get("source") if isinstance(part.get("source"), dict) else part
    mime_type = str(source.get("mimeType") or source.get("media_type") or "").strip().lower()
    data = source.get("data")
    label = mime_type or "image of unknown type"
    if not isinstance(data, str) or not data:
        return CheckedImage(label, not_shown="the transcript holds no data for it")
    data = "".join(data.split())
    # Not decoded when it is too large (its size follows from the base64's length).
    size = len(data) * 3 // 4 - data[-2:].count("=")
    if mime_type not in IMAGE_SIGNATURES:
        return CheckedImage(label, size=size, not_shown="only PNG, JPEG, GIF and WebP images are drawn")
    if size > IMAGE_BYTES_LIMIT:
        return CheckedImage(label, size=size, not_shown="larger than the console draws (2 MB)")
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return CheckedImage(label, size=size, not_shown="its data is not valid base64")
    if not decoded.startswith(IMAGE_SIGNATURES[mime_type]) or (mime_type == "image/webp" and decoded[8:12] != b"WEBP"):
        return CheckedImage(label, size=len(decoded), not_shown=f"its data is not a {mime_type} image")
    return CheckedImage(label, mime_type=mime_type, size=len(decoded), data=decoded)


def image_part(part: dict[str, Any], src: str = "") -> Part:
    """An image part drawn from ``src`` (the console's address of it: the page stays small, and the browser caches
    it) or, without one, from its data inline; or named with why it is not drawn."""
    checked = check_image(part)
    if checked.data is None:
        return Part("image", label=checked.label, size=checked.size, not_shown=checked.not_shown)
    if not src:
        src = f"data:{checked.mime_type};base64,{base64.b64encode(checked.data).decode('ascii')}"
    return Part("image", label=checked.label, size=checked.size, image_src=src)


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


def _result_card(message: dict[str, Any], image_src: Callable[[int], str]) -> ToolResultCard:
    details = message.get("details") if isinstance(message.get("details"), dict) else {}
    content = message.get("content")
    texts: list[str] = []
    parts: list[Part] = []
    for index, part in enumerate(
        content if isinstance(content, list) else [{"type": "text", "text": str(content or "")}]
    ):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(str(part.get("text", "")))
        else:
            parts.append(image_part(part, image_src(index)) if kind == "image" else _other_part(part))
    output = "".join(texts)
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
        parts=parts,
    )


def _usage(message: dict[str, Any], key: str) -> int | None:
    usage = message.get("usage")
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _json(value: Any, indent: int | None = 2) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=False, default=str)
