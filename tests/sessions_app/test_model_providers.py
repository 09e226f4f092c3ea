"""Model providers: the echo provider, and the OpenAI-compatible one against a real HTTP mock on 127.0.0.1."""

from __future__ import annotations

import json
import pickle
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from sessions_app.model_providers import (
    Aborted,
    ChatMessage,
    Delta,
    EchoProvider,
    Finish,
    ModelProvider,
    ModelProviderError,
    OpenAICompatProvider,
    default_model,
    get_model_provider,
)
from sessions_app.model_providers.openai_compat import WORKER_THREAD_NAME
from tests.support.mock_openai import (
    MockOpenAI,
    echo,
    error,
    hang,
    hang_before_headers,
    malformed,
    partial_then_drop,
    raw,
    reply,
    slow,
)
from tests.support.processes import ROOT

# Generous bounds: they catch "waited for the server" (seconds), not precise timings.
PROMPT_S = 3.0


def never() -> bool:
    return False


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=text)]


def collect(
    provider: ModelProvider,
    messages: list[ChatMessage],
    *,
    model: str = "gpt-test",
    should_abort: Callable[[], bool] = never,
    deltas: list[str] | None = None,
) -> tuple[list[str], Finish]:
    """Run one stream; ``deltas`` (when given) keeps the text received before an exception."""
    received = deltas if deltas is not None else []
    finish: Finish | None = None
    for item in provider.stream(messages, model=model, should_abort=should_abort):
        assert finish is None, "nothing may follow Finish"
        if isinstance(item, Delta):
            assert item.text
            received.append(item.text)
        else:
            finish = item
    assert finish is not None, "the stream must end with a Finish"
    return received, finish


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WORKER_THREAD_NAME]


def wait_for_thread_count(expected: int, timeout: float = 2.0) -> int:
    deadline = time.monotonic() + timeout
    while threading.active_count() > expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return threading.active_count()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def mock_openai() -> Iterator[MockOpenAI]:
    server = MockOpenAI().start()
    yield server
    server.stop()


@pytest.fixture
def openai_conf(settings, mock_openai: MockOpenAI) -> dict:
    settings.OPENCLAW_MODEL = {
        "PROVIDER": "openai",
        "BASE_URL": mock_openai.base_url,
        "API_KEY": "",
        "MODEL": "gpt-test",
        "CONNECT_TIMEOUT_S": 2.0,
        "READ_TIMEOUT_S": 5.0,
        "TOTAL_TIMEOUT_S": 20.0,
    }
    return settings.OPENCLAW_MODEL


def configure(settings, **overrides: object) -> ModelProvider:
    settings.OPENCLAW_MODEL = {**settings.OPENCLAW_MODEL, **overrides}
    return get_model_provider()


# --- echo -----------------------------------------------------------------------------------


def test_echo_replies_with_the_text_after_reply_exactly():
    deltas, finish = collect(EchoProvider(), user("Please. Reply exactly: PING  "))

    assert "".join(deltas) == "PING"
    assert finish == Finish(
        stop_reason="stop", usage={"input": 4, "output": 1, "totalTokens": 5}, response_id=None, model="gpt-test"
    )


def test_echo_uses_the_first_marker_and_keeps_later_ones():
    deltas, _ = collect(EchoProvider(), user("Reply exactly: say Reply exactly: twice"))

    assert "".join(deltas) == "say Reply exactly: twice"


def test_echo_replies_with_the_user_text_unchanged_in_word_chunks():
    text = "  hello   wide\nworld \t"
    deltas, finish = collect(EchoProvider(), user(text), model="echo")

    assert "".join(deltas) == text
    assert deltas == ["  hello   ", "wide\n", "world \t"]
    assert finish.model == "echo"
    assert finish.usage == {"input": 3, "output": 3, "totalTokens": 6}


def test_echo_answers_the_last_user_message_and_counts_the_whole_prompt():
    messages = [
        ChatMessage(role="system", content="be brief"),
        ChatMessage(role="user", content="first question"),
        ChatMessage(role="assistant", content="first answer"),
        ChatMessage(role="user", content="second"),
    ]
    deltas, finish = collect(EchoProvider(), messages)

    assert deltas == ["second"]
    assert finish.usage == {"input": 7, "output": 1, "totalTokens": 8}


