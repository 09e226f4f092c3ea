"""The worker child: runs turns for its node host, one at a time, asking the model through the gateway.

    python -m openclaw_client.worker        (started by the node host from an installed worker bundle)

It reads JSON-line jobs on stdin and writes JSON-line events on stdout (docs/node-worker-protocol.md,
``worker.launch.v1``):

- ``{"type": "turn", "runId", "model", "messages", "inference": {"url", "token"}, "timeoutMs"?, "cwd"?,
  "tools"?}`` streams ``POST <url>`` (``{model, messages, stream: true, tools?}``, the turn's bearer token)
  and writes a ``{"type": "delta", "runId", "delta", "text"}`` per piece of the reply, then exactly one
  ``done``: ``{"status": "ok", "text", "stopReason", "toolCalls"?, "usage"?, "model"?}`` (``toolCalls``:
  ``[{"id", "name", "arguments"}]`` when the model asks for tools, ``stopReason`` then as the model said,
  usually ``"tool_calls"``), ``{"status": "aborted", "text"}`` or ``{"status": "error", "error": {"kind",
  "message"}}``. ``messages`` and ``tools`` are chat-completions messages (``tool_calls``, ``role: "tool"``)
  and ``tools`` entries.
- ``{"type": "cancel", "runId"}`` closes that turn's HTTP connection; the turn ends ``aborted``.

The child stays up for the next job (the node keeps it warm) until stdin closes. Stdlib only (it runs
from the bundle, next to nothing else), and no message it writes contains the turn's token. The reply
is folded by :mod:`openclaw_client.agent.openai_stream`, as the gateway's own provider folds a model's.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit

from .agent.openai_stream import ErrorReported, RefusedReply, Reply, ReplyError, StreamState

DEFAULT_TIMEOUT_MS = 600_000
MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_ERROR_BODY_BYTES = 64 * 1024
ERROR_DETAIL_CHARS = 300
_KIND_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz_")


class TurnFailed(Exception):
    """The model call failed; ``kind`` classifies it as the gateway's model providers do."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


class TurnCancelled(Exception):
    """The node asked to stop this turn (or the gateway aborted its run)."""


