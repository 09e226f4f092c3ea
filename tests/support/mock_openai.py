"""A real OpenAI-compatible HTTP server (``POST /v1/chat/completions``) for tests. Standard library only.

In-process (pytest)::

    mock = MockOpenAI().start()            # 127.0.0.1, free port, background thread
    mock.script(reply("hi"), error(500, "boom"))   # one behaviour per request, then echo()
    ... settings.OPENCLAW_MODEL["BASE_URL"] = mock.base_url ...
    mock.stop()

Other processes (gateway, Celery) reach it through its URL like any server. As a standalone process::

    python tests/support/mock_openai.py --port 0   # prints MOCK_OPENAI_URL=http://127.0.0.1:<port>/v1, serves echo()

A standalone mock is scripted and inspected over HTTP: ``POST /_mock/script`` with
``{"behaviours": [{"kind": "reply", "text": "hi"}, {"kind": "error", "status": 429}]}`` (keyword arguments of the
behaviour constructors below), ``GET /_mock/requests`` (bodies and headers received), ``POST /_mock/reset``.

Hold markers keep a turn running for as long as a test needs: after ``POST /_mock/hold`` with
``{"markers": ["HOLD-A"]}``, a request whose last user message contains ``HOLD-A`` is answered only
once ``POST /_mock/release`` with ``{"marker": "HOLD-A"}`` (or ``{"all": true}``) arrives;
``GET /_mock/held`` lists the markers whose requests are waiting now.

Tool-call plans script a whole agent loop from the transcript alone, so they hold across gateway processes,
retries and restarts (the mock keeps no state for them). When the newest user message contains ``TOOL_PLAN:``
followed by a JSON object, the echo behaviour (the default) answers from that plan instead of echoing::

    TOOL_PLAN: {"steps": [{"calls": [{"name": "write", "arguments": {"path": "a.txt", "content": "hi"}}]},
                          {"calls": [{"name": "read", "arguments": {"path": "a.txt"}},
                                     {"name": "no_such_tool", "arguments": "{not json"}]}],
                "final": "done: {last_tool_result}"}

The mock counts the assistant messages with ``tool_calls`` that follow that user message in the request's
``messages`` (each is a step already taken) and answers with the next step's calls, or, once every step is
taken, with ``final`` as the text (default ``"done"``). Call ids are ``call_<step>_<i>`` (both from 0) unless a
call names its ``"id"``. In ``final``, ``{last_tool_result}`` is the content of the last ``role: "tool"`` message
after the plan's user message and ``{tool_result:<call id>}`` that of the one answering ``<call id>`` ("" when
there is none). A call's ``"arguments"`` is an object (sent as its JSON text), or a string sent as it is (to send
malformed JSON on purpose); any ``"name"`` is sent, known to the caller or not. A step's ``"text"`` is assistant
content sent before its calls. Options of a step (or of the whole plan, as defaults for every step; ``json`` of
the plan applies to its final answer too):

- ``"stream_chunks": N`` (default 3): each call's arguments in N pieces, after a first fragment with its id,
  type and name (as OpenAI streams them); ``1`` sends each whole call in one fragment;
- ``"repeat_ids": true``: every fragment repeats the call's id, type and name;
- ``"json": true``: a ``chat.completion`` body instead of a stream (also what a request without ``stream: true``,
  or an ``echo(stream=False)`` behaviour, gets);
- ``"finish_reason"``: instead of ``"tool_calls"``; ``null`` sends none (the stream still ends with [DONE]).

A plan the mock cannot read is answered with HTTP 400 ``bad TOOL_PLAN: <why>`` (code ``invalid_plan``).
Scripted behaviours still come first, and hold markers hold a plan's requests too: a plan answers where echo
would (echo's ``chunk_words`` and ``delay_s`` do not apply to it).

Streamed replies use chunked transfer encoding, so a dropped stream (``partial_then_drop``, ``hang`` ending) is an
incomplete HTTP body the client can tell apart from a clean end. Waits (delays, hangs) end early when the client
disconnects or the server stops, so ``stop()`` returns promptly and no handler thread outlives its client by more
than ~50 ms.
"""

from __future__ import annotations

import argparse
import json
import re
import select
import signal
import socket
import socketserver
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

