"""The mock OpenAI server's tool-call plans (``TOOL_PLAN:`` in the newest user message, tests/support/mock_openai.py).

What is checked is the wire: the chunks and bodies the mock sends, and that the reply folder the gateway and the
worker use (``openclaw_client.agent.openai_stream``) reads them back as the plan's calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from openclaw_client.agent.openai_stream import Reply, StreamState, ToolCall
from tests.support.mock_openai import MockOpenAI, echo, error, reply

WRITE_ARGS = {"path": "notes/a.txt", "content": "hello tools"}
PLAN = {
    "steps": [
        {"calls": [{"name": "write", "arguments": WRITE_ARGS}]},
        {
            "calls": [
                {"name": "read", "arguments": {"path": "notes/a.txt"}},
                {"name": "no_such_tool", "arguments": '{"broken": '},
            ]
        },
    ],
    "final": "done: {last_tool_result} / first: {tool_result:call_1_0} / none: {tool_result:nope}",
}


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    server = MockOpenAI().start()
    yield server
    server.stop()


def plan_message(plan: dict[str, Any], before: str = "Please do this.") -> dict[str, Any]:
    return {"role": "user", "content": f"{before}\nTOOL_PLAN: {json.dumps(plan)}\nThanks."}


def assistant_calls(*calls: ToolCall) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [call.as_openai() for call in calls]}


def tool_result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def post(mock: MockOpenAI, messages: list[dict[str, Any]], *, stream: bool = True) -> httpx.Response:
    body = {"model": "m", "messages": messages, "stream": stream, "tools": [{"type": "function"}]}
    return httpx.post(f"{mock.base_url}/chat/completions", json=body, timeout=10)


def events(response: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of an event stream ([DONE] kept as the string)."""
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = [line.removeprefix("data: ") for line in response.text.split("\n") if line.startswith("data: ")]
    return [payload if payload == "[DONE]" else json.loads(payload) for payload in payloads]


def tool_fragments(stream: list[Any]) -> list[dict[str, Any]]:
    return [
        fragment
        for event in stream
        if isinstance(event, dict)
        for fragment in event["choices"][0]["delta"].get("tool_calls", [])
    ]


def folded(response: httpx.Response) -> Reply:
    state = StreamState()
    if response.headers["content-type"].startswith("application/json"):
        state.feed_completion(response.json())
    else:
        for line in response.text.split("\n"):
            state.feed_line(line)
        state.end_of_stream()
    return state.reply()


def test_the_first_step_streams_its_call_as_openai_does(mock):
    response = post(mock, [{"role": "system", "content": "tools"}, plan_message(PLAN)])

    stream = events(response)
    assert stream[-1] == "[DONE]"
    assert stream[-2]["choices"][0]["finish_reason"] == "tool_calls"
    arguments = json.dumps(WRITE_ARGS)
    fragments = tool_fragments(stream)
    # The id, type and name first (with empty arguments), then the arguments in three pieces.
    assert fragments[0] == {
        "index": 0,
        "id": "call_0_0",
        "type": "function",
        "function": {"name": "write", "arguments": ""},
    }
    assert [set(f) for f in fragments[1:]] == [{"index", "function"}] * 3
    assert "".join(f["function"]["arguments"] for f in fragments[1:]) == arguments
    usage = stream[-2]["usage"]
    assert folded(response) == Reply(
        text="",
        tool_calls=(ToolCall("call_0_0", "write", arguments),),
        finish_reason="tool_calls",
        usage={
            "input": usage["prompt_tokens"],
            "output": usage["completion_tokens"],
            "totalTokens": usage["total_tokens"],
        },
        response_id=stream[0]["id"],
        model="m",
    )


def test_the_next_step_follows_the_tool_calls_already_in_the_transcript(mock):
    first = ToolCall("call_0_0", "write", json.dumps(WRITE_ARGS))
    messages = [plan_message(PLAN), assistant_calls(first), tool_result("call_0_0", "wrote 11 bytes")]

    answer = folded(post(mock, messages))

    assert answer.tool_calls == (
        ToolCall("call_1_0", "read", json.dumps({"path": "notes/a.txt"})),
        ToolCall("call_1_1", "no_such_tool", '{"broken": '),  # an unknown tool, malformed JSON: as planned
    )


