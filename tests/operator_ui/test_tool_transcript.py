"""A session's transcript with tool calls in the console: every content part drawn, each tool call a card in
its assistant message with its result attached (status in words, exec's exit code and duration, the output
collapsed and escaped, a link to the whole output when it was kept as an artifact), and the artifact view
(plain text that is never run, for logged-in users, 404 for an unknown id or a session that is gone).
Text as sanitised Markdown, images as thumbnails only of the raster types and sizes allowed, and each
message's time, model and token usage."""

from __future__ import annotations

import base64
import html
import re
import struct
import zlib

import pytest
from django.test import Client
from django.urls import reverse

from operator_ui import transcript
from sessions_app.models import RunStatus, Session, ToolArtifact, TranscriptEvent
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
            {"type": "image", "mimeType": "image/svg+xml", "data": "PHN2Zz48L3N2Zz4="},
            {"type": "mystery", "value": 42},
        ],
        "stopReason": "toolUse",
        "timestamp": 1,
    }
    runs.run_record_message(run_id=run_id, body=body, message_key="s1.a")
    tool_result(run_id, "s1.r1", "lost-call", "exec", "orphan output", **exec_details())

    page = text_of(operator_client.get(session_url(session)))

    assert "<summary>Thinking</summary>" in page and "considering options" in page
    assert "Image (image/svg+xml, 11\xa0bytes) not shown: only PNG, JPEG, GIF and WebP images are drawn." in page
    assert "PHN2Zz48L3N2Zz4" not in page
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


# --- Markdown, images, and what each message says of itself ------------------------------------------


