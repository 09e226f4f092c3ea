"""The worker child: runs turns for its node host, one at a time, asking the model through the gateway.

    python -m openclaw_client.worker        (started by the node host from an installed worker bundle)

It reads JSON-line jobs on stdin and writes JSON-line events on stdout (docs/node-worker-protocol.md,
``worker.launch.v1``):

- ``{"type": "turn", "runId", "model", "messages", "inference": {"url", "token"}, "timeoutMs"?, "cwd"?,
  "agent"?: {"maxSteps", "tools", "execTimeoutS"?, "execSlots"?: {"dir", "count"}}}`` runs the turn as an agent
  loop (:class:`AgentTurn`): each model call streams ``POST <url>`` (``{model, messages, stream: true,
  tools?}``, the turn's bearer token; ``messages`` are chat-completions messages, tool calls and results
  included), and when the model asks for tools they run in ``cwd`` (only with ``agent.tools``). It writes a
  ``{"type": "delta", "runId", "delta", "text"}`` per piece of each step's text, a ``message`` per complete
  transcript message, a ``tool`` at each tool's start and an ``approval`` question before each ``exec``,
  then exactly one ``done``: ``{"status": "ok", "text", "stopReason", "usage"?, "model"?}``, ``{"status":
  "aborted", "text"}`` or ``{"status": "error", "error": {"kind", "message"}}``.
- ``{"type": "approval", "runId", "toolCallId", "allowed", "aborted"?, "reason"?}`` answers the running
  turn's question on an ``exec``.
- ``{"type": "cancel", "runId"}`` stops that turn (its model call, a running command's process group, a
  wait for an answer); the turn ends ``aborted``.

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
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from .agent.exec_policy import Policy, PolicyDocumentError, evaluate
from .agent.loop import AgentLoop, Approval, LoopAborted, ModelReply, StepLimitReached, run_watched
from .agent.openai_stream import ErrorReported, RefusedReply, Reply, ReplyError, StreamState
from .agent.tools import ExecRequest, ExecSlots, ToolLimits, ToolResult, ToolRunner, Workspace

DEFAULT_TIMEOUT_MS = 600_000
DEFAULT_MAX_STEPS = 24
APPROVAL_POLL_S = 0.1
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


@dataclass(frozen=True)
class AgentSpec:
    """How the turn runs as an agent loop: its step limit, whether it has tools, and their bounds on this host."""

    max_steps: int = DEFAULT_MAX_STEPS
    tools: bool = False
    exec_timeout_s: float | None = None
    exec_slots_dir: str | None = None
    exec_slots: int = 1
    # The effective exec policy the gateway sent (None: every command is put to the gateway).
    exec_policy: Policy | None = None


@dataclass
class TurnJob:
    run_id: str
    model: str
    messages: list[Any]
    url: str
    token: str
    timeout_ms: int
    cwd: str | None
    agent: AgentSpec | None = None


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
        and (job.get("agent") is None or isinstance(job.get("agent"), dict))
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
        agent=_agent_spec(job["agent"]) if job.get("agent") is not None else None,
    )


def _agent_spec(raw: dict[str, Any]) -> AgentSpec:
    slots = raw.get("execSlots") or {}
    max_steps, tools = raw.get("maxSteps", DEFAULT_MAX_STEPS), raw.get("tools", False)
    exec_timeout = raw.get("execTimeoutS")
    if not (
        type(max_steps) is int
        and max_steps > 0
        and isinstance(tools, bool)
        and (exec_timeout is None or (isinstance(exec_timeout, int | float) and exec_timeout > 0))
        and isinstance(slots, dict)
        and (slots.get("dir") is None or isinstance(slots.get("dir"), str))
        and type(slots.get("count", 1)) is int
        and slots.get("count", 1) > 0
    ):
        raise TurnFailed("unknown", "worker received a malformed turn job (agent)")
    return AgentSpec(
        exec_policy=_exec_policy(raw.get("execPolicy")),
        max_steps=max_steps,
        tools=tools,
        exec_timeout_s=float(exec_timeout) if exec_timeout is not None else None,
        exec_slots_dir=slots.get("dir"),
        exec_slots=slots.get("count", 1),
    )


def _exec_policy(raw: Any) -> Policy | None:
    """The launch's exec policy; one this child cannot read leaves every decision to the gateway."""
    if raw is None:
        return None
    try:
        return Policy.from_snapshot(raw)
    except PolicyDocumentError:
        print("worker: the launch's exec policy is unreadable; the gateway decides every command", file=sys.stderr)
        return None


