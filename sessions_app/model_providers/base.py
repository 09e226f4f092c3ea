"""The model-provider contract the turn runner streams replies through."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from openclaw_client.agent.openai_stream import ToolCall

ModelProviderErrorKind = Literal[
    "timeout", "rate_limit", "http", "connection", "malformed", "context_length", "refusal", "unknown"
]


@dataclass(frozen=True)
class ChatMessage:
    """One message of the model's context, in the chat-completions roles.

    An assistant message may carry the ``tool_calls`` it made (its ``content`` may then be ""); a ``tool``
    message answers one of them by ``tool_call_id``. ``name`` is sent when set.
    """

    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        # A message a chat-completions API would refuse is the caller's bug: say so here, not as an HTTP 400.
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"only an assistant message carries tool calls, not a {self.role!r} one")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message, and only a tool message, answers a tool_call_id")


@dataclass(frozen=True)
class Delta:
    text: str  # a non-empty chunk of assistant text


@dataclass(frozen=True)
class Finish:
    stop_reason: str  # "stop", "length", ... as the provider reports it; "stop" for echo
    usage: dict | None  # {"input": int, "output": int, "totalTokens": int} when known
    response_id: str | None
    model: str  # the model that actually answered (response "model" field, else the requested one)
    tool_calls: tuple[ToolCall, ...] = ()  # what the model asks to run (none: the reply is the final answer)


class ModelProviderError(Exception):
    """A failed model call; ``summary`` is one readable line for operators and ``kind`` classifies it."""

    def __init__(self, summary: str, *, kind: ModelProviderErrorKind = "unknown") -> None:
        super().__init__(summary)
        self.summary = summary
        self.kind: ModelProviderErrorKind = kind

    def __repr__(self) -> str:
        return f"ModelProviderError({self.summary!r}, kind={self.kind!r})"

    def __reduce__(self) -> tuple[object, ...]:
        # Keep ``kind`` across pickling (Celery results, multiprocessing); the default only replays ``args``.
        return (_restore_provider_error, (self.summary, self.kind))


def _restore_provider_error(summary: str, kind: ModelProviderErrorKind) -> ModelProviderError:
    return ModelProviderError(summary, kind=kind)


class Aborted(Exception):
    """The caller asked to stop (should_abort() returned True)."""


class ModelProvider(Protocol):
    name: str  # "echo" or "openai"

    def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        model: str,
        should_abort: Callable[[], bool],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> Iterator[Delta | Finish]:
        """Yields Delta chunks then exactly one Finish (last), which carries the tool calls of the reply.

        ``tools`` are chat-completions ``tools`` entries (``{"type": "function", "function": {...}}``), offered
        to the model as they are; none (or an empty list) offers none.

        Raises ModelProviderError on failure, Aborted when should_abort() became true (the caller keeps the text it
        already received). should_abort() is only ever called on the thread that iterates the stream.
        """
        ...