def test_echo_empty_reply_yields_only_finish():
    deltas, finish = collect(EchoProvider(), user("Reply exactly:   "))

    assert deltas == []
    assert finish.stop_reason == "stop"
    assert finish.usage == {"input": 2, "output": 0, "totalTokens": 2}


def test_echo_aborts_before_the_first_chunk():
    stream = EchoProvider().stream(user("one two three"), model="m", should_abort=lambda: True)

    with pytest.raises(Aborted):
        next(stream)


def test_echo_aborts_before_the_second_chunk():
    deltas: list[str] = []
    with pytest.raises(Aborted):
        collect(EchoProvider(), user("one two three"), should_abort=lambda: len(deltas) >= 1, deltas=deltas)

    assert deltas == ["one "]


# --- OpenAI-compatible: replies -------------------------------------------------------------


def test_it_streams_a_reply_with_usage(openai_conf, mock_openai):
    deltas, finish = collect(get_model_provider(), user("Reply exactly: hello there world"))

    assert deltas == ["hello ", "there ", "world"]
    assert finish.stop_reason == "stop"
    assert finish.usage == {"input": 5, "output": 3, "totalTokens": 8}
    assert finish.response_id is not None and finish.response_id.startswith("chatcmpl-")
    assert finish.model == "gpt-test"


def test_it_reports_the_model_that_answered(openai_conf, mock_openai):
    mock_openai.script(reply("hi there", model="gpt-test-2025-01-01", chunk_words=2))

    deltas, finish = collect(get_model_provider(), user("anything"))

    assert deltas == ["hi there"]
    assert finish.model == "gpt-test-2025-01-01"


def test_it_accepts_a_non_streamed_json_reply(openai_conf, mock_openai):
    mock_openai.script(echo(stream=False))

    deltas, finish = collect(get_model_provider(), user("Reply exactly: all at once"))

    assert deltas == ["all at once"]
    assert finish.stop_reason == "stop"
    assert finish.usage == {"input": 5, "output": 3, "totalTokens": 8}
    assert finish.response_id is not None and finish.response_id.startswith("chatcmpl-")


def test_it_posts_model_messages_and_stream(openai_conf, mock_openai):
    messages = [ChatMessage(role="system", content="sys"), ChatMessage(role="user", content="hi")]

    collect(get_model_provider(), messages, model="gpt-other")

    assert mock_openai.requests == [
        {
            "model": "gpt-other",
            "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
            "stream": True,
        }
    ]
    assert mock_openai.request_headers[0]["content-type"] == "application/json"


def test_it_sends_the_api_key_as_a_bearer_token(settings, openai_conf, mock_openai):
    provider = configure(settings, API_KEY="sk-test-123")

    collect(provider, user("hi"))

    assert mock_openai.request_headers[0]["authorization"] == "Bearer sk-test-123"


def test_it_sends_no_authorization_header_without_an_api_key(openai_conf, mock_openai):
    collect(get_model_provider(), user("hi"))

    assert "authorization" not in mock_openai.request_headers[0]