class EventWriter:
    """JSON lines on stdout, one whole line at a time (turn and control threads both write)."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            self._stream.write(line)
            self._stream.flush()


@dataclass
class TurnJob:
    run_id: str
    model: str
    messages: list[Any]
    url: str
    token: str
    timeout_ms: int
    cwd: str | None
    tools: list[dict[str, Any]] | None = None


def parse_turn(job: dict[str, Any]) -> TurnJob:
    """The turn a job line asks for; raises :class:`TurnFailed` for a job that does not say one."""
    inference = job.get("inference")
    timeout_ms = job.get("timeoutMs", DEFAULT_TIMEOUT_MS)
    if not (
        isinstance(job.get("model"), str)
        and isinstance(job.get("messages"), list)
        and isinstance(inference, dict)
        and isinstance(inference.get("url"), str)
        and isinstance(inference.get("token"), str)
        and type(timeout_ms) is int
        and timeout_ms > 0
        and (job.get("cwd") is None or isinstance(job.get("cwd"), str))
        and (job.get("tools") is None or _is_list_of_objects(job["tools"]))
    ):
        raise TurnFailed("unknown", "worker received a malformed turn job")
    return TurnJob(
        run_id=job["runId"],
        model=job["model"],
        messages=job["messages"],
        url=inference["url"],
        token=inference["token"],
        timeout_ms=timeout_ms,
        cwd=job.get("cwd"),
        tools=job.get("tools"),
    )


def _is_list_of_objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


class Turn:
    """A turn's model calls through the gateway; :meth:`cancel` may be called from another thread at any time.

    :meth:`run` is the job's one call (its ``done`` event); :meth:`ask` is one model call on any messages and
    tools, for a caller that makes several in one turn. Every call shares the turn's ``timeoutMs``.
    """

    def __init__(self, job: TurnJob, on_delta: Callable[[str, str], None]):
        self.job = job
        self.on_delta = on_delta  # (the new piece, the reply so far)
        self._state = StreamState()
        self._deadline = time.monotonic() + job.timeout_ms / 1000
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None

    @property
    def text(self) -> str:
        """The text of the current (or last) model call so far."""
        return self._state.text

    def cancel(self) -> None:
        """Stop the turn: shutting the socket down wakes a read blocked on it (closing alone would not)."""
        self._cancelled.set()
        with self._lock:
            connection = self._connection
        if connection is not None and connection.sock is not None:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)

    def run(self) -> dict[str, Any]:
        """The turn's ``done`` event (without ``type``/``runId``)."""
        try:
            reply = self.ask(self.job.messages, self.job.tools)
        except TurnCancelled:
            return {"status": "aborted", "text": self.text}
        except TurnFailed as failure:
            return _error_done(failure)
        return reply_done(reply)

    def ask(self, messages: list[Any], tools: list[dict[str, Any]] | None = None) -> Reply:
        """One model call: streams its text to ``on_delta`` and returns the whole reply, tool calls included.

        Raises :class:`TurnCancelled` when the turn was cancelled (or the gateway aborted the run), and
        :class:`TurnFailed` (whose message never contains the turn's token) when the call failed.
        """
        self._state = StreamState()
        try:
            self._check_cancelled()
            self._stream(messages, tools)
            return self._state.reply()
        except ReplyError as error:
            failure = _reply_failure(error)
        except TurnFailed as failed:
            failure = failed
        finally:
            self._close()
        if self._cancelled.is_set() or failure.kind == "aborted":  # the gateway aborted the run on its side
            raise TurnCancelled
        raise TurnFailed(failure.kind, self._redact(failure.message))

    def _check_cancelled(self) -> None:
        if self._cancelled.is_set():
            raise TurnCancelled

    def _redact(self, message: str) -> str:
        return message.replace(self.job.token, "[redacted]") if self.job.token else message

    def _close(self) -> None:
        with self._lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    # --- the HTTP exchange --------------------------------------------------------------------

    def _stream(self, messages: list[Any], tools: list[dict[str, Any]] | None) -> None:
        try:
            response = self._post(messages, tools)
            if not 200 <= response.status < 300:
                raise _http_failure(response)
            self._read_events(response)
        except TimeoutError:
            self._check_cancelled()
            raise TurnFailed("timeout", f"inference request timed out after {self.job.timeout_ms} ms") from None
        except ConnectionRefusedError:
            self._check_cancelled()
            raise TurnFailed("connection", "inference endpoint unreachable: connection refused") from None
        except (OSError, http.client.HTTPException) as error:
            self._check_cancelled()
            raise TurnFailed("connection", f"inference request failed: {_describe(error)}") from None

    def _post(self, messages: list[Any], tools: list[dict[str, Any]] | None) -> http.client.HTTPResponse:
        target = urlsplit(self.job.url)
        if target.scheme not in ("http", "https") or not target.hostname:
            raise TurnFailed("unknown", "inference URL must be http:// or https://")
        remaining = max(0.001, self._deadline - time.monotonic())
        connection: http.client.HTTPConnection
        if target.scheme == "https":
            connection = http.client.HTTPSConnection(
                target.hostname, target.port, timeout=remaining, context=ssl.create_default_context()
            )
        else:
            connection = http.client.HTTPConnection(target.hostname, target.port, timeout=remaining)
        with self._lock:
            self._connection = connection
        connection.connect()
        self._check_cancelled()
        path = target.path or "/"
        if target.query:
            path += "?" + target.query
        payload: dict[str, Any] = {"model": self.job.model, "messages": messages, "stream": True}
        if tools:
            payload["tools"] = tools
        headers = {
            "Authorization": f"Bearer {self.job.token}",
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
        }
        connection.request("POST", path, body=json.dumps(payload).encode("utf-8"), headers=headers)
        return connection.getresponse()

    def _read_events(self, response: http.client.HTTPResponse) -> None:
        """Fold the event stream until ``[DONE]``; a body that ends first is complete only when the last chunk
        said why it stopped (the gateway's proxy always ends with [DONE], so anything less was cut short)."""
        state = self._state
        while not state.done:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            sock = self._connection.sock if self._connection is not None else None
            if sock is not None:
                sock.settimeout(remaining)
            line = response.readline(MAX_LINE_BYTES + 1)
            self._check_cancelled()
            if not line:
                state.end_of_stream()
                if state.finish_reason is None:
                    raise TurnFailed("malformed", "inference stream ended before the reply was complete")
                return
            if len(line) > MAX_LINE_BYTES:
                raise TurnFailed("malformed", "inference stream has a line longer than 16 MiB")
            piece = state.feed_line(line.decode("utf-8", "replace").rstrip("\r\n"))
            if piece:
                self.on_delta(piece, state.text)


def reply_done(reply: Reply) -> dict[str, Any]:
    """A complete reply as the ``done`` event of a turn (without ``type``/``runId``)."""
    done: dict[str, Any] = {"status": "ok", "text": reply.text, "stopReason": reply.finish_reason}
    if reply.tool_calls:
        done["toolCalls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls]
    if reply.usage is not None:
        done["usage"] = reply.usage
    if reply.model is not None:
        done["model"] = reply.model
    return done


def _reply_failure(error: ReplyError) -> TurnFailed:
    """What the reply folder found wrong with the stream, as the turn's failure."""
    if isinstance(error, ErrorReported):
        return _reported_failure(error.body["error"])
    if isinstance(error, RefusedReply):
        return TurnFailed("refusal", error.message)
    return TurnFailed("malformed", f"inference stream is malformed: {error}")


def _reported_failure(error: Any) -> TurnFailed:
    """The gateway's ``{"kind", "message"}`` error (or a bare message) as a failure."""
    if isinstance(error, dict):
        kind = error.get("kind") or error.get("code") or error.get("type")
        message = error.get("message")
    else:
        kind, message = None, error
    text = _one_line(message) if isinstance(message, str) and message.strip() else "the model call failed"
    return TurnFailed(_known_kind(kind), text)


def _known_kind(kind: Any) -> str:
    """A kind name as the gateway's providers spell them (lowercase words); anything else is ``unknown``."""
    if isinstance(kind, str) and 0 < len(kind) <= 64 and set(kind) <= _KIND_CHARACTERS:
        return kind
    return "unknown"


def _http_failure(response: http.client.HTTPResponse) -> TurnFailed:
    """A non-2xx answer: the gateway's structured error when it sent one, else the status and a snippet."""
    try:
        body = response.read(MAX_ERROR_BODY_BYTES)
    except (OSError, http.client.HTTPException):
        body = b""
    text = body.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    status = response.status
    if isinstance(parsed, dict) and parsed.get("error") is not None:
        reported = _reported_failure(parsed["error"])
        kind = reported.kind if reported.kind != "unknown" else _status_kind(status)
        return TurnFailed(kind, f"inference request failed: HTTP {status}: {reported.message}")
    detail = _one_line(text) or response.reason or "no details"
    return TurnFailed(_status_kind(status), f"inference request failed: HTTP {status}: {detail}")


def _status_kind(status: int) -> str:
    if status == 429:
        return "rate_limit"
    if status in (408, 504):
        return "timeout"
    return "http"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:ERROR_DETAIL_CHARS]


