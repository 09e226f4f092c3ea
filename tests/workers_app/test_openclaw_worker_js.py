"""The project's worker in OpenClaw's bundle format (``workers_app/openclaw_worker/worker.mjs``), run with the Node
of the workplace's ``openclaw-cli`` tool: its ``node --test`` suite (the worker spawned as OpenClaw's node supervisor
spawns it, against a gateway double; its result lines checked with OpenClaw's own parser), and the parity of its
event-stream folding with the Python worker's (``openclaw_client.agent.openai_stream``)."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from openclaw_client.agent.loop import AgentLoop, Approval, LoopAborted, ModelReply, StepLimitReached
from openclaw_client.agent.openai_stream import ReplyError, StreamState, ToolCall
from tests.support.openclaw_cli import node_binary, openclaw_dist
from tests.support.processes import ROOT

pytestmark = pytest.mark.openclaw_cli

WORKER_DIR = ROOT / "workers_app" / "openclaw_worker"
FOLD_STREAM = WORKER_DIR / "tests" / "fold_stream.mjs"
DRIVE_LOOP = WORKER_DIR / "tests" / "drive_loop.mjs"
BUNDLE_MODULES = ("agent_loop.mjs", "reply_stream.mjs")
# Tests the suite must run: a change that drops some is a failure too.
MIN_NODE_TESTS = 44


@pytest.fixture(scope="module")
def node() -> Path:
    return node_binary()


def test_worker_mjs_passes_its_node_test_suite(node):
    env = {**os.environ, "OPENCLAW_DIST": str(openclaw_dist())}
    completed = subprocess.run(
        [
            str(node),
            "--test",
            "--test-reporter=tap",
            *sorted(str(path) for path in (WORKER_DIR / "tests").glob("worker*.test.mjs")),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=WORKER_DIR,
        env=env,
    )
    assert completed.returncode == 0, completed.stdout[-8000:] + completed.stderr[-4000:]
    summary = dict(re.findall(r"^# (pass|fail|cancelled) (\d+)$", completed.stdout, re.MULTILINE))
    assert summary["fail"] == "0" and summary["cancelled"] == "0"
    assert int(summary["pass"]) >= MIN_NODE_TESTS - 1  # the test through the real tools.mjs skips without it


def _node_json(node: Path, args: list[Path], payload: Any) -> Any:
    """What a node script prints (JSON) for ``payload`` (JSON on its stdin)."""
    completed = subprocess.run(
        [str(node), *map(str, args)], input=json.dumps(payload), capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(completed.stdout)


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return "data: " + json.dumps({"id": "chatcmpl-9", "model": "m-1", "choices": choices, **extra})


def _call(index: int | None, **fields: Any) -> dict[str, Any]:
    return ({"index": index} if index is not None else {}) | fields


STOP = _chunk({}, "stop")
DONE = "data: [DONE]"
# Event streams in every shape the Python folder documents, accepts or refuses.
STREAMS: list[list[str]] = [
    [_chunk({"content": "Hel"}), "", _chunk({"content": "lo"}), STOP, DONE],
    [
        _chunk({"content": "a"}),
        _chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 9}),
        STOP,
    ],
    [_chunk({"content": "x"}, "stop", usage={"input": 1, "output": 2, "totalTokens": 3}), DONE],
    [": keep-alive", "event: message", "id: 4", "retry: 10", _chunk({"content": "ok"}, "stop"), DONE],
    ['data: {"choices": [{"delta":', 'data:  {"content": "split"}, "finish_reason": "stop"}]}', DONE],
    # tool calls: by index; the id repeated; the whole call at once; no index; every call 0; object arguments
    [
        _chunk({"tool_calls": [_call(0, id="c1", type="function", function={"name": "read", "arguments": '{"pa'})]}),
        _chunk({"tool_calls": [_call(0, function={"arguments": 'th":"a"}'})]}),
        _chunk({"tool_calls": [_call(1, id="c2", function={"name": "ls", "arguments": "{}"})]}),
        _chunk({}, "tool_calls"),
        DONE,
    ],
    [
        _chunk({"tool_calls": [_call(0, id="c1", function={"name": "read", "arguments": "{"})]}),
        _chunk({"tool_calls": [_call(0, id="c1", function={"name": "read", "arguments": "}"})]}),
        DONE,
    ],
    [_chunk({"tool_calls": [_call(None, id="c1", function={"name": "exec", "arguments": '{"command":"ls"}'})]}), DONE],
    [
        _chunk({"tool_calls": [_call(None, id="c1", function={"name": "read", "arguments": '{"path":'})]}),
        _chunk({"tool_calls": [_call(None, function={"arguments": '"x"}'})]}),
        _chunk({"tool_calls": [_call(None, id="c2", function={"name": "ls", "arguments": "{}"})]}),
        _chunk({}, "tool_calls"),
    ],
    [
        _chunk({"tool_calls": [_call(0, id="c1", function={"name": "read", "arguments": "{}"})]}),
        _chunk({"tool_calls": [_call(0, id="c2", function={"name": "ls", "arguments": "{}"})]}),
        DONE,
    ],
    [_chunk({"tool_calls": [_call(0, id="c1", function={"name": "read", "arguments": {"path": "é"}})]}), DONE],
    [_chunk({"tool_calls": [_call(0, function={"name": "read"})]}), DONE],  # no id: one is made up
    [_chunk({"content": "Let me look.", "tool_calls": [_call(0, id="c1", function={"name": "ls"})]}, "tool_calls")],
    # refusals and reported errors
    [_chunk({"refusal": "I cannot   help\nwith that"}, "stop"), DONE],
    [_chunk({}, "content_filter"), DONE],
    ['data: {"error": {"kind": "rate_limit", "message": "slow down"}}'],
    [_chunk({"content": "par"}), 'data: {"error": {"message": "upstream failed"}}'],
    # malformed
    ["garbage"],
    ["data: {not json", ""],
    ["data: {not json"],
    ['data: {"id": "x"}'],
    ['data: {"choices": {}}'],
    ['data: ["list"]'],
    [_chunk({"content": 5})],
    ['data: {"choices": [{"delta": "text"}]}'],
    ['data: {"choices": ["nope"]}'],
    [_chunk({"tool_calls": {}})],
    [_chunk({"tool_calls": ["x"]})],
    [_chunk({"tool_calls": [_call(-1, id="c", function={"name": "ls"})]})],
    [_chunk({"tool_calls": [_call(0, id=5, function={"name": "ls"})]})],
    [_chunk({"tool_calls": [_call(0, id="i" * 257, function={"name": "ls"})]})],
    [_chunk({"tool_calls": [_call(0, id="c", function={"name": "n" * 129})]})],
    [_chunk({"tool_calls": [_call(0, id="c", function={"name": 7})]})],
    [_chunk({"tool_calls": [_call(0, id="c", function="ls")]})],
    [_chunk({"tool_calls": [_call(0, id="c", function={"name": "ls", "arguments": 3})]})],
    [
        _chunk({"tool_calls": [_call(0, id="c", function={"name": "ls"})]}),
        _chunk({"tool_calls": [_call(0, function={"name": "read"})]}),
    ],
    [_chunk({"tool_calls": [_call(0, id="c", function={"arguments": "{}"})]}), DONE],
    [_chunk({"tool_calls": [_call(n, id=f"c{n}", function={"name": "ls"}) for n in range(65)]})],
    [_chunk({"tool_calls": [_call(0, id="c", function={"name": "write", "arguments": "x" * (1024 * 1024 + 1)})]})],
    [_chunk({"tool_calls": [_call(0, id="c1", function={"name": "ls", "arguments": "{}"})]})],  # cut short
    [_chunk({"content": ""})],
    [],
]


def _python_fold(lines: list[str]) -> dict[str, Any]:
    state = StreamState()
    pieces: list[str] = []
    try:
        for line in lines:
            pieces.append(state.feed_line(line))
        state.end_of_stream()
        reply = state.reply()
    except ReplyError as error:
        return {"pieces": pieces, "error": {"type": type(error).__name__, "message": str(error)}}
    calls = [{"id": call.id, "name": call.name, "arguments": call.arguments} for call in reply.tool_calls]
    return {
        "pieces": pieces,
        "reply": {
            "text": reply.text,
            "tool_calls": calls,
            "finish_reason": reply.finish_reason,
            "usage": reply.usage,
            "response_id": reply.response_id,
            "model": reply.model,
        },
    }


def _comparable(folded: dict[str, Any]) -> dict[str, Any]:
    """Made-up call ids are random, and Python's JSON decoder words its own part of one message."""
    text = json.dumps(folded)
    text = re.sub(r'"call_[0-9a-f]{24}"', '"call_<made-up>"', text)
    text = re.sub(r"invalid JSON in stream event \([^)]*\)", "invalid JSON in stream event", text)
    return json.loads(text)


