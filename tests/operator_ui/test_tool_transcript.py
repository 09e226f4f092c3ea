"""A session's transcript with tool calls in the console: every content part drawn, each tool call a card in
its assistant message with its result attached (status in words, exec's exit code and duration, the output
collapsed and escaped, a link to the whole output when it was kept as an artifact), and the artifact view
(plain text that is never run, for logged-in users, 404 for an unknown id or a session that is gone)."""

from __future__ import annotations

import html
import re

import pytest
from django.test import Client
from django.urls import reverse

from sessions_app.models import RunStatus, Session, ToolArtifact
from sessions_app.services import runs
from tests.operator_ui.test_views import make, session_url, text_of

pytestmark = pytest.mark.django_db


def running_turn(session: Session, run_id: str = "run-1", message: str = "do the thing") -> str:
    runs.run_submit(session_key=session.key, message=message, idempotency_key=run_id)
    runs.run_claim(run_id=run_id, executor="test")
    return run_id


def tool_use(run_id: str, step: int, *calls: tuple[str, str, object], text: str = "") -> None:
    """The assistant message of step ``step`` asking for ``calls`` ((id, name, arguments), …)."""
    content = [{"type": "text", "text": text}] if text else []
    content += [{"type": "toolCall", "id": cid, "name": name, "arguments": args} for cid, name, args in calls]
    body = {"role": "assistant", "content": content, "stopReason": "toolUse", "timestamp": 1}
    assert runs.run_record_message(run_id=run_id, body=body, message_key=f"s{step}.a") is not None


def tool_result(
    run_id: str,
    key: str,
    call_id: str,
    name: str,
    text: str,
    *,
    is_error: bool = False,
    full_text: str | None = None,
    **details,
) -> dict:
    body = {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": name,
        "content": [{"type": "text", "text": text}],
        "details": details,
        "isError": is_error,
        "timestamp": 2,
    }
    stored = runs.run_record_message(
        run_id=run_id, body=body, message_key=key, full_text=full_text, total_bytes=details.get("outputBytes", 0)
    )
    assert stored is not None
    return stored


def finish(run_id: str, text: str = "all done") -> None:
    runs.run_finish(run_id=run_id, outcome=runs.TurnOutcome(status=RunStatus.OK, text=text))


def exec_details(exit_code: int = 0, duration_ms: int = 12, **more) -> dict:
    return {"exitCode": exit_code, "durationMs": duration_ms, "timedOut": False, "truncated": False,
            "outputBytes": 6, "cwd": "/srv/work", **more}  # fmt: skip


def cards(page: str) -> list[str]:
    """Each tool card of the page, as HTML (up to the next card or the end of its message)."""
    return [chunk.split("</article>", 1)[0] for chunk in page.split('<div class="tool-card">')[1:]]


def test_a_tool_call_is_a_card_in_its_assistant_message_with_its_result_attached(operator_client):
    session = make("agent:main:tools")
    run_id = running_turn(session)
    tool_use(run_id, 1, ("call_0_0", "exec", {"command": "ls -la src", "timeoutSeconds": 30}), text="Let me look.")
    tool_result(run_id, "s1.r1", "call_0_0", "exec", "a.py\nb.py\n", **exec_details(duration_ms=37))
    finish(run_id)

    page = text_of(operator_client.get(session_url(session)))

    articles = re.findall(r'<article class="message role-(\w+)">', page)
    assert articles == ["user", "assistant", "assistant"]  # the result is inside its call's card, not apart
    [card] = cards(page)
    assert '<span class="tool-name">exec</span> <code class="tool-summary">ls -la src</code>' in card
    # The arguments whole, collapsed.
    assert "<summary>Arguments" in card and "&quot;timeoutSeconds&quot;: 30" in card
    assert '<div class="tool-result status-ok">' in card
    assert 'Result: <strong class="status-word">ok</strong> · exit code 0 · 37 ms' in card
    assert '<details class="tool-output">' in card and "<pre>a.py\nb.py\n</pre>" in card
    assert "Open the whole output" not in card
    # The step's own text stays before its card, and the final reply after.
    assert page.index("Let me look.") < page.index('<div class="tool-card">') < page.index("all done")


@pytest.mark.parametrize(
    ("details", "is_error", "word", "extra"),
    [
        (exec_details(exit_code=2), True, "error", "exit code 2"),
        ({"denied": True}, True, "denied", None),
        ({"aborted": True}, True, "aborted", None),
        (exec_details(exit_code=-9, timedOut=True), True, "timed out", "exit code -9"),
    ],
)
def test_each_outcome_of_a_result_is_said_in_words(operator_client, details, is_error, word, extra):
    session = make("agent:main:outcomes")
    run_id = running_turn(session)
    tool_use(run_id, 1, ("c1", "exec", {"command": "make test"}))
    tool_result(run_id, "s1.r1", "c1", "exec", "it went wrong", is_error=is_error, **details)

    [card] = cards(text_of(operator_client.get(session_url(session))))

    assert f'Result: <strong class="status-word">{word}</strong>' in card
    assert '<span class="mark" aria-hidden="true">✕</span>' in card
    assert (extra in card) if extra else ("exit code" not in card)
    assert "<pre>it went wrong</pre>" in card


