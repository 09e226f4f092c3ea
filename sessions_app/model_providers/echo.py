"""Deterministic embedded provider: answers with the user's own text (or what follows ``Reply exactly:``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .base import Aborted, ChatMessage, Delta, Finish

REPLY_EXACTLY_MARKER = "Reply exactly:"

_CHUNK_RE = re.compile(r"\s*\S+\s*")


def echo_reply(prompt: str) -> str:
    marker_at = prompt.find(REPLY_EXACTLY_MARKER)
    if marker_at >= 0:
        return prompt[marker_at + len(REPLY_EXACTLY_MARKER) :].strip()
    return prompt


def split_chunks(text: str) -> list[str]:
    """Words with their trailing whitespace (leading whitespace stays on the first word); they concatenate to text."""
    return _CHUNK_RE.findall(text) or ([text] if text else [])


def count_words(text: str) -> int:
    return len(text.split())


class EchoProvider:
    name = "echo"

    def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        model: str,
        should_abort: Callable[[], bool],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> Iterator[Delta | Finish]:
        """Echo never calls a tool: ``tools`` are accepted and ignored."""
        prompt = next((m.content for m in reversed(messages) if m.role == "user"), "")
        reply = echo_reply(prompt)
        for chunk in split_chunks(reply):
            if should_abort():
                raise Aborted()
            yield Delta(text=chunk)
        # "input" counts every message sent (the whole context), like a real provider's prompt tokens.
        input_words = sum(count_words(m.content) for m in messages)
        output_words = count_words(reply)
        yield Finish(
            stop_reason="stop",
            usage={"input": input_words, "output": output_words, "totalTokens": input_words + output_words},
            response_id=None,
            model=model,
        )