def test_after_the_last_step_the_final_text_quotes_the_tool_results(mock):
    messages = [
        plan_message(PLAN),
        assistant_calls(ToolCall("call_0_0", "write", "{}")),
        tool_result("call_0_0", "wrote 11 bytes"),
        assistant_calls(ToolCall("call_1_0", "read", "{}"), ToolCall("call_1_1", "no_such_tool", "{")),
        tool_result("call_1_0", "hello tools"),
        tool_result("call_1_1", "unknown tool"),
    ]

    answer = folded(post(mock, messages))

    assert answer.tool_calls == ()
    assert answer.text == "done: unknown tool / first: hello tools / none: "
    assert answer.finish_reason == "stop"


def test_the_answer_depends_on_the_transcript_only(mock):
    """No hidden state: the same transcript gets the same answer, from any process, any number of times."""
    messages = [plan_message(PLAN)]
    other = MockOpenAI().start()
    try:
        answers = [folded(post(mock, messages)), folded(post(mock, messages)), folded(post(other, messages))]
    finally:
        other.stop()

    assert {answer.tool_calls for answer in answers} == {(ToolCall("call_0_0", "write", json.dumps(WRITE_ARGS)),)}


def test_only_tool_calls_after_the_plans_message_count_as_steps_taken(mock):
    earlier = assistant_calls(ToolCall("old", "ls", "{}"))
    messages = [{"role": "user", "content": "before"}, earlier, tool_result("old", "x"), plan_message(PLAN)]

    assert folded(post(mock, messages)).tool_calls[0].id == "call_0_0"


def test_a_plan_in_an_older_user_message_is_not_followed(mock):
    messages = [plan_message(PLAN), {"role": "assistant", "content": "done"}, {"role": "user", "content": "Echo me"}]

    assert folded(post(mock, messages)).text == "Echo me"


def test_a_plan_without_steps_answers_its_final_text_and_a_default_one(mock):
    assert folded(post(mock, [plan_message({"final": "nothing to do"})])).text == "nothing to do"
    assert folded(post(mock, [plan_message({})])).text == "done"


