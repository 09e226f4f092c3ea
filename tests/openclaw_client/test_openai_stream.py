"""The shared folder of OpenAI chat-completions replies (``openclaw_client.agent.openai_stream``).

Both the gateway's OpenAI-compatible provider and the worker child read replies through it; here it is
fed chunks, event-stream lines and JSON bodies directly.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from openclaw_client.agent.openai_stream import (
    MAX_ARGUMENTS_BYTES,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_TOOL_CALLS,
    ErrorReported,
    MalformedReply,
    RefusedReply,
    Reply,
    StreamState,
    ToolCall,
    usage_of,
)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}], **extra}


def call_fragment(index: int | None = None, **fields: Any) -> dict[str, Any]:
    """One ``delta.tool_calls`` entry: ``id``, ``name``, ``arguments`` as given (``index`` left out when None)."""
    fragment: dict[str, Any] = {} if index is None else {"index": index}
    if "id" in fields:
        fragment["id"] = fields["id"]
        fragment["type"] = "function"
    function = {key: fields[key] for key in ("name", "arguments") if key in fields}
    if function:
        fragment["function"] = function
    return fragment


def calls_chunk(*fragments: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return chunk({"tool_calls": list(fragments)}, finish)


def fold(*chunks: dict[str, Any], done: bool = True) -> tuple[list[str], Reply]:
    """Feed the chunks as an event stream (then [DONE] unless ``done=False``); the pieces and the reply."""
    state = StreamState()
    pieces = [state.feed_line(f"data: {json.dumps(c)}") for c in chunks]
    if done:
        state.feed_line("data: [DONE]")
    state.end_of_stream()
    return [piece for piece in pieces if piece], state.reply()


def malformed(*chunks: dict[str, Any], done: bool = True) -> str:
    with pytest.raises(MalformedReply) as info:
        fold(*chunks, done=done)
    assert str(info.value) == info.value.why
    return info.value.why


# --- text -----------------------------------------------------------------------------------


def test_it_folds_text_finish_reason_usage_id_and_model():
    pieces, reply = fold(
        {"id": "chatcmpl-1", "model": "gpt-x-2025", **chunk({"role": "assistant", "content": ""})},
        {"id": "chatcmpl-1", **chunk({"content": "Hel"})},
        {"id": "chatcmpl-2", **chunk({"content": "lo"})},
        chunk({}, "length"),
        {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 7}},
    )

    assert pieces == ["Hel", "lo"]
    assert reply == Reply(
        text="Hello",
        tool_calls=(),
        finish_reason="length",
        usage={"input": 4, "output": 2, "totalTokens": 7},
        response_id="chatcmpl-1",  # the first id; later ones do not replace it
        model="gpt-x-2025",
    )


def test_a_text_reply_without_finish_reason_that_ended_cleanly_is_a_stop():
    _pieces, reply = fold(chunk({"content": "hi"}), done=False)

    assert (reply.text, reply.finish_reason, reply.usage, reply.model) == ("hi", "stop", None, None)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 3, "completion_tokens": 2}, {"input": 3, "output": 2, "totalTokens": 5}),
        ({"input": 3, "output": 2, "totalTokens": 9}, {"input": 3, "output": 2, "totalTokens": 9}),
        ({"input": 3, "output": 2}, {"input": 3, "output": 2, "totalTokens": 5}),
        ({"prompt_tokens": "3", "completion_tokens": 2}, None),
        ({"total_tokens": 5}, None),
        ("lots", None),
        (None, None),
    ],
    ids=["openai", "the gateway's own", "without total", "not a count", "no parts", "not an object", "none"],
)
def test_usage_is_taken_in_openais_words_or_the_gateways(usage, expected):
    assert usage_of(usage) == expected


def test_a_later_usage_replaces_an_earlier_one_and_an_unreadable_one_is_ignored():
    _pieces, reply = fold(
        chunk({"content": "x"}, usage={"prompt_tokens": 1, "completion_tokens": 1}),
        chunk({}, "stop", usage={"prompt_tokens": 5, "completion_tokens": 3}),
        {"usage": {"prompt_tokens": "many"}},
    )

    assert reply.usage == {"input": 5, "output": 3, "totalTokens": 8}


def test_a_json_body_is_folded_whole():
    state = StreamState()
    text = state.feed_completion(
        {
            "id": "chatcmpl-9",
            "object": "chat.completion",
            "model": "m-json",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "all at once"}}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
        }
    )

    assert text == "all at once"
    assert state.reply() == Reply(
        text="all at once",
        tool_calls=(),
        finish_reason="stop",  # a body is complete: no finish_reason means it stopped
        usage={"input": 2, "output": 3, "totalTokens": 5},
        response_id="chatcmpl-9",
        model="m-json",
    )


# --- event-stream lines ---------------------------------------------------------------------


def test_comments_named_events_ids_retries_and_blank_lines_are_skipped():
    state = StreamState()
    for line in [": keep-alive", "", "event: message", "id: 7", "retry: 100"]:
        assert state.feed_line(line) == ""
    assert state.feed_line(f"data:{json.dumps(chunk({'content': 'no space'}, 'stop'))}") == "no space"
    assert state.feed_line("data: [DONE]") == ""

    assert state.done
    assert state.reply().text == "no space"


def test_an_event_split_over_several_data_lines_is_joined():
    state = StreamState()
    assert state.feed_line('data: {"choices": [{"delta":') == ""
    assert state.feed_line('data: {"content": "joined"}, "finish_reason": "stop"}]}') == "joined"
    assert state.feed_line("") == ""


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        (["data: {not json", ""], "invalid JSON in stream event (Expecting property name enclosed in double quotes)"),
        (["<html>oops</html>"], "unexpected line in event stream: <html>oops</html>"),
        (["x" * 200], "unexpected line in event stream: " + "x" * 80),
    ],
    ids=["an event that is not JSON", "a line that is not an event", "a long line is quoted in part"],
)
def test_lines_outside_the_event_stream_format_are_malformed(lines, why):
    state = StreamState()
    with pytest.raises(MalformedReply) as info:
        for line in lines:
            state.feed_line(line)

    assert info.value.why == why


def test_an_event_left_incomplete_at_the_end_is_malformed():
    state = StreamState()
    state.feed_line('data: {"choices": [')

    with pytest.raises(MalformedReply) as info:
        state.end_of_stream()

    assert info.value.why == "invalid JSON in stream event (Expecting value)"


# --- what the server says is wrong ----------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "why"),
    [
        ([1, 2], "stream event is not a JSON object"),
        ({"id": "x"}, "stream event has no choices"),
        ({"choices": {"0": {}}}, "stream event choices is not a list"),
        ({"choices": ["text"]}, "choice is not a JSON object"),
        ({"choices": [{"delta": "text"}]}, "choice delta is not a JSON object"),
        ({"choices": [{"delta": {"content": 7}}]}, "delta content is not a string"),
    ],
)
def test_chunks_outside_the_format_are_malformed(event, why):
    assert malformed(event) == why


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("text", "JSON body is not a JSON object"),
        ({"id": "x"}, "JSON body has no choices"),
        ({"choices": []}, "JSON body has no choices"),
        ({"choices": [{"message": [1]}]}, "choice message is not a JSON object"),
        ({"choices": [{"message": {"content": ["a"]}}]}, "message content is not a string"),
    ],
)
def test_json_bodies_outside_the_format_are_malformed(body, why):
    with pytest.raises(MalformedReply) as info:
        StreamState().feed_completion(body)

    assert info.value.why == why


def test_an_error_object_is_reported_with_the_body_that_holds_it():
    event = {"error": {"message": "model overloaded", "type": "server_error"}}
    state = StreamState()
    state.feed_line(f"data: {json.dumps(chunk({'content': 'partial'}))}")

    with pytest.raises(ErrorReported) as info:
        state.feed_line(f"data: {json.dumps(event)}")

    assert info.value.body == event
    assert state.text == "partial"


def test_an_empty_error_field_is_not_an_error():
    _pieces, reply = fold({"error": None, **chunk({"content": "fine"}, "stop")})

    assert reply.text == "fine"


def test_a_refusal_without_content_is_refused():
    with pytest.raises(RefusedReply) as info:
        fold(chunk({"refusal": "I can't "}), chunk({"refusal": "help with\nthat."}, "stop"))

    assert info.value.message == "model refused: I can't help with that."


def test_a_filtered_reply_without_content_is_refused():
    with pytest.raises(RefusedReply) as info:
        fold(chunk({}, "content_filter"))

    assert info.value.message == "model provider blocked the reply (content_filter)"


def test_a_refusal_next_to_content_keeps_the_content():
    _pieces, reply = fold(chunk({"content": "partly", "refusal": "not the rest"}, "stop"))

    assert reply.text == "partly"


def test_a_stream_with_neither_content_nor_finish_reason_is_malformed():
    assert malformed(chunk({"role": "assistant"}), done=False) == "stream ended without content or finish_reason"
    assert malformed(chunk({"role": "assistant"})) == "stream ended without content or finish_reason"


def test_an_empty_reply_that_says_it_stopped_is_an_empty_text():
    _pieces, reply = fold(chunk({}, "stop"))

    assert (reply.text, reply.tool_calls, reply.finish_reason) == ("", (), "stop")


# --- tool calls -----------------------------------------------------------------------------


def test_one_tool_call_is_assembled_from_its_fragments():
    _pieces, reply = fold(
        chunk({"role": "assistant", "content": None}),
        calls_chunk(call_fragment(0, id="call_a", name="read", arguments="")),
        calls_chunk(call_fragment(0, arguments='{"pa')),
        calls_chunk(call_fragment(0, arguments='th": "a.txt"')),
        calls_chunk(call_fragment(0, arguments="}")),
        chunk({}, "tool_calls"),
    )

    assert reply.text == ""
    assert reply.tool_calls == (ToolCall(id="call_a", name="read", arguments='{"path": "a.txt"}'),)
    assert reply.finish_reason == "tool_calls"


def test_several_calls_in_one_reply_keep_their_order_and_their_own_arguments():
    _pieces, reply = fold(
        chunk({"content": "Let me look."}),
        calls_chunk(call_fragment(0, id="call_a", name="read", arguments='{"path":')),
        calls_chunk(call_fragment(0, arguments=' "a"}')),
        calls_chunk(call_fragment(1, id="call_b", name="ls", arguments="")),
        calls_chunk(call_fragment(1, arguments='{"path": "."}'), call_fragment(2, id="call_c", name="find")),
        chunk({}, "tool_calls"),
    )

    assert reply.text == "Let me look."
    assert reply.tool_calls == (
        ToolCall("call_a", "read", '{"path": "a"}'),
        ToolCall("call_b", "ls", '{"path": "."}'),
        ToolCall("call_c", "find", "{}"),  # no arguments at all: an empty object
    )


def test_interleaved_fragments_go_to_the_call_their_index_names():
    _pieces, reply = fold(
        calls_chunk(call_fragment(0, id="a", name="one", arguments="[1"), call_fragment(1, id="b", name="two")),
        calls_chunk(call_fragment(1, arguments="[2]"), call_fragment(0, arguments="]")),
        chunk({}, "tool_calls"),
    )

    assert reply.tool_calls == (ToolCall("a", "one", "[1]"), ToolCall("b", "two", "[2]"))


def test_a_server_that_repeats_the_id_type_and_name_on_every_fragment_is_understood():
    _pieces, reply = fold(
        calls_chunk(call_fragment(0, id="call_a", name="write", arguments='{"x":')),
        calls_chunk(call_fragment(0, id="call_a", name="write", arguments=" 1}")),
        chunk({}, "tool_calls"),
    )

    assert reply.tool_calls == (ToolCall("call_a", "write", '{"x": 1}'),)


def test_the_whole_call_in_one_chunk_with_the_finish_reason():
    _pieces, reply = fold(calls_chunk(call_fragment(0, id="c1", name="ls", arguments='{"path":"."}'), finish="stop"))

    # Some servers say "stop" next to their calls: the calls are kept and the reason is reported as sent.
    assert (reply.tool_calls, reply.finish_reason) == ((ToolCall("c1", "ls", '{"path":"."}'),), "stop")


def test_fragments_without_an_index_continue_the_newest_call_until_a_new_id():
    _pieces, reply = fold(
        calls_chunk(call_fragment(id="a", name="one", arguments='{"n":')),
        calls_chunk(call_fragment(arguments=" 1}")),
        calls_chunk(call_fragment(id="b", name="two", arguments="{}")),
        calls_chunk(call_fragment(id="b", arguments="")),
        chunk({}, "tool_calls"),
    )

    assert reply.tool_calls == (ToolCall("a", "one", '{"n": 1}'), ToolCall("b", "two", "{}"))


def test_a_server_that_numbers_every_call_zero_is_told_apart_by_the_ids():
    _pieces, reply = fold(
        calls_chunk(call_fragment(0, id="a", name="one", arguments='{"n": 1}')),
        calls_chunk(call_fragment(0, id="b", name="two", arguments='{"n":')),
        calls_chunk(call_fragment(0, arguments=" 2}")),
        chunk({}, "tool_calls"),
    )

    assert reply.tool_calls == (ToolCall("a", "one", '{"n": 1}'), ToolCall("b", "two", '{"n": 2}'))


def test_an_id_that_arrives_after_the_first_fragment_is_taken():
    _pieces, reply = fold(
        calls_chunk(call_fragment(0, name="ls")),
        calls_chunk(call_fragment(0, id="late", arguments="{}")),
        chunk({}, "tool_calls"),
    )

    assert reply.tool_calls == (ToolCall("late", "ls", "{}"),)


def test_a_call_without_any_id_gets_one_made_up_once():
    state = StreamState()
    state.feed_chunk(
        calls_chunk(call_fragment(0, name="ls", arguments="{}"), call_fragment(1, name="ls"), finish="tool_calls")
    )

    first, second = state.reply().tool_calls
    assert first.id.startswith("call_") and second.id.startswith("call_") and first.id != second.id
    assert state.reply().tool_calls == (first, second)  # the same ids when asked again


def test_arguments_sent_as_an_object_become_its_json_text():
    _pieces, reply = fold(
        calls_chunk(call_fragment(0, id="a", name="w", arguments={"text": "é", "n": 1}), finish="tool_calls")
    )

    assert reply.tool_calls[0].arguments == '{"text":"é","n":1}'


def test_arguments_that_are_not_json_are_passed_on_as_written():
    _pieces, reply = fold(calls_chunk(call_fragment(0, id="a", name="w", arguments="{oops"), finish="tool_calls"))

    assert reply.tool_calls == (ToolCall("a", "w", "{oops"),)  # the tools say what is wrong with them


def test_blank_arguments_are_an_empty_object():
    _pieces, reply = fold(calls_chunk(call_fragment(0, id="a", name="w", arguments="  "), finish="tool_calls"))

    assert reply.tool_calls[0].arguments == "{}"


def test_tool_calls_and_no_text_are_complete_with_done_and_no_finish_reason():
    _pieces, reply = fold(calls_chunk(call_fragment(0, id="a", name="ls", arguments="{}")))

    assert (reply.tool_calls, reply.finish_reason) == ((ToolCall("a", "ls", "{}"),), "tool_calls")


def test_tool_calls_cut_off_before_finish_reason_or_done_are_malformed():
    why = malformed(calls_chunk(call_fragment(0, id="a", name="ls", arguments='{"pa')), done=False)

    assert why == "stream ended before its tool calls were complete"


def test_tool_calls_after_text_cut_off_are_malformed_too():
    why = malformed(chunk({"content": "Looking."}), calls_chunk(call_fragment(0, id="a", name="ls")), done=False)

    assert why == "stream ended before its tool calls were complete"


def test_tool_calls_in_a_json_body():
    state = StreamState()
    text = state.feed_completion(
        {
            "id": "chatcmpl-j",
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "a", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}},
                            {"id": "b", "type": "function", "function": {"name": "ls", "arguments": ""}},
                        ],
                    }
                }
            ],
        }
    )

    assert text == ""
    reply = state.reply()
    assert reply.tool_calls == (ToolCall("a", "read", '{"p": 1}'), ToolCall("b", "ls", "{}"))
    assert reply.finish_reason == "tool_calls"  # a body with calls and no finish_reason asks for them


@pytest.mark.parametrize(
    ("tool_calls", "why"),
    [
        ({"0": {}}, "delta tool_calls is not a list"),
        (["call"], "delta tool call is not a JSON object"),
        ([{"index": -1}], "tool call index is not a non-negative integer"),
        ([{"index": "0"}], "tool call index is not a non-negative integer"),
        ([{"index": True}], "tool call index is not a non-negative integer"),
        ([{"index": 0, "id": 5}], "tool call id is not a string"),
        ([{"index": 0, "function": "ls"}], "tool call function is not a JSON object"),
        ([{"index": 0, "function": {"name": ["ls"]}}], "tool call name is not a string"),
        ([{"index": 0, "function": {"name": "ls", "arguments": 5}}], "tool call arguments is not a string"),
    ],
)
def test_tool_call_fragments_outside_the_format_are_malformed(tool_calls, why):
    assert malformed(chunk({"tool_calls": tool_calls})) == why


def test_json_body_tool_calls_outside_the_format_are_malformed():
    with pytest.raises(MalformedReply) as info:
        StreamState().feed_completion({"choices": [{"message": {"tool_calls": "ls"}}]})

    assert info.value.why == "message tool_calls is not a list"


def test_a_call_whose_name_never_arrives_is_malformed():
    why = malformed(
        calls_chunk(call_fragment(0, id="a", name="ls", arguments="{}")),
        calls_chunk(call_fragment(1, id="b", arguments="{}")),
        chunk({}, "tool_calls"),
    )

    assert why == "tool call 1 has no name"


def test_a_call_that_changes_its_name_is_malformed():
    why = malformed(
        calls_chunk(call_fragment(0, id="a", name="read")),
        calls_chunk(call_fragment(0, name="write", arguments="{}")),
    )

    assert why == "tool call 0 changed its name"


# --- bounds ---------------------------------------------------------------------------------


def test_64_calls_are_taken_and_a_65th_is_malformed():
    fragments = [call_fragment(i, id=f"c{i}", name="ls", arguments="{}") for i in range(MAX_TOOL_CALLS)]
    _pieces, reply = fold(calls_chunk(*fragments, finish="tool_calls"))
    assert len(reply.tool_calls) == MAX_TOOL_CALLS == 64

    extra = call_fragment(MAX_TOOL_CALLS, id="one-too-many", name="ls")
    assert malformed(calls_chunk(*fragments, extra)) == "more than 64 tool calls in one reply"


def test_arguments_of_one_mib_are_taken_and_a_byte_more_is_malformed():
    half = MAX_ARGUMENTS_BYTES // 2
    _pieces, reply = fold(
        calls_chunk(call_fragment(0, id="a", name="w", arguments="x" * half)),
        calls_chunk(call_fragment(0, arguments="y" * half)),
        calls_chunk(call_fragment(1, id="b", name="w", arguments="z" * half)),  # the bound is per call
        chunk({}, "tool_calls"),
    )
    assert len(reply.tool_calls[0].arguments) == MAX_ARGUMENTS_BYTES == 1024 * 1024

    why = malformed(
        calls_chunk(call_fragment(0, id="a", name="w", arguments="x" * (MAX_ARGUMENTS_BYTES - 1))),
        calls_chunk(call_fragment(0, arguments="é")),  # two bytes: the bound counts UTF-8 bytes, not characters
    )
    assert why == "tool call arguments larger than 1048576 bytes"


def test_a_lone_surrogate_in_arguments_is_counted_and_passed_on():
    _pieces, reply = fold(calls_chunk(call_fragment(0, id="a", name="w", arguments="\ud800"), finish="tool_calls"))

    assert reply.tool_calls[0].arguments == "\ud800"


def test_names_of_128_characters_are_taken_and_longer_ones_are_malformed():
    name = "n" * MAX_NAME_CHARS
    _pieces, reply = fold(calls_chunk(call_fragment(0, id="a", name=name), finish="tool_calls"))
    assert reply.tool_calls[0].name == name

    why = malformed(calls_chunk(call_fragment(0, id="a", name=name + "n")))
    assert why == "tool call name longer than 128 characters"


def test_ids_of_256_characters_are_taken_and_longer_ones_are_malformed():
    call_id = "i" * MAX_ID_CHARS
    _pieces, reply = fold(calls_chunk(call_fragment(0, id=call_id, name="ls"), finish="tool_calls"))
    assert reply.tool_calls[0].id == call_id

    why = malformed(calls_chunk(call_fragment(0, id=call_id + "i", name="ls")))
    assert why == "tool call id longer than 256 characters"


def test_a_tool_call_in_openais_shape():
    assert ToolCall("a", "ls", "{}").as_openai() == {
        "id": "a",
        "type": "function",
        "function": {"name": "ls", "arguments": "{}"},
    }