class Turn:
    """A turn's model calls through the gateway; :meth:`cancel` may be called from another thread at any time.

    :meth:`ask` is one model call on any messages and tools (the agent loop makes one per step); every call
    shares the turn's ``timeoutMs``.
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


# --- the agent loop ---------------------------------------------------------------------------------


class AgentTurn:
    """A turn as an agent loop in this child: the model asked through the gateway, the tools run here.

    The loop's hooks write what the gateway keeps and shows as events on stdout: each step's complete
    messages (``{"type": "message", "key", "message", "fullText"?}``), a tool's start
    (``{"type": "tool", "phase": "start", …}``), and a question on an ``exec`` (``{"type": "approval",
    "toolCallId", "command", "workdir", "envKeys", "timeoutS"}``), whose answer arrives on stdin
    (:meth:`answer`) while the turn waits. :meth:`cancel` (another thread) stops the model call, a running
    command (its whole process group) and a wait for an answer.
    """

    def __init__(self, job: TurnJob, writer: EventWriter):
        self.job = job
        self.agent = job.agent or AgentSpec()
        self.writer = writer
        self.model = Turn(job, on_delta=self._delta)
        self.cancelled = threading.Event()
        self.text = ""  # the current step's text (an aborted turn keeps it)
        self.step = 0
        self.results = 0
        self._answers: dict[str, queue.SimpleQueue[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def cancel(self) -> None:
        self.cancelled.set()
        self.model.cancel()

    def answer(self, message: dict[str, Any]) -> None:
        """The gateway's decision on an exec this turn asked about."""
        call_id = message.get("toolCallId")
        with self._lock:
            waiting = self._answers.get(call_id) if isinstance(call_id, str) else None
        if waiting is not None:
            waiting.put(message)

    def run(self) -> dict[str, Any]:
        """The turn's ``done`` event (without ``type``/``runId``)."""
        loop = AgentLoop(self, self._tool_runner(), max_steps=self.agent.max_steps)
        try:
            outcome = loop.run(list(self.job.messages))
        except (TurnCancelled, LoopAborted):
            return {"status": "aborted", "text": self.text}
        except StepLimitReached as limit:
            return _error_done(TurnFailed("step_limit", str(limit)))
        except TurnFailed as failure:
            return _error_done(failure)
        done: dict[str, Any] = {"status": "ok", "text": outcome.text, "stopReason": outcome.stop_reason}
        if outcome.usage is not None:
            done["usage"] = outcome.usage
        if outcome.model is not None:
            done["model"] = outcome.model
        return done

    def _tool_runner(self) -> ToolRunner | None:
        if not self.agent.tools or not self.job.cwd:
            return None
        defaults = ToolLimits()
        exec_timeout = self.agent.exec_timeout_s or defaults.exec_timeout_s
        limits = ToolLimits(
            exec_timeout_s=exec_timeout, exec_max_timeout_s=max(exec_timeout, defaults.exec_max_timeout_s)
        )
        slots = ExecSlots(Path(self.agent.exec_slots_dir), self.agent.exec_slots) if self.agent.exec_slots_dir else None
        try:
            return ToolRunner(Workspace(self.job.cwd), limits=limits, exec_slots=slots)
        except OSError:
            return None  # no workspace here: the model is offered no tools

    # --- the loop's hooks -----------------------------------------------------------------------

    def model_step(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], step: int) -> ModelReply:
        self.step, self.results, self.text = step, 0, ""
        reply = self.model.ask(messages, tools or None)
        return ModelReply(
            text=reply.text,
            tool_calls=reply.tool_calls,
            stop_reason=reply.finish_reason,
            usage=reply.usage,
            model=reply.model,
        )

    def record_message(self, message: dict[str, Any], full_text: str | None) -> dict[str, Any]:
        if message.get("role") == "toolResult":
            self.results += 1
            key = f"s{self.step}.r{self.results}"
        else:
            key = f"s{self.step}.a"
        event: dict[str, Any] = {"type": "message", "runId": self.job.run_id, "key": key, "message": message}
        if full_text is not None:
            event["fullText"] = full_text
        self.writer.write(event)
        return message

    def tool_started(self, call_id: str, name: str, arguments: dict[str, Any]) -> None:
        self.writer.write(
            {
                "type": "tool",
                "runId": self.job.run_id,
                "phase": "start",
                "toolCallId": call_id,
                "name": name,
                "args": arguments,
            }
        )

    def tool_finished(self, call_id: str, name: str, message: dict[str, Any]) -> None:
        """Nothing to add: the gateway shows the result from the step's message."""

    def approve_exec(self, call_id: str, request: ExecRequest) -> Approval:
        policy = self.agent.exec_policy
        if policy is not None:
            # Bare command names resolve on this host's PATH (the one the command itself runs with).
            verdict = evaluate(policy, request.command, request.workdir)
            if verdict.decision == "allow":
                return Approval(True)
            if verdict.decision == "deny":
                return Approval(False, f"exec denied: {verdict.reason}")
        return self._ask_gateway(call_id, request)

    def _ask_gateway(self, call_id: str, request: ExecRequest) -> Approval:
        answers: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        with self._lock:
            self._answers[call_id] = answers
        try:
            self.writer.write(
                {
                    "type": "approval",
                    "runId": self.job.run_id,
                    "toolCallId": call_id,
                    "command": request.command,
                    "workdir": request.workdir,
                    "envKeys": list(request.env_keys),
                    "timeoutS": request.timeout_s,
                }
            )
            while not self.cancelled.is_set():
                try:
                    answer = answers.get(timeout=APPROVAL_POLL_S)
                except queue.Empty:
                    continue
                return Approval(
                    allowed=answer.get("allowed") is True,
                    reason=str(answer.get("reason") or ""),
                    aborted=answer.get("aborted") is True,
                )
            return Approval(False, "not run: the turn was aborted", aborted=True)
        finally:
            with self._lock:
                self._answers.pop(call_id, None)

    def wait_for(self, work: Callable[[], ToolResult], cancel: threading.Event) -> ToolResult:
        return run_watched(work, cancel, self.cancelled.is_set)

    def should_abort(self) -> bool:
        return self.cancelled.is_set()

    def _delta(self, delta: str, text: str) -> None:
        self.text = text
        self.writer.write({"type": "delta", "runId": self.job.run_id, "delta": delta, "text": text})


# --- the job loop ---------------------------------------------------------------------------------


class Worker:
    """Runs turns one at a time on a thread while the main thread reads jobs (so a cancel gets through)."""

    def __init__(self, writer: EventWriter):
        self._writer = writer
        self._jobs: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._current: AgentTurn | None = None
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
        elif job.get("type") == "approval":
            self.answer(job)
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

    def answer(self, message: dict[str, Any]) -> None:
        """The gateway's answer to a question of the running turn; one for a turn that ended is dropped."""
        with self._lock:
            turn = self._current
            if turn is not None and turn.job.run_id == message["runId"]:
                turn.answer(message)

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
        turn: AgentTurn | None
        try:
            turn = AgentTurn(parse_turn(job), self._writer)
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
