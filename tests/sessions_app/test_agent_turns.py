"""A gateway turn as an agent loop: each step recorded as it happens, the model's context rebuilt from tool
messages, artifacts for large outputs, the step limit, and tool messages like any other entry on a fork."""

from __future__ import annotations

from pathlib import Path

import pytest

from approvals_app.services import exec_approval_request, exec_policy_set
from gateway.audit import Actor
from sessions_app import selectors, turns
from sessions_app.model_providers import ToolCall
from sessions_app.model_providers.base import Delta, Finish
from sessions_app.models import Run, RunStatus, Session, ToolArtifact, TranscriptEvent
from sessions_app.services import forks, runs, sessions

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


def make(key: str = "agent:main:tools", cwd: str = "") -> Session:
    return sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id="main", cwd=cwd))


class ScriptedProvider:
    """Answers each model call with the next scripted reply: text, or tool calls."""

    name = "scripted"

    def __init__(self, *replies: tuple[str, tuple[ToolCall, ...]]):
        self.replies = list(replies)
        self.sent: list[list] = []
        self.tools: list = []

    def stream(self, messages, *, model, should_abort, tools=None):
        self.sent.append(list(messages))
        self.tools.append(tools)
        text, calls = self.replies.pop(0)
        if text:
            yield Delta(text=text)
        yield Finish(
            stop_reason="tool_calls" if calls else "stop",
            usage={"input": 5, "output": 1, "totalTokens": 6},
            response_id=None,
            model=model,
            tool_calls=calls,
        )


def use(monkeypatch, provider: ScriptedProvider) -> ScriptedProvider:
    monkeypatch.setattr(turns, "get_model_provider", lambda: provider)
    return provider


def full_policy() -> None:
    """Nothing asks: the tests here are about the loop, not approvals (approvals_app has its own)."""
    document = {"version": 1, "defaults": {"security": "full", "ask": "off"}}
    exec_policy_set(scope="gateway", file=document, base_hash=None, actor=Actor(label="test", scopes=()))


def bodies(session: Session) -> list[dict]:
    return [e.body for e in TranscriptEvent.objects.filter(window_id=session.session_id).order_by("seq")]


def test_a_turn_runs_tools_in_the_sessions_workspace_and_records_every_step(monkeypatch, tmp_path):
    session = make(cwd=str(tmp_path))
    provider = use(
        monkeypatch,
        ScriptedProvider(
            ("writing", (ToolCall(id="c1", name="write", arguments='{"path": "notes.txt", "content": "hi\\n"}'),)),
            ("", (ToolCall(id="c2", name="read", arguments='{"path": "notes.txt"}'),)),
            ("all done", ()),
        ),
    )
    runs.run_submit(session_key=session.key, message="take notes", idempotency_key="r1")
    assert turns.execute_turn("r1") == "ok"

    assert (tmp_path / "notes.txt").read_text() == "hi\n"
    run = Run.objects.get(run_id="r1")
    assert (run.output_text, run.usage) == ("all done", {"input": 15, "output": 3, "totalTokens": 18})
    recorded = bodies(session)
    assert [b["role"] for b in recorded] == ["user", "assistant", "toolResult", "assistant", "toolResult", "assistant"]
    assert recorded[1]["content"] == [
        {"type": "text", "text": "writing"},
        {"type": "toolCall", "id": "c1", "name": "write", "arguments": {"path": "notes.txt", "content": "hi\n"}},
    ]
    assert recorded[4]["toolCallId"] == "c2" and "hi" in recorded[4]["content"][0]["text"]
    # The third call was sent both calls and their answers, in the chat-completions shape.
    third = provider.sent[2]
    assert [m.role for m in third] == ["user", "assistant", "tool", "assistant", "tool"]
    assert third[1].tool_calls[0].name == "write" and third[2].tool_call_id == "c1"
    assert {tool["function"]["name"] for tool in provider.tools[0]} >= {"read", "write", "exec"}
    # The next turn's context is rebuilt from the transcript the same way.
    history = runs.active_path_messages(runs.SessionWindow.objects.get(pk=session.session_id))
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]


def test_the_step_limit_ends_the_turn_with_an_error(monkeypatch, tmp_path, settings):
    settings.OPENCLAW_AGENT = {**settings.OPENCLAW_AGENT, "MAX_STEPS_BY_AGENT": {"main": 2}}
    session = make(cwd=str(tmp_path))
    call = (ToolCall(id="c", name="ls", arguments="{}"),)
    use(monkeypatch, ScriptedProvider(("", call), ("", call), ("never", ())))
    runs.run_submit(session_key=session.key, message="loop", idempotency_key="r1")
    assert turns.execute_turn("r1") == "error"
    run = Run.objects.get(run_id="r1")
    assert run.error_kind == "step_limit" and "after 2 model steps" in run.error
    assert [b["role"] for b in bodies(session)] == ["user", "assistant", "toolResult", "assistant", "toolResult"]


