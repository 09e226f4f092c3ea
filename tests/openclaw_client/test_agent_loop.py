"""The agent loop on its own: scripted model replies, a real tool runner on a temporary workspace."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from openclaw_client.agent.loop import (
    NO_RESULT,
    AgentLoop,
    Approval,
    LoopAborted,
    ModelReply,
    StepLimitReached,
    openai_messages,
)
from openclaw_client.agent.openai_stream import ToolCall
from openclaw_client.agent.tools import ExecRequest, ToolResult, ToolRunner, Workspace


def call(call_id: str, name: str, arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments if isinstance(arguments, str) else json.dumps(arguments))


class ScriptedHooks:
    """Answers each model step from a script; records what the loop reports."""

    def __init__(self, replies: list[ModelReply], *, approve: Callable[[ExecRequest], Approval] | None = None):
        self.replies = list(replies)
        self.sent: list[list[dict[str, Any]]] = []
        self.tools_offered: list[list[dict[str, Any]]] = []
        self.recorded: list[dict[str, Any]] = []
        self.full_texts: list[str | None] = []
        self.started: list[tuple[str, str, dict]] = []
        self.finished: list[tuple[str, str]] = []
        self.approvals: list[ExecRequest] = []
        self.approve = approve or (lambda request: Approval(True))
        self.abort = threading.Event()

    def model_step(self, messages, tools, step):
        self.sent.append(json.loads(json.dumps(messages)))
        self.tools_offered.append(tools)
        return self.replies.pop(0)

    def record_message(self, message, full_text):
        self.recorded.append(message)
        self.full_texts.append(full_text)
        return message

    def tool_started(self, call_id, name, arguments):
        self.started.append((call_id, name, arguments))

    def tool_finished(self, call_id, name, message):
        self.finished.append((call_id, name))

    def approve_exec(self, call_id, request):
        self.approvals.append(request)
        return self.approve(request)

    def wait_for(self, work, cancel):
        return work()

    def should_abort(self):
        return self.abort.is_set()


def reply(text: str = "", *calls: ToolCall) -> ModelReply:
    return ModelReply(
        text=text,
        tool_calls=tuple(calls),
        stop_reason="tool_calls" if calls else "stop",
        usage={"input": 10, "output": 2, "totalTokens": 12},
    )


@pytest.fixture
def runner(tmp_path) -> ToolRunner:
    return ToolRunner(Workspace(tmp_path))


def test_a_turn_without_tool_calls_is_one_step(runner):
    hooks = ScriptedHooks([reply("hello")])
    outcome = AgentLoop(hooks, runner).run([{"role": "user", "content": "hi"}])
    assert (outcome.text, outcome.steps, outcome.stop_reason) == ("hello", 1, "stop")
    assert hooks.recorded == []
    assert {tool["function"]["name"] for tool in hooks.tools_offered[0]} >= {"read", "write", "edit", "exec"}


def test_tool_calls_run_and_their_results_reach_the_model(runner, tmp_path):
    hooks = ScriptedHooks(
        [
            reply("writing", call("c1", "write", {"path": "a.txt", "content": "one\n"})),
            reply("", call("c2", "read", {"path": "a.txt"})),
            reply("done"),
        ]
    )
    messages = [{"role": "user", "content": "go"}]
    outcome = AgentLoop(hooks, runner).run(messages)
    assert outcome.text == "done" and outcome.steps == 3
    assert outcome.usage == {"input": 30, "output": 6, "totalTokens": 36}
    assert (tmp_path / "a.txt").read_text() == "one\n"
    roles = [m["role"] for m in hooks.recorded]
    assert roles == ["assistant", "toolResult", "assistant", "toolResult"]
    assert hooks.recorded[0]["content"][0] == {"type": "text", "text": "writing"}
    assert hooks.recorded[0]["content"][1] == {
        "type": "toolCall",
        "id": "c1",
        "name": "write",
        "arguments": {"path": "a.txt", "content": "one\n"},
    }
    assert hooks.recorded[0]["stopReason"] == "toolUse"
    assert hooks.recorded[3]["toolCallId"] == "c2" and not hooks.recorded[3]["isError"]
    assert "one" in hooks.recorded[3]["content"][0]["text"]
    # The third model call saw both calls answered, in the chat-completions shape.
    third = hooks.sent[2]
    assert [m["role"] for m in third] == ["user", "assistant", "tool", "assistant", "tool"]
    assert third[1]["tool_calls"][0]["function"]["name"] == "write"
    assert third[4]["tool_call_id"] == "c2" and "one" in third[4]["content"]
    assert hooks.started == [
        ("c1", "write", {"path": "a.txt", "content": "one\n"}),
        ("c2", "read", {"path": "a.txt"}),
    ]
    assert hooks.finished == [("c1", "write"), ("c2", "read")]


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("teleport", {"to": "mars"}, "unknown tool"),
        ("write", "{not json", "invalid"),
        ("write", {"path": "a.txt"}, "content"),
        ("read", ["a"], "invalid"),
    ],
)
def test_a_malformed_call_is_the_tools_error_and_the_turn_goes_on(runner, name, arguments, expected):
    hooks = ScriptedHooks([reply("", call("c1", name, arguments)), reply("recovered")])
    outcome = AgentLoop(hooks, runner).run([{"role": "user", "content": "go"}])
    assert outcome.text == "recovered"
    result = hooks.recorded[1]
    assert result["isError"] is True
    assert expected in result["content"][0]["text"].lower()
    if isinstance(arguments, str):
        assert hooks.recorded[0]["content"][0]["arguments"] == {"raw": arguments}


def test_the_step_limit_ends_the_turn(runner):
    looping = [reply("", call(f"c{i}", "ls", {})) for i in range(3)]
    hooks = ScriptedHooks(looping)
    with pytest.raises(StepLimitReached, match="after 3 model steps"):
        AgentLoop(hooks, runner, max_steps=3).run([{"role": "user", "content": "go"}])
    assert len(hooks.sent) == 3


def test_exec_asks_for_approval_and_a_denial_reaches_the_model(runner, tmp_path):
    hooks = ScriptedHooks(
        [reply("", call("c1", "exec", {"command": "touch made"})), reply("ok")],
        approve=lambda request: Approval(False, "exec denied by an operator"),
    )
    AgentLoop(hooks, runner).run([{"role": "user", "content": "go"}])
    assert hooks.approvals[0].command == "touch made"
    assert hooks.approvals[0].workdir == str(tmp_path.resolve())
    assert hooks.recorded[1]["isError"] and "denied" in hooks.recorded[1]["content"][0]["text"]
    assert not (tmp_path / "made").exists()


def test_an_approved_exec_runs(runner, tmp_path):
    hooks = ScriptedHooks([reply("", call("c1", "exec", {"command": "echo hi > made"})), reply("ok")])
    AgentLoop(hooks, runner).run([{"role": "user", "content": "go"}])
    assert (tmp_path / "made").read_text() == "hi\n"
    assert hooks.recorded[1]["details"]["exitCode"] == 0


def test_an_abort_between_calls_records_the_rest_as_not_run(runner, tmp_path):
    hooks = ScriptedHooks(
        [
            reply(
                "",
                call("c1", "write", {"path": "first", "content": "1"}),
                call("c2", "write", {"path": "second", "content": "2"}),
            )
        ]
    )
    original = hooks.tool_finished

    def finished(call_id, name, message):
        original(call_id, name, message)
        hooks.abort.set()

    hooks.tool_finished = finished
    with pytest.raises(LoopAborted):
        AgentLoop(hooks, runner).run([{"role": "user", "content": "go"}])
    assert (tmp_path / "first").exists() and not (tmp_path / "second").exists()
    not_run = hooks.recorded[-1]
    assert not_run["toolCallId"] == "c2" and not_run["isError"]
    assert "aborted" in not_run["content"][0]["text"]


def test_an_abort_while_waiting_for_approval_stops_the_turn(runner, tmp_path):
    hooks = ScriptedHooks(
        [reply("", call("c1", "exec", {"command": "touch made"}))],
        approve=lambda request: Approval(False, "not run: the turn was aborted", aborted=True),
    )
    with pytest.raises(LoopAborted):
        AgentLoop(hooks, runner).run([{"role": "user", "content": "go"}])
    assert not (tmp_path / "made").exists()
    assert hooks.recorded[-1]["details"].get("aborted") is True


def test_without_a_workspace_no_tools_are_offered_and_a_call_is_refused():
    hooks = ScriptedHooks([reply("", call("c1", "read", {"path": "x"})), reply("ok")])
    AgentLoop(hooks, None).run([{"role": "user", "content": "go"}])
    assert hooks.tools_offered[0] == []
    assert hooks.recorded[1]["isError"] and "no workspace" in hooks.recorded[1]["content"][0]["text"]


def test_a_truncated_result_hands_its_whole_output_to_the_recorder(tmp_path):
    class Truncating(ToolRunner):
        def run(self, prepared, *, cancel=None):
            return ToolResult(text="head…", is_error=False, details={"truncated": True}, full_text="head and tail")

    hooks = ScriptedHooks([reply("", call("c1", "ls", {})), reply("ok")])
    AgentLoop(hooks, Truncating(Workspace(tmp_path))).run([{"role": "user", "content": "go"}])
    assert hooks.full_texts == [None, "head and tail"]


def test_the_context_leaves_out_entries_kept_only_for_people():
    """A command typed in chat and the gateway's reply are in the transcript, marked excludeFromContext."""
    transcript = [
        {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        {"role": "user", "content": [{"type": "text", "text": "/status"}], "excludeFromContext": True},
        {"role": "assistant", "content": [{"type": "text", "text": "status"}], "excludeFromContext": True},
        {"role": "user", "content": [{"type": "text", "text": "more"}], "excludeFromContext": False},
    ]
    assert openai_messages(transcript) == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "more"},
    ]


def test_the_context_answers_every_call_and_drops_orphan_results():
    transcript = [
        {"role": "toolResult", "toolCallId": "old", "content": [{"type": "text", "text": "cut off"}]},
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "on it"},
                {"type": "toolCall", "id": "a", "name": "ls", "arguments": {}},
                {"type": "toolCall", "id": "b", "name": "write", "arguments": {"raw": "{bad"}},
            ],
        },
        {"role": "toolResult", "toolCallId": "a", "content": [{"type": "text", "text": "x.txt"}]},
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
    ]
    messages = openai_messages(transcript)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "user"]
    assert messages[1]["content"] == "on it"
    assert messages[1]["tool_calls"][1]["function"]["arguments"] == "{bad"
    assert messages[2] == {"role": "tool", "tool_call_id": "a", "content": "x.txt"}
    assert messages[3] == {"role": "tool", "tool_call_id": "b", "content": NO_RESULT}
