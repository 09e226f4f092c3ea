"""OpenAI-compatible ``POST {base_url}/chat/completions`` streaming provider (httpx, synchronous).

Threading: the HTTP exchange runs on one short-lived worker thread that pushes Delta/Finish/ModelProviderError items
into a queue; the caller's thread (the one iterating ``stream()``) polls ``should_abort()`` and the total deadline
every 100 ms while it waits for the next item. On abort or deadline the caller's thread shuts the worker's socket
down (which wakes a blocked read at once, unlike ``close()``) and joins the worker before raising. So
``should_abort()`` never runs on a foreign thread (it may use the ORM), and a hung server cannot delay an abort.
"""

from __future__ import annotations

import functools
import json
import logging
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import certifi
import httpx

from openclaw_client.agent.openai_stream import ErrorReported, RefusedReply, ReplyError, StreamState

from .base import Aborted, ChatMessage, Delta, Finish, ModelProviderError, ModelProviderErrorKind


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One verifying SSL context per process: building one (CA bundle load) costs ~16 ms per turn."""
    return ssl.create_default_context(cafile=certifi.where())


logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.1
# After an abort the worker normally exits within milliseconds; it can only outlive this while it is still
# inside a TCP connect / DNS lookup, which no socket shutdown can interrupt (bounded by the connect timeout).
WORKER_JOIN_S = 2.0
MAX_JSON_BODY_BYTES = 16 * 1024 * 1024
MAX_ERROR_BODY_BYTES = 64 * 1024
WORKER_THREAD_NAME = "openclaw-model-stream"


@dataclass(frozen=True)
class OpenAICompatConfig:
    base_url: str
    api_key: str = ""
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    total_timeout_s: float = 600.0

    @classmethod
    def from_settings(cls, conf: Mapping[str, Any]) -> OpenAICompatConfig:
        return cls(
            base_url=str(conf.get("BASE_URL") or "").strip().rstrip("/"),
            api_key=str(conf.get("API_KEY") or "").strip(),
            connect_timeout_s=float(conf.get("CONNECT_TIMEOUT_S", 10.0)),
            read_timeout_s=float(conf.get("READ_TIMEOUT_S", 60.0)),
            total_timeout_s=float(conf.get("TOTAL_TIMEOUT_S", 600.0)),
        )


class OpenAICompatProvider:
    name = "openai"

    def __init__(self, config: OpenAICompatConfig) -> None:
        self.config = config

    def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        model: str,
        should_abort: Callable[[], bool],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> Iterator[Delta | Finish]:
        if not self.config.base_url:
            raise ModelProviderError("model provider base URL is not set (OPENCLAW_MODEL_BASE_URL)", kind="unknown")
        payload: dict[str, Any] = {
            "model": model,
            "messages": [_message_json(m) for m in messages],
            "stream": True,
        }
        if tools:
            payload["tools"] = list(tools)
            payload["tool_choice"] = "auto"
        exchange = _Exchange(self.config, payload=payload, requested_model=model)
        deadline = time.monotonic() + self.config.total_timeout_s
        exchange.start()
        try:
            while True:
                if should_abort():
                    raise Aborted()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _timed_out(self.config.total_timeout_s)
                try:
                    item = exchange.events.get(timeout=min(POLL_INTERVAL_S, remaining))
                except queue.Empty:
                    continue
                if isinstance(item, Delta):
                    yield item
                elif isinstance(item, Finish):
                    exchange.close()
                    yield item
                    return
                else:
                    raise item
        finally:
            exchange.close()


class _Stopped(Exception):
    """The consumer went away (abort, deadline, generator closed): drop the exchange silently."""


class _Exchange:
    """One HTTP call on a worker thread; see the module docstring for the threading model."""

    def __init__(self, config: OpenAICompatConfig, *, payload: dict[str, Any], requested_model: str) -> None:
        self.config = config
        self.payload = payload
        self.requested_model = requested_model
        self.events: queue.SimpleQueue[Delta | Finish | ModelProviderError] = queue.SimpleQueue()
        self._stop = threading.Event()
        # Guards _network_stream between the worker (which sets it) and close() (which shuts its socket down).
        self._lock = threading.Lock()
        self._network_stream: Any = None
        self._thread = threading.Thread(target=self._run, name=WORKER_THREAD_NAME, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if not self._thread.is_alive():
            return
        self._shutdown_socket()
        self._thread.join(WORKER_JOIN_S)
        if self._thread.is_alive():
            logger.warning("model stream worker is still connecting; it exits when the connect attempt ends")

    def _shutdown_socket(self) -> None:
        with self._lock:
            stream = self._network_stream
            if stream is None:
                return
            sock = stream.get_extra_info("socket")
            if sock is None:
                return
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the worker

    def _trace(self, event_name: str, info: dict[str, Any]) -> None:
        """httpcore trace hook (worker thread): remember the socket as soon as it exists."""
        if event_name.endswith((".connect_tcp.complete", ".start_tls.complete")):
            with self._lock:
                self._network_stream = info.get("return_value")
            if self._stop.is_set():
                self._shutdown_socket()

    def _run(self) -> None:
        outcome: Finish | ModelProviderError
        try:
            outcome = self._call()
        except _Stopped:
            return
        except ModelProviderError as exc:
            outcome = exc
        except ReplyError as exc:
            outcome = _reply_error(exc)
        except Exception as exc:
            # A bug in this module or httpx, not a provider failure: keep the traceback, fail the turn.
            logger.exception("model provider call failed unexpectedly")
            outcome = ModelProviderError(f"model provider call failed: {type(exc).__name__}: {exc}", kind="unknown")
        finally:
            with self._lock:
                self._network_stream = None
        self.events.put(outcome)

    def _call(self) -> Finish:
        cfg = self.config
        timeout = httpx.Timeout(
            connect=cfg.connect_timeout_s, read=cfg.read_timeout_s, write=cfg.read_timeout_s, pool=cfg.connect_timeout_s
        )
        headers = {"Accept": "text/event-stream, application/json"}
        if cfg.api_key:
            headers["Authorization"] = f"Bearer {cfg.api_key}"
        state = StreamState()
        headers_received = False
        try:
            with (
                httpx.Client(timeout=timeout, headers=headers, verify=_ssl_context()) as client,
                client.stream(
                    "POST", f"{cfg.base_url}/chat/completions", json=self.payload, extensions={"trace": self._trace}
                ) as response,
            ):
                headers_received = True
                if response.status_code >= 400:
                    raise self._http_error(response)
                if "json" in response.headers.get("content-type", "").lower():
                    return self._read_completion(response, state)
                return self._read_event_stream(response, state)
        except httpx.ConnectTimeout:
            self._raise_if_stopped()
            raise ModelProviderError(
                f"model provider unreachable: connect timed out after {_seconds(cfg.connect_timeout_s)} s",
                kind="connection",
            ) from None
        except httpx.ConnectError as exc:
            self._raise_if_stopped()
            raise ModelProviderError(f"model provider unreachable: {_describe(exc)}", kind="connection") from None
        except httpx.TimeoutException:
            self._raise_if_stopped()
            raise _timed_out(cfg.read_timeout_s) from None
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            self._raise_if_stopped()
            if not headers_received:
                raise ModelProviderError(
                    f"model provider closed the connection without a response: {_describe(exc)}", kind="connection"
                ) from None
            if state.finish_reason is not None:
                # The reply was complete; only the trailing usage chunk / [DONE] got lost.
                return self._finish(state)
            raise ModelProviderError(
                f"model provider connection dropped mid-stream: {_describe(exc)}", kind="connection"
            ) from None
        except httpx.DecodingError as exc:
            raise _malformed(f"undecodable body ({_describe(exc)})") from None
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise ModelProviderError(f"model provider base URL is invalid: {_describe(exc)}", kind="unknown") from None
        except httpx.HTTPError as exc:
            self._raise_if_stopped()
            raise ModelProviderError(f"model provider request failed: {_describe(exc)}", kind="connection") from None

    def _raise_if_stopped(self) -> None:
        if self._stop.is_set():
            raise _Stopped()

    def _read_event_stream(self, response: httpx.Response, state: StreamState) -> Finish:
        """Server-Sent Events, folded by the shared :class:`StreamState` (its docstring has the rules)."""
        for line in response.iter_lines():
            self._raise_if_stopped()
            text = state.feed_line(line)
            if text:
                self.events.put(Delta(text=text))
            if state.done:
                break
        state.end_of_stream()
        return self._finish(state)

    def _read_completion(self, response: httpx.Response, state: StreamState) -> Finish:
        """A plain ``chat.completion`` JSON body (the server ignored ``stream: true``)."""
        body, truncated = self._read_limited(response, MAX_JSON_BODY_BYTES)
        if truncated:
            raise _malformed(f"JSON body larger than {MAX_JSON_BODY_BYTES} bytes")
        try:
            completion = json.loads(body)
        except json.JSONDecodeError as exc:
            raise _malformed(f"invalid JSON body ({exc.msg})") from None
        except UnicodeDecodeError:
            raise _malformed("JSON body is not UTF-8") from None
        text = state.feed_completion(completion)
        if text:
            self.events.put(Delta(text=text))
        return self._finish(state)

    def _finish(self, state: StreamState) -> Finish:
        """The terminal item, once the body ended cleanly ([DONE], or the server closed the stream properly)."""
        reply = state.reply()
        return Finish(
            stop_reason=reply.finish_reason,
            usage=reply.usage,
            response_id=reply.response_id,
            model=reply.model or self.requested_model,
            tool_calls=reply.tool_calls,
        )

    def _read_limited(self, response: httpx.Response, limit: int) -> tuple[bytes, bool]:
        data = bytearray()
        for piece in response.iter_bytes():
            self._raise_if_stopped()
            data += piece
            if len(data) > limit:
                return bytes(data[:limit]), True
        return bytes(data), False

    def _http_error(self, response: httpx.Response) -> ModelProviderError:
        try:
            body, _ = self._read_limited(response, MAX_ERROR_BODY_BYTES)
        except httpx.HTTPError:
            body = b""  # the status line is the useful part; don't let a broken error body hide it
        text = body.decode("utf-8", "replace")
        message, code = _error_fields(text)
        detail = _one_line(message, 1000) if message else _one_line(text[:200], 200)
        status = response.status_code
        return ModelProviderError(
            f"model provider returned HTTP {status}: {detail or response.reason_phrase or 'no details'}",
            kind=_error_kind(status=status, code=code, message=message or text),
        )


def _message_json(message: ChatMessage) -> dict[str, Any]:
    """One chat-completions message; a plain one is exactly ``{role, content}``."""
    body: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        # null, not "": what the API itself returns for a message of calls only, and servers that turn an
        # empty string into an empty text block refuse it.
        body["content"] = message.content or None
        body["tool_calls"] = [call.as_openai() for call in message.tool_calls]
    if message.tool_call_id is not None:
        body["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        body["name"] = message.name
    return body


def _reply_error(error: ReplyError) -> ModelProviderError:
    """A failure the shared reply folder found, in this provider's words."""
    if isinstance(error, RefusedReply):
        return ModelProviderError(error.message, kind="refusal")
    if isinstance(error, ErrorReported):
        message, code = _error_fields_from(error.body)
        detail = _one_line(message or json.dumps(error.body.get("error")), 1000)
        return ModelProviderError(
            f"model provider reported an error: {detail}",
            kind=_error_kind(status=None, code=code, message=message or ""),
        )
    return _malformed(str(error))  # a MalformedReply: its text is the why