def png(width: int = 2, height: int = 1) -> bytes:
    """A real PNG (red pixels), so a browser draws it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def image(data: bytes | str, mime_type: str = "image/png") -> dict:
    encoded = data if isinstance(data, str) else base64.b64encode(data).decode()
    return {"type": "image", "mimeType": mime_type, "data": encoded}


def drawn(*content, role: str = "assistant", **fields) -> list[transcript.Part]:
    [item] = transcript.build([{"role": role, "content": list(content), **fields}], run_statuses={}).items
    return item.parts


def test_text_is_drawn_as_markdown_and_markup_in_it_is_shown_never_run(operator_client):
    session = make("agent:main:markdown")
    run_id = running_turn(session, message="**bold?** <script>alert('user')</script>")
    body = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "| a | b |\n|---|---|\n| 1 | 2 |\n\n```python\nprint('hi')\n```"},
            {
                "type": "text",
                "text": "<img src=x onerror=alert(1)> [x](javascript:alert(1)) ![p](https://evil.example/p.png)",
            },
            {"type": "thinking", "thinking": "*maybe* <iframe src=https://evil.example>"},
        ],
        "stopReason": "toolUse",
        "timestamp": 1,
    }
    runs.run_record_message(run_id=run_id, body=body, message_key="s1.a")

    page = text_of(operator_client.get(session_url(session)))

    assert "<strong>bold?</strong> &lt;script&gt;alert('user')&lt;/script&gt;" in page
    assert "<table>" in page and "<td>1</td>" in page
    [button] = re.findall(r'<button class="copy" data-copy-from="([^"]+)" hidden="" type="button">Copy</button>', page)
    assert f'<pre id="{button}"><code class="highlight"><span class="nb">print</span>' in page
    assert "&lt;img src=x onerror=alert(1)&gt; [x](javascript:alert(1))" in page
    assert '<a href="https://evil.example/p.png" rel="noopener noreferrer nofollow">image: p</a>' in page
    assert '<div class="thinking-text markdown"><p><em>maybe</em> &lt;iframe src=https://evil.example&gt;</p>' in page
    for hostile in ("<script>alert", "<img src=x", "<iframe", 'href="javascript', 'evil.example/p.png"'):
        assert hostile not in page.replace('href="https://evil.example/p.png"', "")


def test_two_messages_with_the_same_code_give_their_copy_buttons_distinct_blocks(operator_client):
    session = make("agent:main:copies")
    for number in (1, 2):
        run_id = running_turn(session, f"run-{number}", "again")
        finish(run_id, "```\nsame\n```")

    page = text_of(operator_client.get(session_url(session)))

    targets = re.findall(r'data-copy-from="([^"]+)"', page)
    ids = re.findall(r'<pre id="([^"]+)">', page)
    assert len(targets) == 2 and len(set(targets)) == 2 and targets == ids


def test_a_message_shows_its_time_and_an_assistant_message_its_model_and_tokens(operator_client):
    session = make("agent:main:meta")
    run_id = running_turn(session)
    outcome = runs.TurnOutcome(
        status=RunStatus.OK, text="fine", usage={"input": 1234, "output": 56, "totalTokens": 1290},
        model_provider="mock", model="echo",
    )  # fmt: skip
    runs.run_finish(run_id=run_id, outcome=outcome)

    page = text_of(operator_client.get(session_url(session)))

    user, assistant = page.split('<article class="message role-')[1:3]
    assert '<time datetime="' in user and "tokens" not in user and "mock/echo" not in user
    assert '<time datetime="' in assistant
    assert '<span class="model">· mock/echo</span>' in assistant
    assert '<span class="usage">· 1234 in / 56 out tokens</span>' in assistant


def test_a_message_without_time_model_or_usage_says_nothing_of_them():
    [item] = transcript.build(
        [{"role": "assistant", "content": "hi", "usage": {"input": "many"}}], run_statuses={}
    ).items

    assert (item.timestamp, item.model, item.input_tokens, item.output_tokens) == (None, "", None, None)
    assert item.parts[0].html == "<p>hi</p>\n"


def test_an_image_of_an_allowed_type_is_a_thumbnail_from_its_own_bytes():
    picture = png()

    [part] = drawn(image(picture))
    [spaced] = drawn(image(base64.encodebytes(picture).decode()))  # base64 with line breaks in it
    [anthropic] = drawn({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                     "data": base64.b64encode(picture).decode()}})  # fmt: skip

    expected = "data:image/png;base64," + base64.b64encode(picture).decode()
    assert (part.image_src, part.size, part.not_shown) == (expected, len(picture), "")
    assert spaced.image_src == anthropic.image_src == expected


@pytest.mark.parametrize(
    ("part", "reason"),
    [
        (image(b"<svg onload='alert(1)'/>", "image/svg+xml"), "only PNG, JPEG, GIF and WebP images are drawn"),
        (image(b"<html><script>alert(1)</script>", "text/html"), "only PNG, JPEG, GIF and WebP images are drawn"),
        (image(b"<svg onload='alert(1)'/>", "image/png"), "its data is not a image/png image"),
        (image(b"RIFF\x00\x00\x00\x00WAVEfmt ", "image/webp"), "its data is not a image/webp image"),
        (image("iVBOR%%%not base64"), "its data is not valid base64"),
        (image("A" * (transcript.IMAGE_BYTES_LIMIT * 4 // 3 + 8)), "larger than the console draws (2 MB)"),
        ({"type": "image", "mimeType": "image/png"}, "the transcript holds no data for it"),
        ({"type": "image", "mimeType": "image/png", "data": 12}, "the transcript holds no data for it"),
    ],
)
def test_an_image_of_another_type_too_large_or_not_what_it_claims_is_named_not_drawn(part, reason):
    [shown] = drawn(part)

    assert (shown.kind, shown.image_src, shown.not_shown) == ("image", "", reason)


def test_an_image_is_drawn_on_the_page_and_one_that_is_not_says_why(operator_client):
    session = make("agent:main:images")
    run_id = running_turn(session)
    body = {"role": "assistant", "content": [image(png()), image(b"GIF89a-but-svg", "image/svg+xml")],
            "stopReason": "toolUse", "timestamp": 1}  # fmt: skip
    runs.run_record_message(run_id=run_id, body=body, message_key="s1.a")

    page = text_of(operator_client.get(session_url(session)))

    [src] = re.findall(r'<img src="([^"]+)" alt="Image from the transcript \(image/png, ', page)
    entry = TranscriptEvent.objects.get(window_id=session.session_id, body__role="assistant")
    assert src == reverse("ui:session-image", kwargs={"key": session.key, "entry_id": entry.event_id, "index": 0})
    assert f'<a href="{src}" target="_blank" rel="noopener" title="Open the image at full size">' in page
    assert "Image (image/svg+xml, 14\xa0bytes) not shown: only PNG, JPEG, GIF and WebP images are drawn." in page
    assert base64.b64encode(png()).decode() not in page  # the page does not carry the image's bytes
    assert base64.b64encode(b"GIF89a-but-svg").decode() not in page
    served = operator_client.get(src)
    assert (served.status_code, served["Content-Type"], served.content) == (200, "image/png", png())
    assert served["X-Content-Type-Options"] == "nosniff"
    assert served["Content-Security-Policy"] == "default-src 'none'; sandbox"
    assert "immutable" in served["Cache-Control"] and "private" in served["Cache-Control"]


def test_an_image_address_serves_only_a_checked_image_of_that_session(operator_client):
    session = make("agent:main:pictures")
    other = make("agent:main:elsewhere")
    run_id = running_turn(session)
    body = {"role": "assistant", "timestamp": 1, "content": [
        image(png()), image(b"<svg onload='alert(1)'/>", "image/svg+xml"), image(b"<svg/>", "image/png"),
        {"type": "text", "text": "hi"},
    ]}  # fmt: skip
    runs.run_record_message(run_id=run_id, body=body, message_key="s1.a")
    entry = TranscriptEvent.objects.get(window_id=session.session_id, body__role="assistant").event_id

    def image_at(key: str, entry_id: str, index: int) -> str:
        return reverse("ui:session-image", kwargs={"key": key, "entry_id": entry_id, "index": index})

    assert operator_client.get(image_at(session.key, entry, 0)).status_code == 200
    for refused in (
        image_at(session.key, entry, 1),  # SVG
        image_at(session.key, entry, 2),  # not the PNG it claims
        image_at(session.key, entry, 3),  # text
        image_at(session.key, entry, 4),  # past the content
        image_at(session.key, "no-such-entry", 0),
        image_at(other.key, entry, 0),  # another session's message
        image_at("agent:main:nobody", entry, 0),
    ):
        response = operator_client.get(refused)
        assert response.status_code == 404, refused
        assert b"<svg" not in response.content
    assert operator_client.post(image_at(session.key, entry, 0)).status_code == 405
    anonymous = Client().get(image_at(session.key, entry, 0))
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("ui:login"))


def test_a_tool_result_s_image_and_unknown_parts_are_drawn_with_its_output(operator_client):
    session = make("agent:main:result-image")
    run_id = running_turn(session)
    tool_use(run_id, 1, ("c1", "read", {"path": "chart.png"}))
    body = {
        "role": "toolResult", "toolCallId": "c1", "toolName": "read", "isError": False, "details": {}, "timestamp": 2,
        "content": [{"type": "text", "text": "Read image file [image/png]"}, image(png()), {"type": "audio", "x": 1}],
    }  # fmt: skip
    assert runs.run_record_message(run_id=run_id, body=body, message_key="s1.r1") is not None

    [card] = cards(text_of(operator_client.get(session_url(session))))

    assert "<pre>Read image file [image/png]</pre>" in card
    [src] = re.findall(r'<img src="([^"]+)"', card)
    result = TranscriptEvent.objects.get(window_id=session.session_id, body__role="toolResult").event_id
    assert src == reverse("ui:session-image", kwargs={"key": session.key, "entry_id": result, "index": 1})
    assert operator_client.get(src).content == png()
    assert "<summary>audio part</summary>" in card and "&quot;x&quot;: 1" in card


def test_content_that_is_neither_a_list_nor_text_and_parts_that_are_not_objects_are_drawn_as_json():
    odd, empty = transcript.build(
        [{"role": "custom", "content": {"kind": "odd"}}, {"role": "custom"}], run_statuses={}
    ).items
    parts = drawn("a bare string", 7)

    assert [(part.kind, part.text) for part in odd.parts] == [("other", '{\n  "kind": "odd"\n}')]
    assert empty.parts == []  # no content: nothing to draw, the message itself still is
    assert [(part.kind, part.label, part.text) for part in parts] == [
        ("other", "part", '"a bare string"'),
        ("other", "part", "7"),
    ]
