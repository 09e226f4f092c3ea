"""Model inference for worker turns, proxied through the gateway (docs/node-worker-protocol.md).

A worker child on a node asks the model through this gateway, never directly: the gateway's model
provider (and its key) stay here. The child holds a token minted for one run on one node; it is
good only while that run is running on that node's active placement. The reply streams back as
server-sent events of OpenAI chat-completion chunks, as the gateway's provider yields them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from django.db import close_old_connections

from gateway import metrics
from gateway.exceptions import Conflict
from gateway.redaction import redact_secrets
from sessions_app.model_providers import (
    Aborted,
    ChatMessage,
    Delta,
    Finish,
    ModelProviderError,
    default_model,
    get_model_provider,
)
from sessions_app.services.runs import abort_requested

from .nodes.turn_lookups import GrantedRun, granted_run
from .nodes.turn_tokens import INFERENCE_PATH as INFERENCE_PATH
from .nodes.turn_tokens import TOKEN_SALT as TOKEN_SALT
from .nodes.turn_tokens import InferenceGrant as InferenceGrant
from .nodes.turn_tokens import grant_for as grant_for
from .nodes.turn_tokens import inference_token as inference_token

logger = logging.getLogger(__name__)

ABORT_POLL_INTERVAL_S = 0.1


def running_run(grant: InferenceGrant) -> GrantedRun | None:
    """The grant's run, while it is running on an active placement on the grant's node (one query:
    every token of a node-placed turn waits for it)."""
    return granted_run(grant.run_id, grant.node_id)


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


async def completion_stream(
    grant: InferenceGrant, messages: list[ChatMessage], *, tools: list[dict[str, Any]] | None = None
) -> AsyncGenerator[bytes]:
    """The model's reply to a worker, as SSE chunks, after the grant is checked (:func:`running_run`).

    ``tools`` are offered to the model as the worker sent them. The reply's tool calls, assembled by the
    provider, come whole in the last chunk (``delta.tool_calls``, with its ``finish_reason``): the worker
    folds them as it would a model's own stream.

    One thread does both, the check and then the provider's call (one hop on every token's path):
    its first item is empty once the grant holds; a grant that does not raises :class:`Conflict`
    before anything is yielded or a model called. The call stops when the run is aborted or the
    worker hangs up (the stream is closed)."""
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    hung_up = threading.Event()
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    checked_at: list[float] = [0.0]
    aborted: list[bool] = [False]
    granted: list[GrantedRun] = []

    def should_abort() -> bool:
        now = time.monotonic()
        if not aborted[0] and now - checked_at[0] >= ABORT_POLL_INTERVAL_S:
            checked_at[0] = now
            aborted[0] = abort_requested(granted[0].run)
        return hung_up.is_set() or aborted[0]

    def put(kind: str, value: Any = None) -> None:
        loop.call_soon_threadsafe(items.put_nowait, (kind, value))

    def produce() -> None:
        try:
            run = running_run(grant)
            if run is None:
                put("refused")
                return
            granted.append(run)
            model = run.session_model or default_model()
            put("accepted", model)
            provider = get_model_provider()
            started = time.perf_counter()
            try:
                for item in provider.stream(messages, model=model, should_abort=should_abort, tools=tools):
                    put("item", item)
            finally:
                # A node turn's model call, made here for the worker: timed as a gateway turn's are.
                metrics.record_model_call(provider.name, time.perf_counter() - started)
            put("end")
        except Aborted:
            put("error", {"kind": "aborted", "message": "the turn was aborted"})
        except ModelProviderError as error:
            # The worker is told what failed, never a secret an upstream error may quote.
            put("error", {"kind": error.kind, "message": redact_secrets(error.summary)})
        except Exception:
            error_id = uuid.uuid4().hex[:12]
            logger.exception("inference for run %s failed (errorId=%s)", grant.run_id, error_id)
            put("error", {"kind": "unknown", "message": f"model call failed (errorId={error_id})"})
        finally:
            close_old_connections()  # as a database_sync_to_async hop would: this thread is the loop's

    loop.run_in_executor(None, produce)
    try:
        kind, model = await items.get()
        if kind == "refused":
            raise Conflict("inference token is not valid for a running turn on this node")
        if kind == "error":  # the check itself failed
            raise RuntimeError(f"checking the inference grant of run {grant.run_id} failed: {model}")
        yield b""
        while True:
            kind, value = await items.get()
            if kind == "item" and isinstance(value, Delta):
                yield _sse(_chunk(completion_id, model, {"content": value.text}, None))
            elif kind == "item" and isinstance(value, Finish):
                chunk = _chunk(completion_id, value.model or model, _calls_delta(value), value.stop_reason or "stop")
                if value.usage:
                    chunk["usage"] = value.usage
                yield _sse(chunk)
            elif kind == "error":
                yield _sse({"error": value})
                yield _sse("[DONE]")
                return
            elif kind == "end":
                yield _sse("[DONE]")
                return
    finally:
        hung_up.set()  # the provider thread stops at its next check


def _calls_delta(finish: Finish) -> dict[str, Any]:
    """The reply's tool calls as one ``delta.tool_calls`` (each call whole); none: an empty delta."""
    if not finish.tool_calls:
        return {}
    return {"tool_calls": [{"index": index, **call.as_openai()} for index, call in enumerate(finish.tool_calls)]}


def _chunk(completion_id: str, model: str, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