def test_the_event_stream_folds_as_the_python_worker_folds_it(node):
    folded = _node_json(node, [FOLD_STREAM], STREAMS)
    assert len(folded) == len(STREAMS)
    for lines, javascript in zip(STREAMS, folded, strict=True):
        assert _comparable(javascript) == _comparable(_python_fold(lines)), lines[:3]
    outcomes = {"error" if "error" in item else "reply" for item in folded}
    assert outcomes == {"error", "reply"}


# --- the agent loop ---------------------------------------------------------------------------------------------


def _reply(text: str = "", calls: tuple[tuple[str, str, str], ...] = (), **fields: Any) -> dict[str, Any]:
    return {
        "text": text,
        "toolCalls": [{"id": call_id, "name": name, "arguments": arguments} for call_id, name, arguments in calls],
        "stopReason": fields.get("stopReason", "tool_calls" if calls else "stop"),
        "usage": fields.get("usage"),
        "model": fields.get("model"),
    }


USER = [{"role": "user", "content": "do it"}]
USAGE = {"input": 3, "output": 4, "totalTokens": 7}
# (messages, max steps, tools started before the turn is stopped (None: never), the model's replies)
LOOP_CASES: list[tuple[list[dict[str, Any]], int, int | None, list[dict[str, Any]]]] = [
    (USER, 4, None, [_reply("Hi there.", usage=USAGE, model="m-1")]),
    (
        USER,
        4,
        None,
        [
            _reply(calls=(("c1", "read", '{"path": "a.txt"}'),), usage=USAGE, model="m-1"),
            _reply("Done.", usage={"input": 10, "output": 1, "totalTokens": 11}, model="m-2"),
        ],
    ),
    (
        USER,
        4,
        None,
        [
            _reply("Looking.", calls=(("c1", "ls", "not json"), ("c2", "find", "[1]"), ("c3", "grep", "  "))),
            _reply("", stopReason="length"),
        ],
    ),
    (USER, 2, None, [_reply(calls=(("c1", "exec", '{"command":"ls"}'),)), _reply(calls=(("c2", "exec", "{}"),))]),
    (USER, 4, 1, [_reply(calls=(("c1", "read", "{}"), ("c2", "read", "{}"), ("c3", "exec", "{}")), usage=USAGE)]),
]