REPLY_EXACTLY_MARKER = "Reply exactly:"
PLAN_MARKER = "TOOL_PLAN:"
DEFAULT_STREAM_CHUNKS = 3
DEFAULT_FINAL = "done"
DEFAULT_MODEL = "mock-model"
_CHUNK_RE = re.compile(r"\s*\S+\s*")
_IDLE_POLL_S = 0.05
_RESULT_PLACEHOLDER_RE = re.compile(r"\{(last_tool_result|tool_result:[^{}]*)\}")


@dataclass(frozen=True)
class Behaviour:
    kind: str
    options: dict[str, Any] = field(default_factory=dict)


def echo(stream: bool = True, chunk_words: int = 1, delay_s: float = 0.0) -> Behaviour:
    """Reply like the echo provider ("Reply exactly: X" -> X, else the last user message)."""
    return Behaviour("echo", {"stream": stream, "chunk_words": chunk_words, "delay_s": delay_s})


def reply(
    text: str, stream: bool = True, delay_s: float = 0.0, *, chunk_words: int = 1, model: str | None = None
) -> Behaviour:
    """A fixed reply; ``model`` overrides the response's "model" field (default: the requested model)."""
    return Behaviour(
        "reply", {"text": text, "stream": stream, "delay_s": delay_s, "chunk_words": chunk_words, "model": model}
    )


def error(status: int, message: str = "mock error", code: str | None = None) -> Behaviour:
    return Behaviour("error", {"status": status, "message": message, "code": code})


def hang(seconds: float) -> Behaviour:
    """200 text/event-stream headers, then silence for ``seconds``, then a dropped connection."""
    return Behaviour("hang", {"seconds": seconds})


def hang_before_headers(seconds: float) -> Behaviour:
    """Nothing at all for ``seconds``, then the connection closes without a response."""
    return Behaviour("hang_before_headers", {"seconds": seconds})


def malformed(body: str = "data: {not json\n\n") -> Behaviour:
    """200 text/event-stream with ``body`` as the complete (cleanly ended) response body."""
    return Behaviour("malformed", {"body": body})


def partial_then_drop(
    text_before: str = "Hello ",
    *,
    clean: bool = False,
    finish_reason: str | None = None,
    tool_calls: list[dict[str, str]] | None = None,
) -> Behaviour:
    """Stream ``text_before`` without [DONE] (and without finish_reason unless given), then end.

    ``tool_calls`` (``[{"id", "name", "arguments"}]``) follow the text, each whole in one fragment.
    ``clean=False``: close the connection in the middle of the chunked body (abrupt drop).
    ``clean=True``: end the HTTP body properly (the server just never said it was done).
    """
    return Behaviour(
        "partial_then_drop",
        {"text_before": text_before, "clean": clean, "finish_reason": finish_reason, "tool_calls": tool_calls or []},
    )


def raw(body: str, status: int = 200, content_type: str = "application/json") -> Behaviour:
    """Any status and body, sent with a Content-Length (e.g. an HTML 502 page, an odd JSON shape, a custom SSE)."""
    return Behaviour("raw", {"body": body, "status": status, "content_type": content_type})


def slow(text: str, delay_s: float) -> Behaviour:
    """Stream ``text`` word by word with ``delay_s`` between words."""
    return reply(text, stream=True, delay_s=delay_s)


BEHAVIOURS = {
    "echo": echo,
    "reply": reply,
    "error": error,
    "hang": hang,
    "hang_before_headers": hang_before_headers,
    "malformed": malformed,
    "partial_then_drop": partial_then_drop,
    "raw": raw,
    "slow": slow,
}


def echo_text(prompt: str) -> str:
    marker_at = prompt.find(REPLY_EXACTLY_MARKER)
    if marker_at >= 0:
        return prompt[marker_at + len(REPLY_EXACTLY_MARKER) :].strip()
    return prompt


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


def _pieces(text: str, words_per_piece: int) -> list[str]:
    words = _CHUNK_RE.findall(text) or ([text] if text else [])
    step = max(1, words_per_piece)
    return ["".join(words[i : i + step]) for i in range(0, len(words), step)]


class PlanError(ValueError):
    """A ``TOOL_PLAN`` the mock cannot follow."""


@dataclass(frozen=True)
class PlanAnswer:
    """What a plan says to answer now: one step's calls, or (``calls`` None) the final text."""

    calls: list[dict[str, Any]] | None
    text: str
    step: int
    options: dict[str, Any]


