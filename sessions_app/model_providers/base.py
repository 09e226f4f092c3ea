"""The model-provider contract the turn runner streams replies through."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

ModelProviderErrorKind = Literal[
    "timeout", "rate_limit", "http", "connection", "malformed", "context_length", "refusal", "unknown"
]


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class Delta:
    text: str  # a non-empty chunk of assistant text


@dataclass(frozen=True)
class Finish:
    stop_reason: str  # "stop", "length", ... as the provider reports it; "stop" for echo
    usage: dict | None  # {"input": int, "output": int, "totalTokens": int} when known
    response_id: str | None
    model: str  # the model that actually answered (response "model" field, else the requested one)


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
        self, messages: Sequence[ChatMessage], *, model: str, should_abort: Callable[[], bool]
    ) -> Iterator[Delta | Finish]:
        """Yields Delta chunks then exactly one Finish (last).

        Raises ModelProviderError on failure, Aborted when should_abort() became true (the caller keeps the text it
        already received). should_abort() is only ever called on the thread that iterates the stream.
        """
        ...