class _ScriptedHooks:
    """loop.py's hooks on scripted replies, recording what the loop gives them (drive_loop.mjs's twin)."""

    def __init__(self, replies: list[dict[str, Any]], abort_after: int | None):
        self.replies = replies
        self.abort_after = abort_after
        self.recorded: list[dict[str, Any]] = []
        self.started: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []

    def model_step(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], step: int) -> ModelReply:
        self.steps.append({"step": step, "context": json.loads(json.dumps(messages)), "tools": tools})
        reply = self.replies[step - 1]
        calls = tuple(ToolCall(call["id"], call["name"], call["arguments"]) for call in reply["toolCalls"])
        return ModelReply(reply["text"], calls, reply["stopReason"], reply["usage"], reply["model"])

    def record_message(self, message: dict[str, Any], full_text: str | None) -> dict[str, Any]:
        self.recorded.append({"message": message, "fullText": full_text})
        return message

    def tool_started(self, call_id: str, name: str, arguments: dict[str, Any]) -> None:
        self.started.append({"callId": call_id, "name": name, "args": arguments})

    def tool_finished(self, call_id: str, name: str, message: dict[str, Any]) -> None:
        pass

    def approve_exec(self, call_id: str, request: Any) -> Approval:
        raise AssertionError("a turn without a workspace asks for no approval")

    def wait_for(self, work: Any, cancel: Any) -> Any:
        raise AssertionError("a turn without a workspace runs no tool")

    def should_abort(self) -> bool:
        return self.abort_after is not None and len(self.started) >= self.abort_after


def _python_loop(messages: list[dict[str, Any]], max_steps: int, abort_after: int | None, replies: list) -> dict:
    hooks = _ScriptedHooks(replies, abort_after)
    context = json.loads(json.dumps(messages))
    try:
        outcome = AgentLoop(hooks, None, max_steps=max_steps).run(context)
    except (StepLimitReached, LoopAborted) as error:
        ended: dict[str, Any] = {"error": {"type": type(error).__name__, "message": str(error)}}
    else:
        ended = {
            "ok": {
                "text": outcome.text,
                "stopReason": outcome.stop_reason,
                "usage": outcome.usage,
                "model": outcome.model,
                "steps": outcome.steps,
            }
        }
    return {
        "recorded": hooks.recorded,
        "started": hooks.started,
        "steps": hooks.steps,
        "outcome": ended,
        "context": context,
    }


def _without_timestamps(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: 0 if key == "timestamp" else _without_timestamps(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_timestamps(item) for item in value]
    return value


def test_the_agent_loop_records_what_the_python_loop_records(node, tmp_path):
    """Messages, keys in their order, tool starts, the model's context at each step, and how the loop ends."""
    for module in BUNDLE_MODULES:
        (tmp_path / module).write_bytes((WORKER_DIR / module).read_bytes())
    (tmp_path / "tools.mjs").write_bytes((WORKER_DIR / "tests" / "fake_tools.mjs").read_bytes())
    cases = [
        {"messages": messages, "maxSteps": max_steps, "abortAfter": abort_after, "replies": replies}
        for messages, max_steps, abort_after, replies in LOOP_CASES
    ]
    driven = _node_json(node, [DRIVE_LOOP, tmp_path], cases)
    assert len(driven) == len(LOOP_CASES)
    for case, javascript in zip(LOOP_CASES, driven, strict=True):
        python = _python_loop(*case)
        # Compared as text: the same keys in the same order, as the gateway stores them.
        as_text = functools.partial(json.dumps, ensure_ascii=False)
        assert as_text(_without_timestamps(javascript)) == as_text(_without_timestamps(python)), case
    endings = [next(iter(item["outcome"].values())) for item in driven]
    assert {ending.get("type") for ending in endings} == {None, "StepLimitReached", "LoopAborted"}