def plan_answer(body: dict[str, Any]) -> PlanAnswer | None:
    """The answer the newest user message's ``TOOL_PLAN`` gives to this transcript (None: no plan)."""
    messages = _messages(body)
    user_at = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), None)
    if user_at is None:
        return None
    text = _content_text(messages[user_at].get("content"))
    at = text.find(PLAN_MARKER)
    if at < 0:
        return None
    start = at + len(PLAN_MARKER)
    while start < len(text) and text[start].isspace():
        start += 1
    try:
        plan, _end = json.JSONDecoder().raw_decode(text, start)
    except ValueError as exc:
        raise PlanError(f"not JSON ({exc})") from None
    steps, final, defaults = _checked_plan(plan)
    after = messages[user_at + 1 :]
    taken = sum(1 for m in after if m.get("role") == "assistant" and m.get("tool_calls"))
    if taken < len(steps):
        step = steps[taken]
        options = {**defaults, **{k: v for k, v in step.items() if k in _STEP_OPTIONS}}
        return PlanAnswer(calls=step["calls"], text=step.get("text", ""), step=taken, options=options)
    return PlanAnswer(calls=None, text=_with_results(final, after), step=taken, options=defaults)


_STEP_OPTIONS = ("stream_chunks", "repeat_ids", "json", "finish_reason")


def _checked_plan(plan: Any) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
    if not isinstance(plan, dict):
        raise PlanError("the plan is not a JSON object")
    steps = plan.get("steps", [])
    final = plan.get("final", DEFAULT_FINAL)
    if not isinstance(steps, list) or not isinstance(final, str):
        raise PlanError('"steps" must be a list and "final" a string')
    for number, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("calls"), list) or not step["calls"]:
            raise PlanError(f'step {number} needs a non-empty list of "calls"')
        if not isinstance(step.get("text", ""), str):
            raise PlanError(f'step {number}: "text" must be a string')
        _check_options(step, f"step {number}")
        for call in step["calls"]:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise PlanError(f'step {number}: every call needs a "name"')
            if not isinstance(call.get("arguments", {}), dict | str) or not isinstance(call.get("id", ""), str):
                raise PlanError(f'step {number}: "arguments" must be an object or a string, "id" a string')
    defaults = {k: v for k, v in plan.items() if k in _STEP_OPTIONS}
    _check_options(defaults, "the plan")
    return steps, final, defaults


def _check_options(options: dict[str, Any], where: str) -> None:
    chunks = options.get("stream_chunks", DEFAULT_STREAM_CHUNKS)
    if type(chunks) is not int or chunks < 1:
        raise PlanError(f'{where}: "stream_chunks" must be a positive integer')
    if not isinstance(options.get("repeat_ids", False), bool) or not isinstance(options.get("json", False), bool):
        raise PlanError(f'{where}: "repeat_ids" and "json" must be booleans')
    if not isinstance(options.get("finish_reason", ""), str | None):
        raise PlanError(f'{where}: "finish_reason" must be a string or null')


def _with_results(final: str, after: list[dict[str, Any]]) -> str:
    results = [m for m in after if m.get("role") == "tool"]
    by_id = {m.get("tool_call_id"): _content_text(m.get("content")) for m in results}
    last = _content_text(results[-1].get("content")) if results else ""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        return last if name == "last_tool_result" else by_id.get(name.removeprefix("tool_result:"), "")

    return _RESULT_PLACEHOLDER_RE.sub(value, final)


