"""Tool calling through the model providers: what the OpenAI-compatible provider sends (``tools``, assistant
``tool_calls``, ``role: "tool"`` messages) and the calls it returns in ``Finish``, against the mock server's
tool-call plans (tests/support/mock_openai.py) and hand-written streams."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sessions_app.model_providers import (
    ChatMessage,
    Delta,
    EchoProvider,
    Finish,
    ModelProvider,
    ModelProviderError,
    ToolCall,
    get_model_provider,
)
from tests.support.mock_openai import MockOpenAI, partial_then_drop, raw

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file of the workspace.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}},
]


def never() -> bool:
    return False


def run(
    provider: ModelProvider, messages: list[ChatMessage], *, tools: list[dict[str, Any]] | None = TOOLS
) -> tuple[list[str], Finish]:
    deltas: list[str] = []
    finish: Finish | None = None
    for item in provider.stream(messages, model="gpt-test", should_abort=never, tools=tools):
        assert finish is None, "nothing may follow Finish"
        if isinstance(item, Delta):
            deltas.append(item.text)
        else:
            finish = item
    assert finish is not None
    return deltas, finish


def planned(plan: dict[str, Any]) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=f"Go.\nTOOL_PLAN: {json.dumps(plan)}")]


def sse(*chunks: dict[str, Any], done: bool = True) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + ("data: [DONE]\n\n" if done else "")


def calls_chunk(*fragments: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-t",
        "choices": [{"index": 0, "delta": {"tool_calls": list(fragments)}, "finish_reason": finish}],
    }


@pytest.fixture
def mock_openai() -> Iterator[MockOpenAI]:
    server = MockOpenAI().start()
    yield server
    server.stop()


@pytest.fixture
def provider(settings, mock_openai: MockOpenAI) -> ModelProvider:
    settings.OPENCLAW_MODEL = {
        "PROVIDER": "openai",
        "BASE_URL": mock_openai.base_url,
        "API_KEY": "",
        "MODEL": "gpt-test",
        "CONNECT_TIMEOUT_S": 2.0,
        "READ_TIMEOUT_S": 5.0,
        "TOTAL_TIMEOUT_S": 20.0,
    }
    return get_model_provider()


# --- the request ----------------------------------------------------------------------------


def test_it_sends_tools_tool_choice_and_the_tool_messages_exactly(provider, mock_openai):
    messages = [
        ChatMessage(role="system", content="You have tools."),
        ChatMessage(role="user", content="What is in a.txt?"),
        ChatMessage(role="assistant", content="", tool_calls=(ToolCall("call_1", "read", '{"path": "a.txt"}'),)),
        ChatMessage(role="tool", content="hello", tool_call_id="call_1"),
        ChatMessage(
            role="assistant",
            content="Two more.",
            tool_calls=(ToolCall("call_2", "ls", "{}"), ToolCall("call_3", "read", '{"path"')),
        ),
        ChatMessage(role="tool", content="a.txt", tool_call_id="call_2", name="ls"),
        ChatMessage(role="tool", content="invalid arguments", tool_call_id="call_3"),
        ChatMessage(role="user", content="Reply exactly: ok", name="operator"),
    ]

    run(provider, messages)

    assert mock_openai.requests == [
        {
            "model": "gpt-test",
            "messages": [
                {"role": "system", "content": "You have tools."},
                {"role": "user", "content": "What is in a.txt?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "read", "arguments": '{"path": "a.txt"}'},
                        }
                    ],
                },
                {"role": "tool", "content": "hello", "tool_call_id": "call_1"},
                {
                    "role": "assistant",
                    "content": "Two more.",
                    "tool_calls": [
                        {"id": "call_2", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
                        {"id": "call_3", "type": "function", "function": {"name": "read", "arguments": '{"path"'}},
                    ],
                },
                {"role": "tool", "content": "a.txt", "tool_call_id": "call_2", "name": "ls"},
                {"role": "tool", "content": "invalid arguments", "tool_call_id": "call_3"},
                {"role": "user", "content": "Reply exactly: ok", "name": "operator"},
            ],
            "stream": True,
            "tools": TOOLS,
            "tool_choice": "auto",
        }
    ]


@pytest.mark.parametrize("tools", [None, []], ids=["no tools", "an empty list"])
def test_a_request_without_tools_is_the_same_bytes_as_before(provider, mock_openai, tools):
    messages = [ChatMessage(role="system", content="sys"), ChatMessage(role="user", content="hi")]

    run(provider, messages, tools=tools)

    assert mock_openai.requests == [
        {
            "model": "gpt-test",
            "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
            "stream": True,
        }
    ]
    assert mock_openai.request_headers[0]["content-length"] == str(
        len(
            b'{"model":"gpt-test","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"}],"stream":true}'
        )
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"role": "user", "content": "x", "tool_calls": (ToolCall("a", "ls", "{}"),)},
            "only an assistant message carries tool calls, not a 'user' one",
        ),
        ({"role": "tool", "content": "x"}, "a tool message, and only a tool message, answers a tool_call_id"),
        (
            {"role": "assistant", "content": "x", "tool_call_id": "a"},
            "a tool message, and only a tool message, answers a tool_call_id",
        ),
    ],
)
def test_a_message_no_api_would_take_is_refused_when_it_is_made(fields, message):
    with pytest.raises(ValueError) as info:
        ChatMessage(**fields)

    assert str(info.value) == message


# --- the calls in Finish ----------------------------------------------------------------------


def test_streamed_tool_calls_come_back_in_finish(provider):
    plan = {
        "steps": [{"text": "Checking.", "calls": [{"name": "read", "arguments": {"path": "a.txt"}}, {"name": "ls"}]}]
    }

    deltas, finish = run(provider, planned(plan))

    assert deltas == ["Checking."]
    assert finish.tool_calls == (
        ToolCall("call_0_0", "read", json.dumps({"path": "a.txt"})),
        ToolCall("call_0_1", "ls", "{}"),
    )
    assert finish.stop_reason == "tool_calls"
    assert finish.model == "gpt-test"
    assert finish.response_id is not None and finish.usage is not None


@pytest.mark.parametrize(
    "options",
    [{"stream_chunks": 1}, {"stream_chunks": 7, "repeat_ids": True}, {"json": True}, {"finish_reason": None}],
    ids=["whole calls", "repeated ids", "a JSON body", "no finish_reason"],
)
def test_tool_calls_are_read_from_every_shape_the_mock_sends(provider, options):
    plan = {"steps": [{"calls": [{"name": "write", "arguments": {"path": "b", "content": "x" * 50}}], **options}]}

    deltas, finish = run(provider, planned(plan))

    assert deltas == []
    assert finish.tool_calls == (ToolCall("call_0_0", "write", json.dumps({"path": "b", "content": "x" * 50})),)
    assert finish.stop_reason == "tool_calls"


def test_a_loop_of_steps_reaches_the_final_answer_quoting_a_tool_result(provider, mock_openai):
    plan = {
        "steps": [{"calls": [{"name": "ls"}]}, {"calls": [{"name": "read", "arguments": {"path": "a"}}]}],
        "final": "a says: {last_tool_result}",
    }
    messages = planned(plan)
    results = {"ls": "a", "read": "hello from a"}
    while True:
        deltas, finish = run(provider, messages)
        if not finish.tool_calls:
            break
        messages.append(ChatMessage(role="assistant", content="".join(deltas), tool_calls=finish.tool_calls))
        messages += [ChatMessage(role="tool", content=results[c.name], tool_call_id=c.id) for c in finish.tool_calls]

    assert "".join(deltas) == "a says: hello from a"
    assert finish.stop_reason == "stop"
    assert len(mock_openai.requests) == 3
    assert mock_openai.requests[2]["messages"][-1] == {
        "role": "tool",
        "content": "hello from a",
        "tool_call_id": "call_1_0",
    }


CALL = {"id": "call_x", "name": "ls", "arguments": "{}"}


def test_a_drop_after_the_tool_calls_finish_reason_still_finishes_with_the_calls(provider, mock_openai):
    mock_openai.script(partial_then_drop("Looking. ", tool_calls=[CALL], finish_reason="tool_calls"))

    deltas, finish = run(provider, [ChatMessage(role="user", content="hi")])

    assert deltas == ["Looking. "]
    assert (finish.tool_calls, finish.stop_reason) == ((ToolCall("call_x", "ls", "{}"),), "tool_calls")


def test_a_drop_before_the_tool_calls_were_finished_is_a_connection_error(provider, mock_openai):
    mock_openai.script(partial_then_drop("", tool_calls=[CALL]))

    with pytest.raises(ModelProviderError) as info:
        run(provider, [ChatMessage(role="user", content="hi")])

    assert info.value.summary.startswith("model provider connection dropped mid-stream: ")
    assert info.value.kind == "connection"


def test_a_clean_end_before_the_tool_calls_were_finished_is_malformed(provider, mock_openai):
    mock_openai.script(partial_then_drop("", tool_calls=[CALL], clean=True))

    with pytest.raises(ModelProviderError) as info:
        run(provider, [ChatMessage(role="user", content="hi")])

    assert info.value.summary == (
        "model provider sent a malformed response: stream ended before its tool calls were complete"
    )
    assert info.value.kind == "malformed"


# --- malformed tool calls -------------------------------------------------------------------


def expect_malformed(provider: ModelProvider, mock_openai: MockOpenAI, body: str) -> str:
    mock_openai.script(raw(body, content_type="text/event-stream"))
    with pytest.raises(ModelProviderError) as info:
        run(provider, [ChatMessage(role="user", content="hi")])
    assert info.value.kind == "malformed"
    return info.value.summary


def test_a_call_whose_name_never_arrives_is_malformed(provider, mock_openai):
    body = sse(calls_chunk({"index": 0, "id": "c", "function": {"arguments": "{}"}}, finish="tool_calls"))

    summary = expect_malformed(provider, mock_openai, body)

    assert summary == "model provider sent a malformed response: tool call 0 has no name"


def test_more_than_64_calls_are_malformed(provider, mock_openai):
    fragments = [{"index": i, "id": f"c{i}", "function": {"name": "ls", "arguments": "{}"}} for i in range(65)]

    summary = expect_malformed(provider, mock_openai, sse(calls_chunk(*fragments, finish="tool_calls")))

    assert summary == "model provider sent a malformed response: more than 64 tool calls in one reply"


def test_arguments_over_a_mib_are_malformed(provider, mock_openai):
    body = sse(
        calls_chunk({"index": 0, "id": "c", "function": {"name": "write", "arguments": "x" * (1024 * 1024)}}),
        calls_chunk({"index": 0, "function": {"arguments": "x"}}, finish="tool_calls"),
    )

    summary = expect_malformed(provider, mock_openai, body)

    assert summary == "model provider sent a malformed response: tool call arguments larger than 1048576 bytes"


def test_a_name_over_128_characters_is_malformed(provider, mock_openai):
    body = sse(calls_chunk({"index": 0, "id": "c", "function": {"name": "n" * 129}}, finish="tool_calls"))

    summary = expect_malformed(provider, mock_openai, body)

    assert summary == "model provider sent a malformed response: tool call name longer than 128 characters"


def test_tool_calls_that_are_not_a_list_in_a_json_body_are_malformed(provider, mock_openai):
    body = {"id": "x", "choices": [{"message": {"role": "assistant", "tool_calls": {"id": "c"}}}]}
    mock_openai.script(raw(json.dumps(body)))

    with pytest.raises(ModelProviderError) as info:
        run(provider, [ChatMessage(role="user", content="hi")])

    assert info.value.summary == "model provider sent a malformed response: message tool_calls is not a list"
    assert info.value.kind == "malformed"


def test_an_error_in_a_json_body_is_reported_with_its_kind(provider, mock_openai):
    body = {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}
    mock_openai.script(raw(json.dumps(body)))

    with pytest.raises(ModelProviderError) as info:
        run(provider, [ChatMessage(role="user", content="hi")])

    assert info.value.summary == "model provider reported an error: Rate limit reached"
    assert info.value.kind == "rate_limit"


def test_an_error_without_a_message_is_quoted_whole(provider, mock_openai):
    mock_openai.script(raw(sse({"error": {"code": 42}}), content_type="text/event-stream"))

    with pytest.raises(ModelProviderError) as info:
        run(provider, [ChatMessage(role="user", content="hi")])

    assert info.value.summary == 'model provider reported an error: {"code": 42}'
    assert info.value.kind == "unknown"


# --- echo -----------------------------------------------------------------------------------


def test_echo_takes_tools_and_never_calls_one():
    deltas, finish = run(EchoProvider(), [ChatMessage(role="user", content="Reply exactly: plain")])

    assert deltas == ["plain"]
    assert finish.tool_calls == ()