def test_file_tools_summarize_their_path_and_pattern_and_a_malformed_call_shows_what_was_sent(operator_client):
    session = make("agent:main:files")
    run_id = running_turn(session)
    tool_use(
        run_id,
        1,
        ("c1", "read", {"path": "docs/README.md", "limit": 20}),
        ("c2", "grep", {"pattern": "TODO", "path": "src"}),
        ("c3", "no_such_tool", {"raw": "{not json"}),
    )
    tool_result(run_id, "s1.r1", "c1", "read", "# Title")
    tool_result(run_id, "s1.r2", "c2", "grep", "src/a.py:3: TODO")
    tool_result(run_id, "s1.r3", "c3", "no_such_tool", 'unknown tool "no_such_tool"', is_error=True)

    read, grep, bad = cards(text_of(operator_client.get(session_url(session))))

    assert '<code class="tool-summary">docs/README.md</code>' in read and "exit code" not in read
    assert '<code class="tool-summary">TODO in src</code>' in grep
    assert "<pre>{not json</pre>" in bad  # the model's text as it came, not a JSON wrapper
    assert 'status-word">error</strong>' in bad


def test_a_large_output_links_to_the_whole_of_it_kept_as_an_artifact(operator_client):
    session = make("agent:main:large")
    run_id = running_turn(session)
    tool_use(run_id, 1, ("c1", "exec", {"command": "cat big.log"}))
    whole = "line\n" * 20_000
    tool_result(
        run_id, "s1.r1", "c1", "exec", whole[:500], full_text=whole, **exec_details(truncated=True, outputBytes=100_000)
    )
    artifact = ToolArtifact.objects.get()

    [card] = cards(text_of(operator_client.get(session_url(session))))

    link = reverse("ui:artifact", kwargs={"artifact_id": artifact.pk})
    assert f'<a href="{link}">Open the whole output' in card
    assert "(97.7\xa0KB)" in card and "output truncated" in card
    response = operator_client.get(link)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Disposition"] == 'inline; filename="exec-c1.txt"'
    assert response.content.decode() == whole


def test_the_artifact_view_is_404_for_an_unknown_id_or_a_session_that_is_gone_and_asks_for_a_login(operator_client):
    session = make("agent:main:gone")
    run_id = running_turn(session)
    tool_use(run_id, 1, ("c1", "exec", {"command": "seq 100000"}))
    tool_result(run_id, "s1.r1", "c1", "exec", "1\n", full_text="1\n2\n", **exec_details())
    artifact = ToolArtifact.objects.get()
    link = reverse("ui:artifact", kwargs={"artifact_id": artifact.pk})

    assert operator_client.get(reverse("ui:artifact", kwargs={"artifact_id": "nope"})).status_code == 404
    anonymous = Client().get(link)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("ui:login"))
    ToolArtifact.objects.filter(pk=artifact.pk).update(session_key="agent:main:elsewhere")
    assert operator_client.get(link).status_code == 404


def test_a_call_without_a_result_runs_while_its_turn_runs_and_says_so_once_it_ended(operator_client):
    session = make("agent:main:pending")
    run_id = running_turn(session)
    tool_use(run_id, 1, ("c1", "exec", {"command": "sleep 60"}))

    running = cards(text_of(operator_client.get(session_url(session))))[0]
    runs.run_finish(run_id=run_id, outcome=runs.TurnOutcome(status=RunStatus.ERROR, error="worker died"))
    ended = cards(text_of(operator_client.get(session_url(session))))[0]

    assert 'Result: <strong class="status-word">running</strong>' in running
    assert 'Result: <strong class="status-word">none recorded</strong>' in ended


def test_a_result_whose_call_is_not_on_the_page_and_other_parts_are_drawn_too(operator_client):
    session = make("agent:main:parts")
    run_id = running_turn(session)
    body = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "considering options"},
            {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="},
            {"type": "mystery", "value": 42},
        ],
        "stopReason": "toolUse",
        "timestamp": 1,
    }
    runs.run_record_message(run_id=run_id, body=body, message_key="s1.a")
    tool_result(run_id, "s1.r1", "lost-call", "exec", "orphan output", **exec_details())

    page = text_of(operator_client.get(session_url(session)))

    assert "<summary>Thinking</summary>" in page and "considering options" in page
    assert "[image: image/png]" in page and "iVBORw0KGgo" not in page
    assert "<summary>mystery part</summary>" in page and "&quot;value&quot;: 42" in page
    standalone = page.split('<article class="message role-toolResult">', 1)[1].split("</article>", 1)[0]
    assert '<h3 class="role">tool result</h3>' in standalone
    assert '<span class="tool-name">exec</span> <span class="muted">lost-call</span>' in standalone
    assert "<pre>orphan output</pre>" in standalone


def test_a_reused_call_id_gets_the_result_of_its_own_turn(operator_client):
    session = make("agent:main:reuse")
    first = running_turn(session, "run-1", "first")
    tool_use(first, 1, ("call_0_0", "exec", {"command": "echo one"}))
    tool_result(first, "s1.r1", "call_0_0", "exec", "one\n", **exec_details())
    finish(first)
    second = running_turn(session, "run-2", "second")
    tool_use(second, 1, ("call_0_0", "exec", {"command": "echo two"}))
    tool_result(second, "s1.r1", "call_0_0", "exec", "two\n", **exec_details())

    one, two = cards(text_of(operator_client.get(session_url(session))))

    assert "echo one" in one and "<pre>one\n</pre>" in one
    assert "echo two" in two and "<pre>two\n</pre>" in two


def test_markup_in_a_command_or_an_output_is_shown_never_run(operator_client):
    session = make("agent:main:xss")
    run_id = running_turn(session)
    evil = "<script>alert('x')</script>"
    tool_use(run_id, 1, ("c1", "exec", {"command": f'echo "{evil}"'}))
    tool_result(run_id, "s1.r1", "c1", "exec", f"{evil}\n<img src=x onerror=alert(1)>", **exec_details())

    page = text_of(operator_client.get(session_url(session)))

    assert "<script>alert" not in page and "<img src=x" not in page
    [card] = cards(page)
    assert html.escape(evil) in card and "&lt;img src=x onerror=alert(1)&gt;" in card
