"""The agent loop: model → tool calls → results → model … until the model answers without tool calls.

One loop for every place a turn runs: the gateway's own turn (a session on the gateway's workspace) and
the worker child on a node host (a session placed there). What differs is behind :class:`LoopHooks` —
how the model is asked (the gateway's provider, or its inference proxy), where the transcript goes
(written at once, or sent to the gateway), how an ``exec`` is approved (the gateway's approvals, or a
question to the gateway) — while the tools always run here, through a :class:`ToolRunner` confined to
the session's workspace. Standard library only: it runs from the worker bundle.

Messages are kept twice, in the two shapes they live in: the OpenAI chat-completions messages the model
is sent (``tool_calls``, ``role: "tool"``), and OpenClaw's transcript messages the gateway stores and
``chat.history`` returns (assistant content parts ``{type: "toolCall", id, name, arguments}``, and
``{role: "toolResult", toolCallId, toolName, content, isError}``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .openai_stream import ToolCall
from .tools import ExecRequest, PreparedCall, ToolCallError, ToolResult, ToolRunner

DEFAULT_MAX_STEPS = 24
EXEC_TOOL = "exec"
# What a model's tool-call arguments look like in the transcript when they are not a JSON object.
RAW_ARGUMENTS_KEY = "raw"


class StepLimitReached(Exception):
    """The model kept calling tools past the agent's step limit."""

    def __init__(self, max_steps: int):
        super().__init__(
            f"agent stopped after {max_steps} model steps without a final answer "
            f"(step limit {max_steps}); ask for a smaller task or raise the agent's step limit"
        )
        self.max_steps = max_steps


class LoopAborted(Exception):
    """The turn was asked to stop; what completed before is already recorded."""


@dataclass(frozen=True)
class ModelReply:
    """One model call's answer: its text and the tool calls it asks for (none: the final answer)."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    stop_reason: str
    usage: dict[str, int] | None = None
    model: str | None = None


@dataclass(frozen=True)
class Approval:
    """The decision on one ``exec``: run it, or answer the model with ``reason`` as the tool's error."""

    allowed: bool
    reason: str = ""
    # The turn was aborted while the decision was awaited: the loop records that and stops.
    aborted: bool = False


@dataclass
class LoopOutcome:
    """The final answer, with the usage of every model call of the turn added up."""

    text: str
    stop_reason: str
    usage: dict[str, int] | None
    model: str | None
    steps: int


class LoopHooks(Protocol):
    def model_step(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], step: int) -> ModelReply:
        """Ask the model (streaming its text out as it comes); raises the caller's own errors on failure."""
        ...

    def record_message(self, message: dict[str, Any], full_text: str | None) -> dict[str, Any]:
        """Keep one complete transcript message (an assistant message with tool calls, or a tool result).

        ``full_text`` is a tool's whole output when the message carries a truncated copy; the hook may
        keep it (an artifact) and returns the message as stored, whose text the model is then sent.
        """
        ...

    def tool_started(self, call_id: str, name: str, arguments: dict[str, Any]) -> None: ...

    def tool_finished(self, call_id: str, name: str, message: dict[str, Any]) -> None: ...

    def approve_exec(self, call_id: str, request: ExecRequest) -> Approval:
        """Whether this command may run (policy, and an operator's answer when the policy asks)."""
        ...

    def wait_for(self, work: Callable[[], ToolResult], cancel: threading.Event) -> ToolResult:
        """Run a tool (on another thread) while this one keeps the turn alive; set ``cancel`` on an abort."""
        ...

    def should_abort(self) -> bool: ...


@dataclass
class AgentLoop:
    hooks: LoopHooks
    runner: ToolRunner | None
    max_steps: int = DEFAULT_MAX_STEPS
    tools: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.runner is not None and not self.tools:
            self.tools = self.runner.tool_specs()

    def run(self, messages: list[dict[str, Any]]) -> LoopOutcome:
        """Run the turn on ``messages`` (the model's context, the user's message last; extended in place)."""
        usage: dict[str, int] | None = None
        for step in range(1, self.max_steps + 1):
            reply = self.hooks.model_step(messages, self.tools, step)
            usage = add_usage(usage, reply.usage)
            if not reply.tool_calls:
                return LoopOutcome(reply.text, reply.stop_reason, usage, reply.model, step)
            self.hooks.record_message(assistant_message(reply, usage=reply.usage), None)
            messages.append(openai_assistant_message(reply.text, reply.tool_calls))
            for index, call in enumerate(reply.tool_calls):
                if self.hooks.should_abort():
                    self._abort_remaining(reply.tool_calls[index:], messages)
                    raise LoopAborted()
                result = self._call(call)
                stored = self.hooks.record_message(tool_result_message(call, result), result.full_text)
                self.hooks.tool_finished(call.id, call.name, stored)
                messages.append(openai_tool_message(call.id, message_text(stored)))
                if result.details.get("aborted"):
                    self._abort_remaining(reply.tool_calls[index + 1 :], messages)
                    raise LoopAborted()
        raise StepLimitReached(self.max_steps)

    def _call(self, call: ToolCall) -> ToolResult:
        """One tool call; a malformed call, a refusal or a failure is the tool's error result, never the turn's."""
        arguments = parsed_arguments(call.arguments)
        self.hooks.tool_started(call.id, call.name, arguments)
        if self.runner is None:
            return error_result(f'tool "{call.name}" is not available: this turn has no workspace')
        try:
            prepared = self.runner.prepare(call.name, call.arguments)
            if prepared.name == EXEC_TOOL:
                approval = self.hooks.approve_exec(call.id, self.runner.exec_request(prepared))
                if approval.aborted:
                    return error_result(approval.reason or "not run: the turn was aborted", aborted=True)
                if not approval.allowed:
                    return error_result(approval.reason, denied=True)
        except ToolCallError as error:
            return error_result(error.message)
        return self._run(prepared)

    def _run(self, prepared: PreparedCall) -> ToolResult:
        cancel = threading.Event()
        runner = self.runner
        assert runner is not None
        if prepared.name != EXEC_TOOL:
            # The file tools are bounded in what they read and write (tools.ToolLimits): they run on the turn's
            # own thread. Only a command may run for minutes while the turn must keep heartbeating and hear an abort.
            return runner.run(prepared, cancel=cancel)
        return self.hooks.wait_for(lambda: runner.run(prepared, cancel=cancel), cancel)

    def _abort_remaining(self, calls: tuple[ToolCall, ...], messages: list[dict[str, Any]]) -> None:
        """Calls the model asked for that never ran get a result saying so: the transcript stays well formed
        (every tool call answered), and nothing that did not happen is reported as done."""
        for call in calls:
            result = error_result("not run: the turn was aborted", aborted=True)
            stored = self.hooks.record_message(tool_result_message(call, result), None)
            messages.append(openai_tool_message(call.id, message_text(stored)))