def _arguments_text(call: dict[str, Any]) -> str:
    arguments = call.get("arguments", {})
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _split(text: str, parts: int) -> list[str]:
    """``text`` in ``parts`` pieces (fewer when it is shorter; one empty piece for no text)."""
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class MockOpenAI:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.requested_port = port
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []  # header names lower-cased, parallel to requests
        self._lock = threading.Lock()
        self._script: deque[Behaviour] = deque()
        self.stopping = threading.Event()
        self._hold_markers: set[str] = set()
        self._released: set[str] = set()
        self._held: dict[str, int] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MockOpenAI:
        server = _Server((self.host, self.requested_port), _Handler)
        server.mock = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="mock-openai", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(1.0)

    def __enter__(self) -> MockOpenAI:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "MockOpenAI is not started"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def script(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self._script.extend(behaviours)

    def reset(self) -> None:
        with self._lock:
            self._script.clear()
            self.requests.clear()
            self.request_headers.clear()

    def record(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        with self._lock:
            self.requests.append(body)
            self.request_headers.append(headers)

    def next_behaviour(self) -> Behaviour:
        with self._lock:
            return self._script.popleft() if self._script else echo()

    def hold(self, *markers: str) -> None:
        with self._lock:
            self._hold_markers.update(markers)
            self._released.difference_update(markers)

    def release(self, marker: str | None = None) -> None:
        with self._lock:
            self._released.update(self._hold_markers if marker is None else {marker})

    def held(self) -> list[str]:
        with self._lock:
            return sorted(marker for marker, count in self._held.items() if count > 0)

    def hold_marker_for(self, body: dict[str, Any]) -> str | None:
        users = [m for m in _messages(body) if m.get("role") == "user"]
        text = _content_text(users[-1].get("content")) if users else ""
        with self._lock:
            return next((marker for marker in sorted(self._hold_markers) if marker in text), None)

    def enter_hold(self, marker: str) -> None:
        with self._lock:
            self._held[marker] = self._held.get(marker, 0) + 1

    def leave_hold(self, marker: str) -> None:
        with self._lock:
            self._held[marker] -= 1

    def is_released(self, marker: str) -> bool:
        with self._lock:
            return marker in self._released

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": list(self.requests), "headers": list(self.request_headers)}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() must not wait for a hanging handler
    allow_reuse_address = True
    mock: MockOpenAI

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn), which can stall in sandboxes.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    verbose = False

    def log_message(self, format: str, *args: Any) -> None:
        if self.verbose:
            super().log_message(format, *args)

    @property
    def mock(self) -> MockOpenAI:
        return self.server.mock

    # --- routing ---------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/v1/models":
            self._send_json(
                200, {"object": "list", "data": [{"id": DEFAULT_MODEL, "object": "model", "owned_by": "mock"}]}
            )
        elif path == "/_mock/requests":
            self._send_json(200, self.mock.snapshot())
        elif path == "/_mock/held":
            self._send_json(200, {"held": self.mock.held()})
        else:
            self._send_error_json(404, f"no route for GET {path}", "not_found")

    def do_POST(self) -> None:
        try:
            self._post()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (abort, timeout): nothing to answer

    def _post(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/_mock/script":
            self._control_script(raw)
            return
        if path == "/_mock/reset":
            self.mock.reset()
            self._send_json(200, {"ok": True})
            return
        if path in ("/_mock/hold", "/_mock/release"):
            self._control_hold(path, raw)
            return
        if path != "/v1/chat/completions":
            self._send_error_json(404, f"no route for POST {path}", "not_found")
            return
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.mock.record(body if isinstance(body, dict) else {"_raw": raw.decode("utf-8", "replace")}, headers)
        if not isinstance(body, dict):
            self._send_error_json(400, "request body must be a JSON object", "invalid_json")
            return
        marker = self.mock.hold_marker_for(body)
        if marker is not None and not self._wait_for_release(marker):
            self.close_connection = True  # the client gave up (or the server stops) while held
            return
        self._serve(self.mock.next_behaviour(), body)

    def _wait_for_release(self, marker: str) -> bool:
        self.mock.enter_hold(marker)
        try:
            while not self.mock.is_released(marker):
                if not self._idle(_IDLE_POLL_S):
                    return False
            return True
        finally:
            self.mock.leave_hold(marker)

    def _control_hold(self, path: str, raw: bytes) -> None:
        try:
            spec = json.loads(raw or b"{}")
            if path == "/_mock/hold":
                markers = spec["markers"]
                if not isinstance(markers, list) or not all(isinstance(m, str) and m for m in markers):
                    raise ValueError("markers must be non-empty strings")
                self.mock.hold(*markers)
            elif spec.get("all") is True:
                self.mock.release()
            else:
                if not isinstance(spec.get("marker"), str):
                    raise ValueError("marker must be a string")
                self.mock.release(spec["marker"])
        except (ValueError, AttributeError, KeyError, TypeError) as exc:
            self._send_error_json(400, f"bad hold request: {exc!r}", "bad_hold")
            return
        self._send_json(200, {"ok": True})

    def _control_script(self, raw: bytes) -> None:
        try:
            specs = json.loads(raw or b"{}").get("behaviours", [])
            behaviours = [BEHAVIOURS[spec.pop("kind")](**spec) for spec in specs]
        except (ValueError, AttributeError, KeyError, TypeError) as exc:
            self._send_error_json(400, f"bad script: {exc!r}", "bad_script")
            return
        self.mock.script(*behaviours)
        self._send_json(200, {"ok": True, "queued": len(behaviours)})

    # --- behaviours ------------------------------------------------------------------------

    def _serve(self, behaviour: Behaviour, body: dict[str, Any]) -> None:
        opts = behaviour.options
        kind = behaviour.kind
        model = body.get("model") if isinstance(body.get("model"), str) and body.get("model") else DEFAULT_MODEL
        wants_stream = body.get("stream") is True
        if kind == "echo" and self._serve_plan(body, model=model, stream=opts["stream"] and wants_stream):
            return
        if kind in ("echo", "reply"):
            if kind == "echo":
                users = [m for m in _messages(body) if m.get("role") == "user"]
                text = echo_text(_content_text(users[-1].get("content")) if users else "")
            else:
                text = opts["text"]
                model = opts.get("model") or model
            if opts["stream"] and wants_stream:
                self._stream_reply(text, body, model=model, chunk_words=opts["chunk_words"], delay_s=opts["delay_s"])
            else:
                self._json_reply(text, body, model=model)
        elif kind == "error":
            self._send_error_json(opts["status"], opts["message"], opts["code"])
        elif kind == "raw":
            data = opts["body"].encode()
            self.send_response(opts["status"])
            self.send_header("Content-Type", opts["content_type"])
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True
        elif kind == "hang":
            self._start_event_stream()
            self._idle(opts["seconds"])
            self.close_connection = True  # no terminating chunk: the body is cut short
        elif kind == "hang_before_headers":
            self._idle(opts["seconds"])
            self.close_connection = True
        elif kind == "malformed":
            self._start_event_stream()
            if opts["body"]:
                self._write_chunk(opts["body"].encode())
            self._end_event_stream()
        elif kind == "partial_then_drop":
            completion = _Completion(model)
            self._start_event_stream()
            self._send_event(completion.chunk({"role": "assistant", "content": ""}))
            if opts["text_before"]:
                self._send_event(completion.chunk({"content": opts["text_before"]}))
            for index, call in enumerate(opts["tool_calls"]):
                fragment = {
                    "index": index,
                    "id": call["id"],
                    "type": "function",
                    "function": _function(call, call["arguments"]),
                }
                self._send_tool_fragment(completion, fragment)
            if opts["finish_reason"]:
                self._send_event(completion.chunk({}, finish_reason=opts["finish_reason"]))
            if opts["clean"]:
                self._end_event_stream()
            self.close_connection = True
        else:
            raise ValueError(f"unknown behaviour {kind!r}")

    def _serve_plan(self, body: dict[str, Any], *, model: str, stream: bool) -> bool:
        """Answer from the transcript's ``TOOL_PLAN`` (module docstring); False when there is none."""
        try:
            answer = plan_answer(body)
        except PlanError as exc:
            self._send_error_json(400, f"bad TOOL_PLAN: {exc}", "invalid_plan")
            return True
        if answer is None:
            return False
        stream = stream and not answer.options.get("json", False)
        if answer.calls is None:
            if stream:
                self._stream_reply(answer.text, body, model=model, chunk_words=1, delay_s=0.0)
            else:
                self._json_reply(answer.text, body, model=model)
            return True
        calls = [
            {
                "id": call.get("id") or f"call_{answer.step}_{number}",
                "name": call["name"],
                "arguments": _arguments_text(call),
            }
            for number, call in enumerate(answer.calls)
        ]
        finish_reason = answer.options.get("finish_reason", "tool_calls")
        usage = _usage(body, " ".join([answer.text, *(call["arguments"] for call in calls)]))
        if stream:
            self._stream_calls(answer, calls, model=model, finish_reason=finish_reason, usage=usage)
        else:
            self._json_calls(answer.text, calls, model=model, finish_reason=finish_reason, usage=usage)
        return True

    def _stream_calls(
        self,
        answer: PlanAnswer,
        calls: list[dict[str, Any]],
        *,
        model: str,
        finish_reason: str | None,
        usage: dict[str, int],
    ) -> None:
        completion = _Completion(model)
        chunks = answer.options.get("stream_chunks", DEFAULT_STREAM_CHUNKS)
        repeat_ids = answer.options.get("repeat_ids", False)
        self._start_event_stream()
        self._send_event(completion.chunk({"role": "assistant", "content": None, "refusal": None}))
        for piece in _pieces(answer.text, 1):
            self._send_event(completion.chunk({"content": piece}))
        for index, call in enumerate(calls):
            head = {"index": index, "id": call["id"], "type": "function"}
            if chunks == 1:
                self._send_tool_fragment(completion, {**head, "function": _function(call, call["arguments"])})
                continue
            self._send_tool_fragment(completion, {**head, "function": _function(call, "")})
            for piece in _split(call["arguments"], chunks):
                if repeat_ids:
                    fragment = {**head, "function": _function(call, piece)}
                else:
                    fragment = {"index": index, "function": {"arguments": piece}}
                self._send_tool_fragment(completion, fragment)
        self._send_event(completion.chunk({}, finish_reason=finish_reason, usage=usage))
        self._write_chunk(b"data: [DONE]\n\n")
        self._end_event_stream()

    def _send_tool_fragment(self, completion: _Completion, fragment: dict[str, Any]) -> None:
        self._send_event(completion.chunk({"tool_calls": [fragment]}))

    def _json_calls(
        self, text: str, calls: list[dict[str, Any]], *, model: str, finish_reason: str | None, usage: dict[str, int]
    ) -> None:
        completion = _Completion(model)
        message = {
            "role": "assistant",
            "content": text or None,
            "refusal": None,
            "tool_calls": [
                {"id": call["id"], "type": "function", "function": _function(call, call["arguments"])} for call in calls
            ],
        }
        self._send_json(
            200,
            {
                "id": completion.id,
                "object": "chat.completion",
                "created": completion.created,
                "model": model,
                "system_fingerprint": "fp_mock",
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
                "usage": usage,
            },
        )

    def _stream_reply(self, text: str, body: dict[str, Any], *, model: str, chunk_words: int, delay_s: float) -> None:
        completion = _Completion(model)
        self._start_event_stream()
        self._send_event(completion.chunk({"role": "assistant", "content": "", "refusal": None}))
        for index, piece in enumerate(_pieces(text, chunk_words)):
            if index and delay_s and not self._idle(delay_s):
                self.close_connection = True
                return
            self._send_event(completion.chunk({"content": piece}))
        self._send_event(completion.chunk({}, finish_reason="stop", usage=_usage(body, text)))
        self._write_chunk(b"data: [DONE]\n\n")
        self._end_event_stream()

    def _json_reply(self, text: str, body: dict[str, Any], *, model: str) -> None:
        completion = _Completion(model)
        self._send_json(
            200,
            {
                "id": completion.id,
                "object": "chat.completion",
                "created": completion.created,
                "model": model,
                "system_fingerprint": "fp_mock",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "refusal": None},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": _usage(body, text),
            },
        )

    # --- wire helpers ----------------------------------------------------------------------

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _send_error_json(self, status: int, message: str, code: str | None) -> None:
        if status == 429:
            error_type = "rate_limit_error"
        elif status >= 500:
            error_type = "server_error"
        else:
            error_type = "invalid_request_error"
        self._send_json(status, {"error": {"message": message, "type": error_type, "param": None, "code": code}})

    def _start_event_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _send_event(self, payload: dict[str, Any]) -> None:
        self._write_chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")

    def _end_event_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def _idle(self, seconds: float) -> bool:
        """Wait ``seconds``; False as soon as the client disconnects or the server stops."""
        deadline = time.monotonic() + seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            if self.mock.stopping.is_set():
                return False
            readable, _, _ = select.select([self.connection], [], [], min(_IDLE_POLL_S, remaining))
            if readable:
                try:
                    if not self.connection.recv(1, socket.MSG_PEEK):
                        return False  # EOF: the client closed its side
                except OSError:
                    return False
                time.sleep(min(_IDLE_POLL_S, max(remaining, 0)))  # unread client bytes: don't spin


class _Completion:
    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model

    def chunk(
        self, delta: dict[str, Any], *, finish_reason: str | None = None, usage: dict[str, int] | None = None
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_mock",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if usage is not None:
            payload["usage"] = usage
        return payload


def _function(call: dict[str, Any], arguments: str) -> dict[str, str]:
    return {"name": call["name"], "arguments": arguments}


def _usage(body: dict[str, Any], text: str) -> dict[str, int]:
    """Word counts stand in for tokens: every message sent, and the reply."""
    prompt = sum(len(_content_text(m.get("content")).split()) for m in _messages(body))
    completion = len(text.split())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="OpenAI-compatible mock server (echo by default).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    _Handler.verbose = args.verbose
    mock = MockOpenAI(host=args.host, port=args.port).start()
    print(f"MOCK_OPENAI_URL={mock.base_url}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    finally:
        mock.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
