"""A transcript drawn in Debian's Chromium against a real gateway process: Markdown as a table, a highlighted
code block whose copy button puts the code on the clipboard, an image part as a thumbnail, each message's time,
model and tokens — and a hostile message (HTML with event handlers, a script, a ``javascript:`` link, a remote
image) shown as the text it is, with nothing of it run or loaded. axe runs on the page (no serious or critical
violation); it is saved at the desktop and the phone size, and once more in the dark colour scheme."""

from __future__ import annotations

import base64
import re
import time

import pytest
from playwright.sync_api import expect

from gateway import scopes as sc
from sessions_app.models import Session
from sessions_app.services.transcripts import append_many
from tests.browser.test_accessibility import blocking_violations
from tests.browser.test_console import PASSWORD, create_session, log_in
from tests.operator_ui.test_tool_transcript import png
from tests.support.operators import operator_user

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

KEY = "agent:main:markdown"
CODE = 'def greet(name):\n    return f"hello {name}"  # a comment\n'
HOSTILE = (
    "<img src=x onerror=\"document.body.dataset.pwned='img'\"> "
    "<script>document.body.dataset.pwned='script'</script> "
    "[click me](javascript:document.body.dataset.pwned='link') "
    "![tracker](https://tracker.invalid/pixel.png)"
)


def seed_transcript(key: str) -> None:
    session = Session.objects.get(key=key)
    now = int(time.time() * 1000)
    picture = base64.b64encode(png(96, 64)).decode()
    bodies = [
        {"role": "user", "content": [{"type": "text", "text": "Compare the *two* options, please."}],
         "timestamp": now - 60_000},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "The user wants a **table**."},
                {"type": "text", "text": "## Options\n\n| option | cost |\n|:--|--:|\n| fast | 3 |\n| cheap | 1 |\n\n"
                                         f"Use this:\n\n```python\n{CODE}```\n\n- one\n- two"},
                {"type": "image", "mimeType": "image/png", "data": picture},
            ],
            "provider": "mock", "model": "echo", "usage": {"input": 321, "output": 54, "totalTokens": 375},
            "stopReason": "stop", "timestamp": now - 30_000,
        },
        {"role": "user", "content": [{"type": "text", "text": HOSTILE}], "timestamp": now - 20_000},
        {"role": "assistant", "content": [{"type": "text", "text": HOSTILE}], "stopReason": "stop",
         "timestamp": now - 10_000},
    ]  # fmt: skip
    append_many(window_id=session.session_id, session_key=session.key, bodies=bodies)


def test_a_transcript_draws_markdown_code_with_a_working_copy_button_images_and_hostile_text_as_text(
    page, gateway, django_user_model, screenshots
):
    operator_user("ops", sc.WRITE, password=PASSWORD)
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=gateway.http_url)
    log_in(page, gateway, "ops", PASSWORD)
    create_session(page, KEY)
    seed_transcript(KEY)
    page.reload()
    transcript = page.locator('[data-live-region="transcript"]')
    answer = transcript.locator("article.role-assistant").first

    # The table, the list, the heading (below the page's own), the thinking collapsed.
    table = answer.get_by_role("table")
    expect(table.get_by_role("columnheader")).to_have_text(["option", "cost"])
    expect(table.get_by_role("row").nth(1).get_by_role("cell")).to_have_text(["fast", "3"])
    expect(answer.get_by_role("heading", level=5)).to_have_text("Options")
    expect(answer.get_by_role("listitem")).to_have_text(["one", "two"])
    thinking = answer.locator("details.thinking")
    expect(thinking.locator(".thinking-text")).to_be_hidden()
    thinking.locator("summary").click()
    expect(thinking.locator(".thinking-text strong")).to_have_text("table")
    # Time, model and tokens of the answer.
    expect(answer.locator(".message-meta time")).to_have_text(re.compile(r"^\d+ (s|min) ago$"))
    expect(answer.locator(".message-meta")).to_contain_text("mock/echo")
    expect(answer.locator(".message-meta")).to_contain_text("321 in / 54 out tokens")
    # The image, drawn from its own bytes.
    thumbnail = answer.locator(".image-part img")
    expect(thumbnail).to_be_visible()
    assert thumbnail.evaluate("img => img.complete && img.naturalWidth") == 96
    # Served from its own address (the page does not carry its bytes), and a click opens it at full size.
    src = thumbnail.get_attribute("src")
    assert src.startswith(f"/ui/sessions/{KEY}/images/")
    with page.expect_popup() as opened:
        thumbnail.click()
    alone = opened.value
    alone.wait_for_load_state()
    assert alone.url.endswith(src)
    assert alone.locator("img").evaluate("img => img.naturalWidth") == 96
    alone.close()

    # The code block: highlighted, and its copy button (revealed by the script) copies exactly the code.
    block = answer.locator(".code-block")
    expect(block.locator(".code-lang")).to_have_text("python")
    expect(block.locator("pre .k")).to_have_text(["def", "return"])
    copy = block.locator("button.copy")
    expect(copy).to_be_visible()
    screenshots.take(page, "transcript-markdown")
    copy.click()
    expect(copy).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == CODE
    expect(copy).to_have_text("Copy")

    # The hostile text is text: nothing ran, no link to a script, no request for the tracker.
    hostile_user, hostile_answer = (
        transcript.locator("article.role-user").nth(1),
        transcript.locator("article.role-assistant").nth(1),
    )
    for article in (hostile_user, hostile_answer):
        expect(article.locator(".markdown")).to_contain_text("<img src=x onerror=")
        expect(article.locator(".markdown")).to_contain_text("<script>document.body.dataset.pwned='script'</script>")
        expect(article.locator(".markdown")).to_contain_text("[click me](javascript:")
        expect(article.locator(".markdown img, .markdown script")).to_have_count(0)
        expect(article.get_by_role("link", name="image: tracker")).to_have_attribute(
            "href", "https://tracker.invalid/pixel.png"
        )
    assert page.evaluate("document.body.dataset.pwned") is None
    assert not [url for url in requests if "tracker.invalid" in url]
    problems = blocking_violations(page, "transcript-markdown")

    page.emulate_media(color_scheme="dark")
    screenshots.take(page, "transcript-markdown-dark")
    assert block.evaluate("element => getComputedStyle(element).backgroundColor") == "rgb(13, 17, 23)"
    assert problems == []