def _describe(error: BaseException) -> str:
    detail = getattr(error, "strerror", None) or str(error)
    return _one_line(f"{type(error).__name__}: {detail}" if detail else type(error).__name__)


# --- the job loop ---------------------------------------------------------------------------------


class Worker:
    """Runs turns one at a time on a thread while the main thread reads jobs (so a cancel gets through)."""

    def __init__(self, writer: EventWriter):
        self._writer = writer
        self._jobs: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._current: Turn | None = None
        self._queued: set[str] = set()
        self._cancelled_early: set[str] = set()
        self._stopping = False
        self._thread = threading.Thread(target=self._run_jobs, name="worker-turns", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def handle(self, job: Any) -> None:
        """One job line from the node."""
        if not isinstance(job, dict) or not isinstance(job.get("runId"), str):
            print("worker: ignoring a job without a runId", file=sys.stderr, flush=True)
            return
        if job.get("type") == "turn":
            with self._lock:
                self._queued.add(job["runId"])
            self._jobs.put(job)
        elif job.get("type") == "cancel":
            self.cancel(job["runId"])
        else:
            print(f"worker: ignoring a job of type {job.get('type')!r}", file=sys.stderr, flush=True)

    def cancel(self, run_id: str) -> None:
        """Stop ``run_id`` if it runs or waits here; a run that already ended is left alone."""
        with self._lock:
            turn = self._current
            if turn is not None and turn.job.run_id == run_id:
                turn.cancel()
            elif run_id in self._queued:
                self._cancelled_early.add(run_id)

    def stop(self) -> None:
        """Stdin closed: abort the running turn and any waiting one, and let the process end."""
        with self._lock:
            self._stopping = True
            if self._current is not None:
                self._current.cancel()
        self._jobs.put(None)
        self._thread.join()

    def _run_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            run_id = job["runId"]
            try:
                done = self._run_one(job)
            except Exception as error:  # a bug here must still end the turn, or the node waits for its timeout
                done = _error_done(TurnFailed("unknown", f"worker failed: {_describe(error)}"))
            self._writer.write({"type": "done", "runId": run_id, **done})

    def _run_one(self, job: dict[str, Any]) -> dict[str, Any]:
        run_id = job["runId"]
        refusal: dict[str, Any] = {}
        turn: Turn | None
        try:
            turn = Turn(parse_turn(job), on_delta=lambda delta, text: self._delta(run_id, delta, text))
        except TurnFailed as failure:
            turn = None
            refusal = _error_done(failure)
        with self._lock:
            self._queued.discard(run_id)
            cancelled = run_id in self._cancelled_early or self._stopping
            self._cancelled_early.discard(run_id)
            if turn is not None and not cancelled:
                self._current = turn
        if cancelled:
            return {"status": "aborted", "text": ""}
        if turn is None:
            return refusal
        try:
            _enter(turn.job.cwd)
            return turn.run()
        except TurnFailed as failure:
            return _error_done(failure)
        finally:
            with self._lock:
                self._current = None

    def _delta(self, run_id: str, delta: str, text: str) -> None:
        self._writer.write({"type": "delta", "runId": run_id, "delta": delta, "text": text})


def _error_done(failure: TurnFailed) -> dict[str, Any]:
    return {"status": "error", "error": {"kind": failure.kind, "message": failure.message}}


def _enter(directory: str | None) -> None:
    """Work in the turn's workspace (a warm child may have served another environment before)."""
    if directory:
        try:
            os.chdir(directory)
        except OSError:
            raise TurnFailed("unknown", "the environment's workspace is not available") from None


def main() -> int:
    worker = Worker(EventWriter(sys.stdout))
    worker.start()
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                job = json.loads(line)
            except ValueError:
                print("worker: ignoring a line that is not JSON", file=sys.stderr, flush=True)
                continue
            worker.handle(job)
    finally:
        worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