def _error_fields(text: str) -> tuple[str | None, str | None]:
    try:
        obj = json.loads(text)
    except ValueError:
        return None, None
    return _error_fields_from(obj)


def _error_fields_from(obj: object) -> tuple[str | None, str | None]:
    """(message, code) from ``{"error": {"message", "code"|"type"}}`` or ``{"error": "text"}``."""
    if not isinstance(obj, dict):
        return None, None
    error = obj.get("error")
    if isinstance(error, str) and error.strip():
        return error, None
    if not isinstance(error, dict):
        return None, None
    message = error.get("message")
    code = error.get("code") or error.get("type")
    return (
        message if isinstance(message, str) and message.strip() else None,
        str(code) if code not in (None, "") else None,
    )


def _error_kind(*, status: int | None, code: str | None, message: str) -> ModelProviderErrorKind:
    text = f"{code or ''} {message}".lower()
    if status == 429 or "rate_limit" in text:
        return "rate_limit"
    if any(needle in text for needle in ("context_length", "context length", "context window", "maximum context")):
        return "context_length"
    return "http" if status is not None else "unknown"


def _malformed(why: str) -> ModelProviderError:
    return ModelProviderError(f"model provider sent a malformed response: {why}", kind="malformed")


def _timed_out(seconds: float) -> ModelProviderError:
    return ModelProviderError(f"model provider timed out after {_seconds(seconds)} s", kind="timeout")


def _seconds(value: float) -> str:
    return f"{value:g}"


def _one_line(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


def _describe(exc: BaseException) -> str:
    return _one_line(str(exc), 300) or type(exc).__name__