def test_a_large_output_is_kept_whole_as_an_artifact(monkeypatch, tmp_path):
    full_policy()
    session = make(cwd=str(tmp_path))
    command = '{"command": "python3 -c \\"print(\'x\' * 100000)\\""}'
    use(monkeypatch, ScriptedProvider(("", (ToolCall(id="c1", name="exec", arguments=command),)), ("ok", ())))
    runs.run_submit(session_key=session.key, message="big", idempotency_key="r1")
    assert turns.execute_turn("r1") == "ok"

    result = bodies(session)[2]
    artifact = ToolArtifact.objects.get()
    assert result["details"]["artifactId"] == artifact.id and result["details"]["truncated"] is True
    assert artifact.content.startswith("x" * 1000) and artifact.size_bytes >= 100_000
    assert f"kept as artifact {artifact.id}" in result["content"][-1]["text"]
    assert len(result["content"][0]["text"]) < 40_000


def test_a_step_of_a_run_that_no_longer_runs_is_not_recorded():
    session = make()
    runs.run_submit(session_key=session.key, message="hi", idempotency_key="r1")
    runs.run_claim(run_id="r1", executor="test")
    message = {"role": "toolResult", "toolCallId": "c", "toolName": "ls", "content": [{"type": "text", "text": "x"}]}
    stored = runs.run_record_message(run_id="r1", body=message, message_key="s1.r1")
    again = runs.run_record_message(run_id="r1", body=message, message_key="s1.r1")
    assert stored == again and TranscriptEvent.objects.filter(body__role="toolResult").count() == 1
    Run.objects.filter(run_id="r1").update(status=RunStatus.ERROR)
    assert runs.run_record_message(run_id="r1", body=message, message_key="s1.r2") is None
    assert TranscriptEvent.objects.filter(body__role="toolResult").count() == 1


def test_a_fork_keeps_tool_messages_like_any_other(monkeypatch, tmp_path):
    session = make(cwd=str(tmp_path))
    use(
        monkeypatch,
        ScriptedProvider(("", (ToolCall(id="c1", name="ls", arguments="{}"),)), ("listed", ()), ("second", ())),
    )
    runs.run_submit(session_key=session.key, message="list", idempotency_key="r1")
    turns.execute_turn("r1")
    runs.run_submit(session_key=session.key, message="again", idempotency_key="r2")
    turns.execute_turn("r2")
    second_user = TranscriptEvent.objects.get(window_id=session.session_id, body__role="user", seq__gt=2)

    forked = forks.session_fork(session_key=session.key, entry_id=second_user.event_id)
    child = Session.objects.get(key=forked["sessionKey"])
    assert [b["role"] for b in bodies(child)] == ["user", "assistant", "toolResult", "assistant"]
    assert bodies(child)[1]["content"] == bodies(session)[1]["content"]


def test_history_cuts_long_tool_arguments_but_the_transcript_keeps_them(monkeypatch, tmp_path):
    session = make(cwd=str(tmp_path))
    content = "y" * 20_000
    call = ToolCall(id="c1", name="write", arguments='{"path": "big.txt", "content": "' + content + '"}')
    use(monkeypatch, ScriptedProvider(("", (call,)), ("ok", ())))
    runs.run_submit(session_key=session.key, message="write", idempotency_key="r1")
    turns.execute_turn("r1")

    shown = selectors.chat_history(Session.objects.get(pk=session.pk))["messages"][1]["content"][0]["arguments"]
    assert shown["content"].endswith("...(truncated)...") and len(shown["content"]) < 13_000
    assert bodies(session)[1]["content"][0]["arguments"]["content"] == content
    assert Path(tmp_path / "big.txt").read_text() == content


def test_without_a_workspace_the_model_is_offered_no_tools(monkeypatch, tmp_path):
    session = make(cwd=str(tmp_path / "gone"))
    provider = use(monkeypatch, ScriptedProvider(("plain", ())))
    runs.run_submit(session_key=session.key, message="hi", idempotency_key="r1")
    assert turns.execute_turn("r1") == "ok"
    assert provider.tools == [None]


def test_a_run_failed_as_dead_withdraws_the_approvals_it_waited_on(django_capture_on_commit_callbacks):
    session = make()
    runs.run_submit(session_key=session.key, message="hi", idempotency_key="r1")
    runs.run_claim(run_id="r1", executor="gateway:gone")
    approval = exec_approval_request(
        command="make deploy",
        argv=None,
        cwd="/w",
        host="gateway",
        node_id=None,
        agent_id="main",
        session_key=session.key,
        session_id=session.session_id,
        run_id="r1",
        tool_call_id="c1",
        timeout_ms=None,
        requested_by=Actor(label="run:r1", scopes=()),
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert runs.runs_recover(stale_before=None, executors=["gateway:gone"], reason="gone") == ["r1"]
    approval.refresh_from_db()
    assert (approval.status, approval.terminal_reason) == ("cancelled", "run-aborted")