def test_one_stream_chunk_sends_each_whole_call_in_one_fragment(mock):
    plan = {"steps": [{"calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "id": "mine"}]}]}
    plan["stream_chunks"] = 1

    response = post(mock, [plan_message(plan)])

    assert tool_fragments(events(response)) == [
        {"index": 0, "id": "call_0_0", "type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
        {"index": 1, "id": "mine", "type": "function", "function": {"name": "b", "arguments": "{}"}},
    ]
    assert folded(response).tool_calls == (ToolCall("call_0_0", "a", '{"x": 1}'), ToolCall("mine", "b", "{}"))


def test_a_steps_own_options_win_over_the_plans(mock):
    plan = {"stream_chunks": 1, "steps": [{"stream_chunks": 5, "calls": [{"name": "a", "arguments": "0123456789"}]}]}

    fragments = tool_fragments(events(post(mock, [plan_message(plan)])))

    assert [f["function"]["arguments"] for f in fragments] == ["", "01", "23", "45", "67", "89"]


def test_repeated_ids_ride_on_every_fragment(mock):
    plan = {"steps": [{"repeat_ids": True, "stream_chunks": 2, "calls": [{"name": "a", "arguments": "[1, 2]"}]}]}

    response = post(mock, [plan_message(plan)])

    fragments = tool_fragments(events(response))
    assert [(f["id"], f["function"]["name"]) for f in fragments] == [("call_0_0", "a")] * 3
    assert folded(response).tool_calls == (ToolCall("call_0_0", "a", "[1, 2]"),)


def test_text_before_the_calls_and_no_finish_reason(mock):
    plan = {"steps": [{"text": "Let me check.", "finish_reason": None, "calls": [{"name": "ls"}]}]}

    response = post(mock, [plan_message(plan)])

    stream = events(response)
    assert all(event["choices"][0]["finish_reason"] is None for event in stream[:-1])
    assert stream[-1] == "[DONE]"
    answer = folded(response)
    assert (answer.text, answer.tool_calls, answer.finish_reason) == (
        "Let me check.",
        (ToolCall("call_0_0", "ls", "{}"),),
        "tool_calls",  # no reason given, but a clean [DONE]
    )


@pytest.mark.parametrize("how", ["the plan says json", "the request does not stream"])
def test_a_json_body_carries_the_calls_and_the_final_text(mock, how):
    plan = {"steps": [{"calls": [{"name": "a", "arguments": {"k": "v"}}], "text": "see"}], "final": "ok"}
    if how == "the plan says json":
        plan["json"] = True
    stream = how != "the request does not stream"

    response = post(mock, [plan_message(plan)], stream=stream)

    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["choices"][0]["message"]["tool_calls"] == [
        {"id": "call_0_0", "type": "function", "function": {"name": "a", "arguments": '{"k": "v"}'}}
    ]
    assert folded(response).tool_calls == (ToolCall("call_0_0", "a", '{"k": "v"}'),)
    assert folded(response).text == "see"

    final = post(mock, [plan_message(plan), assistant_calls(ToolCall("call_0_0", "a", "{}"))], stream=stream)
    assert final.json()["choices"][0]["message"]["content"] == "ok"


def test_an_echo_behaviour_without_streaming_answers_the_plan_with_a_json_body(mock):
    mock.script(echo(stream=False))

    response = post(mock, [plan_message(PLAN)])

    assert response.json()["choices"][0]["message"]["tool_calls"][0]["id"] == "call_0_0"


def test_scripted_behaviours_come_before_the_plan(mock):
    mock.script(error(503, "busy"), reply("scripted"))
    messages = [plan_message(PLAN)]

    assert post(mock, messages).status_code == 503
    assert folded(post(mock, messages)).text == "scripted"
    assert folded(post(mock, messages)).tool_calls[0].name == "write"


def test_requests_are_recorded_with_their_tools_and_tool_messages(mock):
    messages = [plan_message(PLAN), assistant_calls(ToolCall("call_0_0", "write", "{}")), tool_result("call_0_0", "ok")]

    post(mock, messages)

    assert mock.requests[0]["messages"] == messages
    assert mock.requests[0]["tools"] == [{"type": "function"}]


@pytest.mark.parametrize(
    ("plan", "why"),
    [
        ("{not json", "not JSON (Expecting property name enclosed in double quotes: line 1 column 13 (char 12))"),
        ("[1]", "the plan is not a JSON object"),
        ('{"steps": {}}', '"steps" must be a list and "final" a string'),
        ('{"final": 1}', '"steps" must be a list and "final" a string'),
        ('{"steps": [{"calls": []}]}', 'step 0 needs a non-empty list of "calls"'),
        ('{"steps": [{"calls": [{"name": "a"}], "text": 1}]}', 'step 0: "text" must be a string'),
        ('{"steps": [{"calls": [{}]}]}', 'step 0: every call needs a "name"'),
        ('{"steps": [{"calls": [{"name": "a", "arguments": 1}]}]}', 'step 0: "arguments" must be an object'),
        ('{"steps": [{"calls": [{"name": "a", "id": 1}]}]}', 'step 0: "arguments" must be an object'),
        ('{"steps": [{"calls": [{"name": "a"}], "stream_chunks": 0}]}', 'step 0: "stream_chunks" must be a positive'),
        ('{"stream_chunks": true}', 'the plan: "stream_chunks" must be a positive integer'),
        ('{"json": "yes"}', 'the plan: "repeat_ids" and "json" must be booleans'),
        ('{"finish_reason": 1}', 'the plan: "finish_reason" must be a string or null'),
    ],
)
def test_a_plan_the_mock_cannot_follow_is_a_400(mock, plan, why):
    response = post(mock, [{"role": "user", "content": f"TOOL_PLAN: {plan}"}])

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_plan"
    assert response.json()["error"]["message"].startswith(f"bad TOOL_PLAN: {why}")