def test_it_skips_chunks_without_content(openai_conf, mock_openai):
    chunks = [
        {"id": "chatcmpl-x", "model": "m1", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {"content": None}}]},
        {"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {"content": ""}}]},
        {"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]},
        {"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        {"id": "chatcmpl-x", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}},
    ]
    body = (
        ": keep-alive\n\nevent: message\n" + "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    )
    mock_openai.script(raw(body, content_type="text/event-stream"))

    deltas, finish = collect(get_model_provider(), user("hi"))

    assert deltas == ["ok"]
    assert finish == Finish(
        stop_reason="length", usage={"input": 2, "output": 1, "totalTokens": 3}, response_id="chatcmpl-x", model="m1"
    )


# --- OpenAI-compatible: failures ------------------------------------------------------------


def expect_error(provider: ModelProvider, *, deltas: list[str] | None = None) -> ModelProviderError:
    with pytest.raises(ModelProviderError) as info:
        collect(provider, user("Reply exactly: hi"), deltas=deltas)
    return info.value


def test_http_500_is_an_http_error_with_the_provider_message(openai_conf, mock_openai):
    mock_openai.script(error(500, "upstream exploded"))

    exc = expect_error(get_model_provider())

    assert exc.summary == "model provider returned HTTP 500: upstream exploded"
    assert exc.kind == "http"
    assert str(exc) == exc.summary


def test_http_429_is_a_rate_limit_error(openai_conf, mock_openai):
    mock_openai.script(error(429, "Rate limit reached for requests", code="rate_limit_exceeded"))

    exc = expect_error(get_model_provider())

    assert exc.summary == "model provider returned HTTP 429: Rate limit reached for requests"
    assert exc.kind == "rate_limit"


def test_context_length_error_is_classified(openai_conf, mock_openai):
    message = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
    mock_openai.script(error(400, message, code="context_length_exceeded"))

    exc = expect_error(get_model_provider())

    assert exc.summary == f"model provider returned HTTP 400: {message}"
    assert exc.kind == "context_length"


def test_http_error_without_json_quotes_the_start_of_the_body(openai_conf, mock_openai):
    page = "<html>\n<body>Bad gateway " + "x" * 300 + "</body></html>"
    mock_openai.script(raw(page, status=502, content_type="text/html"))

    exc = expect_error(get_model_provider())

    assert exc.summary == "model provider returned HTTP 502: " + " ".join(page[:200].split())
    assert exc.kind == "http"


def test_connection_refused_is_a_connection_error(settings, openai_conf):
    provider = configure(settings, BASE_URL=f"http://127.0.0.1:{closed_port()}/v1")

    exc = expect_error(provider)

    assert exc.summary.startswith("model provider unreachable: ")
    assert "refused" in exc.summary.lower()
    assert exc.kind == "connection"


def test_missing_base_url_is_an_error(settings, openai_conf):
    provider = configure(settings, BASE_URL="")

    exc = expect_error(provider)

    assert exc.summary == "model provider base URL is not set (OPENCLAW_MODEL_BASE_URL)"


@pytest.mark.parametrize("behaviour", [hang(10), hang_before_headers(10)], ids=["after-headers", "before-headers"])
def test_silence_longer_than_the_read_timeout_is_a_timeout(settings, openai_conf, mock_openai, behaviour):
    provider = configure(settings, READ_TIMEOUT_S=0.5)
    mock_openai.script(behaviour)

    started = time.monotonic()
    exc = expect_error(provider)

    assert exc.summary == "model provider timed out after 0.5 s"
    assert exc.kind == "timeout"
    assert time.monotonic() - started < PROMPT_S


def test_a_reply_slower_than_the_total_timeout_is_a_timeout(settings, openai_conf, mock_openai):
    provider = configure(settings, READ_TIMEOUT_S=5.0, TOTAL_TIMEOUT_S=0.5)
    mock_openai.script(slow("one two three four five six seven eight nine ten", 0.2))

    deltas: list[str] = []
    exc = expect_error(provider, deltas=deltas)

    assert exc.summary == "model provider timed out after 0.5 s"
    assert exc.kind == "timeout"
    assert 1 <= len(deltas) < 10
    assert not worker_threads()


def test_invalid_json_in_the_stream_is_malformed(openai_conf, mock_openai):
    mock_openai.script(malformed())

    exc = expect_error(get_model_provider())

    assert exc.summary == (
        "model provider sent a malformed response: invalid JSON in stream event "
        "(Expecting property name enclosed in double quotes)"
    )
    assert exc.kind == "malformed"


def test_a_body_that_is_not_an_event_stream_is_malformed(openai_conf, mock_openai):
    mock_openai.script(malformed("<html>oops</html>\n"))

    exc = expect_error(get_model_provider())

    assert exc.summary == "model provider sent a malformed response: unexpected line in event stream: <html>oops</html>"
    assert exc.kind == "malformed"


def test_a_json_reply_without_choices_is_malformed(openai_conf, mock_openai):
    mock_openai.script(raw(json.dumps({"id": "chatcmpl-1", "object": "chat.completion"})))

    exc = expect_error(get_model_provider())

    assert exc.summary == "model provider sent a malformed response: JSON body has no choices"
    assert exc.kind == "malformed"


def test_an_error_event_inside_the_stream_fails_the_call(openai_conf, mock_openai):
    body = 'data: {"error": {"message": "model overloaded", "type": "server_error"}}\n\n'
    mock_openai.script(raw(body, content_type="text/event-stream"))

    exc = expect_error(get_model_provider())

    assert exc.summary == "model provider reported an error: model overloaded"
    assert exc.kind == "unknown"


def test_a_refusal_without_content_is_a_refusal(openai_conf, mock_openai):
    chunk = {
        "id": "c",
        "choices": [{"index": 0, "delta": {"refusal": "I can't help with that."}, "finish_reason": "stop"}],
    }
    mock_openai.script(raw(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n", content_type="text/event-stream"))

    exc = expect_error(get_model_provider())

    assert exc.summary == "model refused: I can't help with that."
    assert exc.kind == "refusal"


# Partial streams (decision): the HTTP body framing tells a clean end from a drop.
#  * body ended properly (chunked terminator / Content-Length reached) without finish_reason or [DONE], after some
#    content -> the reply is complete: Finish(stop_reason="stop");
#  * the same with no content at all -> malformed;
#  * the connection dropped inside the body -> ModelProviderError(kind="connection", "... dropped mid-stream ..."),
#    after the deltas already yielded (the caller may keep them as partial text), unless finish_reason had arrived.


def test_partial_stream_that_ends_cleanly_is_a_complete_reply(openai_conf, mock_openai):
    mock_openai.script(partial_then_drop("Hello ", clean=True))

    deltas, finish = collect(get_model_provider(), user("hi"))

    assert deltas == ["Hello "]
    assert finish.stop_reason == "stop"
    assert finish.usage is None


def test_partial_stream_that_is_dropped_is_a_connection_error_after_the_content(openai_conf, mock_openai):
    mock_openai.script(partial_then_drop("Hello "))

    deltas: list[str] = []
    exc = expect_error(get_model_provider(), deltas=deltas)

    assert deltas == ["Hello "]
    assert exc.summary == (
        "model provider connection dropped mid-stream: "
        "peer closed connection without sending complete message body (incomplete chunked read)"
    )
    assert exc.kind == "connection"


def test_a_stream_that_ends_without_any_content_or_finish_is_malformed(openai_conf, mock_openai):
    mock_openai.script(partial_then_drop("", clean=True))

    exc = expect_error(get_model_provider())

    assert exc.summary == "model provider sent a malformed response: stream ended without content or finish_reason"
    assert exc.kind == "malformed"


def test_a_drop_after_finish_reason_still_finishes(openai_conf, mock_openai):
    mock_openai.script(partial_then_drop("done", finish_reason="length"))

    deltas, finish = collect(get_model_provider(), user("hi"))

    assert deltas == ["done"]
    assert finish.stop_reason == "length"


# --- OpenAI-compatible: abort ---------------------------------------------------------------


@pytest.mark.parametrize("behaviour", [hang(10), hang_before_headers(10)], ids=["after-headers", "before-headers"])
def test_abort_during_a_hang_is_prompt_and_leaks_no_thread(openai_conf, mock_openai, behaviour):
    mock_openai.script(behaviour)
    threads_before = threading.active_count()
    flag = threading.Event()
    timer = threading.Timer(0.3, flag.set)
    timer.start()

    started = time.monotonic()
    with pytest.raises(Aborted):
        collect(get_model_provider(), user("hi"), should_abort=flag.is_set)
    elapsed = time.monotonic() - started
    timer.join()

    assert elapsed < PROMPT_S
    assert not worker_threads()
    # The mock's handler thread notices the closed connection within ~50 ms.
    assert wait_for_thread_count(threads_before) <= threads_before


def test_abort_between_chunks_keeps_what_was_received(openai_conf, mock_openai):
    mock_openai.script(slow("one two three four", 0.3))

    deltas: list[str] = []
    with pytest.raises(Aborted):
        collect(get_model_provider(), user("hi"), should_abort=lambda: len(deltas) >= 2, deltas=deltas)

    assert deltas == ["one ", "two "]
    assert not worker_threads()


def test_should_abort_runs_on_the_consumer_thread(openai_conf, mock_openai):
    mock_openai.script(slow("a b c", 0.15))
    seen: set[int] = set()

    def should_abort() -> bool:
        seen.add(threading.get_ident())
        return False

    collect(get_model_provider(), user("hi"), should_abort=should_abort)

    assert seen == {threading.get_ident()}


def test_closing_the_stream_early_stops_the_worker(openai_conf, mock_openai):
    mock_openai.script(slow("one two three four", 0.5))
    stream = get_model_provider().stream(user("hi"), model="gpt-test", should_abort=never)

    assert next(stream) == Delta(text="one ")
    started = time.monotonic()
    stream.close()

    assert time.monotonic() - started < PROMPT_S
    assert not worker_threads()


# --- selection ------------------------------------------------------------------------------


def test_get_provider_reads_settings_at_call_time(settings):
    settings.OPENCLAW_MODEL = {**settings.OPENCLAW_MODEL, "PROVIDER": "echo", "MODEL": "echo-1"}
    assert isinstance(get_model_provider(), EchoProvider)
    assert get_model_provider().name == "echo"
    assert default_model() == "echo-1"

    settings.OPENCLAW_MODEL = {
        **settings.OPENCLAW_MODEL,
        "PROVIDER": "openai",
        "BASE_URL": "http://127.0.0.1:9/v1",
        "API_KEY": "k",
        "MODEL": "gpt-x",
        "READ_TIMEOUT_S": 7,
    }
    provider = get_model_provider()
    assert isinstance(provider, OpenAICompatProvider)
    assert provider.name == "openai"
    assert provider.config.base_url == "http://127.0.0.1:9/v1"
    assert provider.config.api_key == "k"
    assert provider.config.read_timeout_s == 7.0
    assert default_model() == "gpt-x"


def test_provider_error_keeps_its_kind_when_pickled():
    restored = pickle.loads(pickle.dumps(ModelProviderError("model provider timed out after 1 s", kind="timeout")))

    assert (restored.summary, restored.kind, str(restored)) == (
        "model provider timed out after 1 s",
        "timeout",
        "model provider timed out after 1 s",
    )


def test_unknown_provider_is_an_error(settings):
    settings.OPENCLAW_MODEL = {**settings.OPENCLAW_MODEL, "PROVIDER": "anthropic"}

    with pytest.raises(ModelProviderError) as info:
        get_model_provider()

    assert info.value.summary == "unknown model provider: anthropic"
    assert info.value.kind == "unknown"


# --- the mock itself ------------------------------------------------------------------------


def test_mock_stop_returns_promptly_while_a_request_hangs():
    mock = MockOpenAI().start()
    mock.script(hang(30))
    failures: list[BaseException] = []

    def call() -> None:
        try:
            httpx.post(f"{mock.base_url}/chat/completions", json={"model": "m", "stream": True}, timeout=30).read()
        except httpx.HTTPError as exc:
            failures.append(exc)

    client = threading.Thread(target=call)
    client.start()
    deadline = time.monotonic() + PROMPT_S
    while not mock.requests and time.monotonic() < deadline:
        time.sleep(0.02)

    started = time.monotonic()
    mock.stop()
    stop_s = time.monotonic() - started
    client.join(PROMPT_S)

    assert stop_s < 1.5
    assert not client.is_alive()
    assert failures  # the hanging response was cut short


def test_mock_runs_as_a_standalone_process():
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "support" / "mock_openai.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready, "the mock printed no URL"
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("MOCK_OPENAI_URL=http://127.0.0.1:")
        base_url = line.removeprefix("MOCK_OPENAI_URL=")
        root = base_url.removesuffix("/v1")

        scripted = httpx.post(f"{root}/_mock/script", json={"behaviours": [{"kind": "reply", "text": "scripted"}]})
        assert scripted.json() == {"ok": True, "queued": 1}
        first = httpx.post(
            f"{base_url}/chat/completions",
            json={"model": "m", "stream": False, "messages": [{"role": "user", "content": "x"}]},
        )
        second = httpx.post(
            f"{base_url}/chat/completions",
            json={"model": "m", "stream": False, "messages": [{"role": "user", "content": "Reply exactly: PONG"}]},
        )

        assert first.json()["choices"][0]["message"]["content"] == "scripted"
        assert second.json()["choices"][0]["message"]["content"] == "PONG"
        assert second.json()["object"] == "chat.completion"
        assert len(httpx.get(f"{root}/_mock/requests").json()["requests"]) == 2
    finally:
        proc.terminate()
        proc.wait(5)
    assert proc.returncode == 0
