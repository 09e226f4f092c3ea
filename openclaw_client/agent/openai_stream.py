"""Folding one OpenAI chat-completions reply: ``chat.completion.chunk`` events, or a ``chat.completion`` body.

One implementation for both readers of that format: the gateway's OpenAI-compatible model provider
(``sessions_app.model_providers.openai_compat``) and the worker child on a node host
(``openclaw_client.worker``), which reads the same format back from the gateway's inference proxy.
Standard library only: the worker child runs it from the worker bundle.

A :class:`StreamState` takes the body as it comes — :meth:`StreamState.feed_line` for each line of an
event stream, :meth:`StreamState.feed_completion` for a JSON body — and returns each piece of content
text as it arrives; :meth:`StreamState.reply` is the whole reply once the body has ended. Tool calls
(``delta.tool_calls``) are assembled by ``index``: the first fragment of a call carries its ``id`` and
``function.name``, later ones append to ``function.arguments``. Servers that differ are tolerated where
the intent is plain: the id (or the name) repeated on every fragment, the whole call in one fragment,
no ``index`` at all (fragments continue the newest call until one brings a new id), every call numbered
``0`` (a new id at a used index starts a new call), arguments sent as a JSON object, no id at all (one
is made up, so the tool message can answer the call). The arguments stay the text the model wrote: the
tools validate them.

Failures are :class:`ReplyError` subclasses: :class:`MalformedReply` (``why`` is one line),
:class:`RefusedReply` (the model refused, or the reply was filtered) and :class:`ErrorReported` (the
body is an ``{"error": …}`` object). Each reader words them as its own failures.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

# A reply past these is refused as malformed, whatever the server meant: they bound what one model
# step can make the caller hold and run.
MAX_TOOL_CALLS = 64
MAX_ARGUMENTS_BYTES = 1024 * 1024
MAX_NAME_CHARS = 128
MAX_ID_CHARS = 256

DONE_MARKER = "[DONE]"
# OpenAI's usage keys, then the gateway's own (what its inference proxy forwards).
_USAGE_KEYS = (("prompt_tokens", "completion_tokens", "total_tokens"), ("input", "output", "totalTokens"))


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for; ``arguments`` is the JSON text it wrote (``"{}"`` for nothing)."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        """The call as chat-completions messages and chunks carry it."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Reply:
    """A complete reply: its text, the tool calls it asks for, and what the server said about it."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str  # as the server sent it; "tool_calls" or "stop" when it sent none
    usage: dict[str, int] | None  # {"input", "output", "totalTokens"} when the server counted
    response_id: str | None
    model: str | None  # the model the server says answered


class ReplyError(Exception):
    """The reply cannot be used."""


class MalformedReply(ReplyError):
    """The body does not follow the format (or passes the bounds above); ``why`` says where."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class RefusedReply(ReplyError):
    """The model refused, or the server filtered its reply; ``message`` is one line for people."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ErrorReported(ReplyError):
    """The server sent an error instead of (or in the middle of) the reply; ``body`` is the object holding it."""

    def __init__(self, body: dict[str, Any]):
        super().__init__("the server reported an error")
        self.body = body


@dataclass
class _CallDraft:
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)
    size: int = 0  # bytes of arguments so far


class StreamState:
    """What one response told so far; see the module docstring."""

    def __init__(self) -> None:
        # Pieces joined when asked for: adding to one string would copy the reply so far at every piece.
        self._parts: list[str] = []
        self._joined = 0
        self._text = ""
        self.refusal: list[str] = []
        self.finish_reason: str | None = None
        self.usage: dict[str, int] | None = None
        self.response_id: str | None = None
        self.model: str | None = None
        self.done = False  # the event stream said [DONE]
        self._drafts: list[_CallDraft] = []
        self._by_index: dict[int, _CallDraft] = {}
        self._calls: tuple[ToolCall, ...] | None = None
        self._pending: list[str] = []
        self._decode_error = ""

    @property
    def text(self) -> str:
        """The content text so far."""
        if self._joined != len(self._parts):
            self._text = "".join(self._parts)
            self._joined = len(self._parts)
        return self._text

    # --- server-sent events ---------------------------------------------------------------------

    def feed_line(self, line: str) -> str:
        """One line of the event stream (without its line break); returns the content text it completed.

        A ``data:`` line is used as soon as the data gathered so far parses as JSON (servers differ on
        blank-line separators); a blank line with unparseable data pending is malformed, and so is such data
        at the end (:meth:`end_of_stream`). ``data: [DONE]`` sets :attr:`done`.
        """
        if not line:
            if self._pending:
                raise MalformedReply(f"invalid JSON in stream event ({self._decode_error})")
            return ""
        if line.startswith(":"):
            return ""
        name, _, value = line.partition(":")
        if name != "data":
            if name in ("event", "id", "retry"):
                return ""
            raise MalformedReply(f"unexpected line in event stream: {_one_line(line, 80)}")
        self._pending.append(value.removeprefix(" "))
        data = "\n".join(self._pending)
        if data.strip() == DONE_MARKER:
            self.done = True
            self._pending.clear()
            return ""
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError as error:
            self._decode_error = error.msg
            return ""
        self._pending.clear()
        return self.feed_chunk(chunk)

    def end_of_stream(self) -> None:
        """The body ended: an event still waiting for the rest of its JSON never got it."""
        if self._pending:
            raise MalformedReply(f"invalid JSON in stream event ({self._decode_error})")

    # --- chunks and bodies ----------------------------------------------------------------------

    def feed_chunk(self, chunk: object) -> str:
        """One ``chat.completion.chunk``; returns its content text ("" when it has none)."""
        obj = self._note(chunk, what="stream event")
        choices = obj.get("choices")
        if choices is None:
            if "usage" in obj:
                return ""
            raise MalformedReply("stream event has no choices")
        if not isinstance(choices, list):
            raise MalformedReply("stream event choices is not a list")
        if not choices:
            return ""  # e.g. the trailing usage chunk of stream_options.include_usage
        return self._feed_choice(choices[0], part="delta")

    def feed_completion(self, completion: object) -> str:
        """A whole ``chat.completion`` body (a server that ignored ``stream: true``); returns its text."""
        obj = self._note(completion, what="JSON body")
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            raise MalformedReply("JSON body has no choices")
        text = self._feed_choice(choices[0], part="message")
        if self.finish_reason is None and (self._parts or self._drafts):
            self.finish_reason = "tool_calls" if self._drafts else "stop"
        return text

    def _note(self, obj: object, *, what: str) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise MalformedReply(f"{what} is not a JSON object")
        if obj.get("error"):
            raise ErrorReported(obj)
        if isinstance(obj.get("id"), str) and obj["id"] and self.response_id is None:
            self.response_id = obj["id"]
        if isinstance(obj.get("model"), str) and obj["model"]:
            self.model = obj["model"]
        usage = usage_of(obj.get("usage"))
        if usage is not None:
            self.usage = usage
        return obj

    def _feed_choice(self, choice: object, *, part: str) -> str:
        if not isinstance(choice, dict):
            raise MalformedReply("choice is not a JSON object")
        body = choice.get(part) or {}
        if not isinstance(body, dict):
            raise MalformedReply(f"choice {part} is not a JSON object")
        content = body.get("content")
        if content is not None and not isinstance(content, str):
            raise MalformedReply(f"{part} content is not a string")
        refusal = body.get("refusal")
        if isinstance(refusal, str) and refusal:
            self.refusal.append(refusal)
        self._feed_tool_calls(body.get("tool_calls"), part=part)
        finish_reason = choice.get("finish_reason")
        if isinstance(finish_reason, str) and finish_reason:
            self.finish_reason = finish_reason
        if content:
            self._parts.append(content)
            return content
        return ""

    # --- tool calls -----------------------------------------------------------------------------

    def _feed_tool_calls(self, fragments: object, *, part: str) -> None:
        if fragments is None:
            return
        if not isinstance(fragments, list):
            raise MalformedReply(f"{part} tool_calls is not a list")
        for position, fragment in enumerate(fragments):
            if not isinstance(fragment, dict):
                raise MalformedReply(f"{part} tool call is not a JSON object")
            # A message lists whole calls, in order; a delta numbers its fragments.
            self._feed_tool_call(fragment, default_index=position if part == "message" else None)

    def _feed_tool_call(self, fragment: dict[str, Any], *, default_index: int | None) -> None:
        index = fragment.get("index", default_index)
        if index is not None and (type(index) is not int or index < 0):
            raise MalformedReply("tool call index is not a non-negative integer")
        call_id = fragment.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise MalformedReply("tool call id is not a string")
        if call_id and len(call_id) > MAX_ID_CHARS:
            raise MalformedReply(f"tool call id longer than {MAX_ID_CHARS} characters")
        draft = self._draft_for(index, call_id or "")
        if call_id and not draft.id:
            draft.id = call_id
        function = fragment.get("function")
        if function is None:
            return
        if not isinstance(function, dict):
            raise MalformedReply("tool call function is not a JSON object")
        self._add_name(draft, function.get("name"))
        self._add_arguments(draft, function.get("arguments"))

    def _draft_for(self, index: int | None, call_id: str) -> _CallDraft:
        """The call a fragment belongs to (see the module docstring for the servers this tolerates)."""
        if index is None:
            newest = self._drafts[-1] if self._drafts else None
            if newest is not None and (not call_id or not newest.id or call_id == newest.id):
                return newest
            return self._new_draft()
        draft = self._by_index.get(index)
        if draft is None or (call_id and draft.id and call_id != draft.id):
            draft = self._new_draft()
            self._by_index[index] = draft
        return draft

    def _new_draft(self) -> _CallDraft:
        if len(self._drafts) >= MAX_TOOL_CALLS:
            raise MalformedReply(f"more than {MAX_TOOL_CALLS} tool calls in one reply")
        draft = _CallDraft()
        self._drafts.append(draft)
        return draft

    def _add_name(self, draft: _CallDraft, name: object) -> None:
        if name is None or name == "":
            return
        if not isinstance(name, str):
            raise MalformedReply("tool call name is not a string")
        if len(name) > MAX_NAME_CHARS:
            raise MalformedReply(f"tool call name longer than {MAX_NAME_CHARS} characters")
        if not draft.name:
            draft.name = name
        elif name != draft.name:
            raise MalformedReply(f"tool call {self._drafts.index(draft)} changed its name")

    def _add_arguments(self, draft: _CallDraft, arguments: object) -> None:
        if arguments is None:
            return
        if isinstance(arguments, dict):
            # Some servers send the arguments as the object itself; the tools take its JSON text.
            arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        if not isinstance(arguments, str):
            raise MalformedReply("tool call arguments is not a string")
        # "surrogatepass": a lone surrogate escape in the JSON still has a size (the tools refuse it later).
        draft.size += len(arguments.encode("utf-8", "surrogatepass"))
        if draft.size > MAX_ARGUMENTS_BYTES:
            raise MalformedReply(f"tool call arguments larger than {MAX_ARGUMENTS_BYTES} bytes")
        draft.parts.append(arguments)

    def _assembled(self) -> tuple[ToolCall, ...]:
        """The calls, once the body ended; a call whose name never came is malformed."""
        if self._calls is not None:
            return self._calls
        calls = []
        for number, draft in enumerate(self._drafts):
            if not draft.name:
                raise MalformedReply(f"tool call {number} has no name")
            arguments = "".join(draft.parts)
            calls.append(
                ToolCall(
                    # Made up once and kept: the tool message must answer the call by the same id.
                    id=draft.id or f"call_{uuid.uuid4().hex[:24]}",
                    name=draft.name,
                    arguments=arguments if arguments.strip() else "{}",
                )
            )
        self._calls = tuple(calls)
        return self._calls

    # --- the end --------------------------------------------------------------------------------

    def reply(self) -> Reply:
        """The complete reply, once the body ended cleanly ([DONE], or the server closed the stream properly).

        A reply is complete with text, or with tool calls when the server said why it stopped (or said
        [DONE]): tool calls cut off before either may have lost arguments.
        """
        calls = self._assembled()
        if not self._parts and not calls:
            if self.refusal:
                raise RefusedReply(f"model refused: {_one_line(''.join(self.refusal), 500)}")
            if self.finish_reason == "content_filter":
                raise RefusedReply("model provider blocked the reply (content_filter)")
            if self.finish_reason is None:
                raise MalformedReply("stream ended without content or finish_reason")
        if calls and self.finish_reason is None and not self.done:
            raise MalformedReply("stream ended before its tool calls were complete")
        return Reply(
            text=self.text,
            tool_calls=calls,
            finish_reason=self.finish_reason or ("tool_calls" if calls else "stop"),
            usage=self.usage,
            response_id=self.response_id,
            model=self.model,
        )


def usage_of(raw: object) -> dict[str, int] | None:
    """``{"input", "output", "totalTokens"}`` from OpenAI's ``usage`` (``prompt_tokens``, ``completion_tokens``).

    The gateway's inference proxy forwards usage already counted that way, which is kept as it is.
    """
    if not isinstance(raw, dict):
        return None
    for prompt_key, completion_key, total_key in _USAGE_KEYS:
        prompt, completion, total = raw.get(prompt_key), raw.get(completion_key), raw.get(total_key)
        if isinstance(prompt, int) and isinstance(completion, int):
            return {
                "input": prompt,
                "output": completion,
                "totalTokens": total if isinstance(total, int) else prompt + completion,
            }
    return None


def _one_line(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]