TOOL_POLL_INTERVAL_S = 0.1


def run_watched(
    work: Callable[[], ToolResult], cancel: threading.Event, stop_requested: Callable[[], bool]
) -> ToolResult:
    """Run a tool on a thread of its own while the calling thread keeps the turn alive: it asks
    ``stop_requested`` every 100 ms (an abort, a heartbeat) and sets ``cancel`` once it says stop, then waits
    for the tool to end (a cancelled command ends at once: its process group is killed)."""
    outcome: list[ToolResult | BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as error:  # raised again on the turn's thread below
            outcome.append(error)

    worker = threading.Thread(target=run, name="openclaw-tool", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(TOOL_POLL_INTERVAL_S)
        if not cancel.is_set() and stop_requested():
            cancel.set()
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result


# --- message shapes -----------------------------------------------------------------------------------


def now_ms() -> int:
    return int(time.time() * 1000)


def parsed_arguments(raw: str) -> dict[str, Any]:
    """The model's arguments as shown in the transcript and events: the object, or the raw text it sent."""
    try:
        value = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return {RAW_ARGUMENTS_KEY: raw}
    return value if isinstance(value, dict) else {RAW_ARGUMENTS_KEY: raw}


def assistant_message(reply: ModelReply, *, usage: dict[str, int] | None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    content += [
        {"type": "toolCall", "id": call.id, "name": call.name, "arguments": parsed_arguments(call.arguments)}
        for call in reply.tool_calls
    ]
    message: dict[str, Any] = {"role": "assistant", "content": content, "stopReason": "toolUse", "timestamp": now_ms()}
    if reply.model:
        message["model"] = reply.model
    if usage:
        message["usage"] = usage
    return message


def tool_result_message(call: ToolCall, result: ToolResult) -> dict[str, Any]:
    return {
        "role": "toolResult",
        "toolCallId": call.id,
        "toolName": call.name,
        "content": [{"type": "text", "text": result.text}],
        "details": result.details,
        "isError": result.is_error,
        "timestamp": now_ms(),
    }


def message_text(message: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for part in message.get("content", [])
        if isinstance(part, dict) and part.get("type") == "text"
    )


def error_result(message: str, **details: Any) -> ToolResult:
    return ToolResult(text=message, is_error=True, details=details)


def openai_assistant_message(text: str, calls: tuple[ToolCall, ...]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls
        ],
    }


def openai_tool_message(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


NO_RESULT = "no result was recorded for this tool call (the turn ended before it finished)"


def openai_messages(transcript: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's context from transcript messages (oldest first).

    Every tool call the model is sent is answered: a call whose result was never recorded (its turn was
    interrupted) gets one saying so, and a result whose call is not in the context (cut off by the context
    window) is left out, as a chat-completions API refuses either. Entries marked ``excludeFromContext`` (a
    command typed in chat and the gateway's reply to it) are for people reading the transcript, not the model.
    """
    messages: list[dict[str, Any]] = []
    open_calls: list[str] = []

    def close_open_calls() -> None:
        messages.extend(openai_tool_message(call_id, NO_RESULT) for call_id in open_calls)
        open_calls.clear()

    for body in transcript:
        if body.get("excludeFromContext"):
            continue
        role = body.get("role")
        if role == "toolResult":
            call_id = body.get("toolCallId")
            if call_id in open_calls:
                open_calls.remove(call_id)
                messages.append(openai_tool_message(call_id, message_text(body)))
            continue
        close_open_calls()
        if role == "assistant":
            calls = tuple(
                ToolCall(id=part["id"], name=part.get("name", ""), arguments=_arguments_text(part.get("arguments")))
                for part in body.get("content", [])
                if isinstance(part, dict) and part.get("type") == "toolCall" and isinstance(part.get("id"), str)
            )
            if calls:
                messages.append(openai_assistant_message(message_text(body), calls))
                open_calls.extend(call.id for call in calls)
                continue
            messages.append({"role": "assistant", "content": message_text(body)})
        elif role in ("user", "system"):
            messages.append({"role": role, "content": message_text(body)})
    close_open_calls()
    return messages


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, dict) and set(arguments) == {RAW_ARGUMENTS_KEY}:
        return str(arguments[RAW_ARGUMENTS_KEY])
    return json.dumps(arguments if arguments is not None else {}, separators=(",", ":"))


def add_usage(total: dict[str, int] | None, more: dict[str, Any] | None) -> dict[str, int] | None:
    if not more:
        return total
    summed = dict(total or {})
    for key in ("input", "output", "totalTokens"):
        value = more.get(key)
        if isinstance(value, int):
            summed[key] = summed.get(key, 0) + value
    return summed
