"""The session page's docked composer, title and live status in Debian's Chromium against a real gateway process:
Enter sends and Shift+Enter breaks the line (an IME's Enter does neither), without reloading the page (a marker
set on ``window`` survives); the message shows at once, the reply streams in place under "Replying…", Stop ends
the turn; the view follows the newest message unless the operator scrolled away; a refused send keeps the text;
a session created with a label has it as its title and is renamed in place (saved, refused, cancelled); and the
status line settles on the turn's stored end even when the page's refreshes answer out of order or read the page
before the end was stored. Every page is saved at the desktop and the phone size under
``test-artifacts/screenshots/``."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db import connections
from playwright.sync_api import Page, Route, expect

from gateway import scopes as sc
from sessions_app.models import Run, RunStatus, Session
from sessions_app.services import sessions
from sessions_app.services.transcripts import append_many
from tests.browser.test_console import PASSWORD, REPLY_WAIT_S, log_in, reload_until_visible
from tests.support.browser import PHONE
from tests.support.mock_openai import reply, slow
from tests.support.operators import operator_user

ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING)

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WORDS = " ".join(f"word{number}" for number in range(1, 41))
WORD_DELAY_S = 0.25
MARK_THE_PAGE = "() => { window.composerMarker = 'still here'; }"
THE_SAME_PAGE = "() => window.composerMarker === 'still here'"
NEWEST_IN_VIEW = """() => {
  const top = document.getElementById('newest').getBoundingClientRect().top;
  return top >= 0 && top <= window.innerHeight;
}"""


def open_new_session(page: Page, gateway, key: str, label: str = "") -> None:
    page.get_by_label("New session key").fill(key)
    if label:
        page.get_by_label("Label", exact=True).fill(label)
    page.get_by_role("button", name="Create session").click()
    expect(page).to_have_url(re.compile(re.escape(f"/ui/sessions/{key}/") + "$"))


def status_line(page: Page):
    return page.locator('[data-live-region="status"]')


def in_a_thread(function, *args, **kwargs):
    """A database write beside the browser: Playwright's sync API holds this thread's event loop. The thread gives
    its connection back (to the pool, on PostgreSQL) before it ends: a thread that ends holding one keeps it from
    every later test of this process."""

    def closing_its_connections():
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as executor:
        return executor.submit(closing_its_connections).result()


def test_enter_sends_without_a_reload_and_the_reply_streams_in_place_under_replying(
    page, model_gateway, mock_openai, django_user_model, screenshots
):
    operator_user("ops", sc.WRITE, password=PASSWORD)
    mock_openai.script(slow(WORDS, WORD_DELAY_S))
    log_in(page, model_gateway, "ops", PASSWORD)
    open_new_session(page, model_gateway, "agent:main:composer")
    page.evaluate(MARK_THE_PAGE)
    field = page.get_by_label("Message")

    field.fill("First line")
    field.press("Shift+Enter")
    field.press_sequentially("second line")
    expect(field).to_have_value("First line\nsecond line")
    # Enter that confirms an input method's composition is the IME's, not a send.
    not_cancelled = field.evaluate(
        "field => field.dispatchEvent(new KeyboardEvent('keydown', "
        "{key: 'Enter', isComposing: true, bubbles: true, cancelable: true}))"
    )
    assert not_cancelled is True
    assert not Run.objects.filter(session__key="agent:main:composer").exists()
    screenshots.take(page, "composing")

    field.press("Enter")
    expect(field).to_have_value("")
    expect(
        page.locator("#pending-turn article.role-user, [data-live-region='transcript'] article.role-user")
    ).to_have_text(re.compile("First line\\s*second line"))
    expect(page.locator("#reply-state")).to_have_text("Replying…")
    streaming = page.locator("#streaming-reply .text")
    expect(streaming).to_have_text(re.compile(r"^word1 "), timeout=REPLY_WAIT_S * 1000)
    expect(page.locator("#streaming-reply")).to_contain_text("replying…")
    expect(status_line(page)).to_contain_text("status running")
    assert Run.objects.get(session__key="agent:main:composer").status == RunStatus.RUNNING
    screenshots.take(page, "reply-streaming")

    reply_shown = page.locator('[data-live-region="transcript"] article.role-assistant').filter(has_text="word40")
    expect(reply_shown).to_be_visible(timeout=REPLY_WAIT_S * 1000)
    expect(page.locator("#reply-state")).to_have_text("Reply finished.")
    expect(page.locator("#streaming-reply")).to_be_hidden()
    expect(page.locator("#pending-turn article")).to_have_count(0)
    expect(status_line(page)).to_contain_text("status done")
    expect(page.get_by_role("button", name="Stop the running turn")).to_have_count(0)
    assert page.evaluate(THE_SAME_PAGE) is True
    screenshots.take(page, "reply-finished")
    run = Run.objects.get(session__key="agent:main:composer")
    # A form's text travels with CRLF line breaks (as the form posted without the script sends it).
    assert (run.message, run.status) == ("First line\r\nsecond line", RunStatus.OK)


def test_stop_in_the_composer_ends_the_running_turn_without_a_reload(
    page, model_gateway, mock_openai, django_user_model, screenshots
):
    operator_user("ops", sc.WRITE, password=PASSWORD)
    mock_openai.script(slow(WORDS, 1.0))
    log_in(page, model_gateway, "ops", PASSWORD)
    open_new_session(page, model_gateway, "agent:main:stopped")
    page.evaluate(MARK_THE_PAGE)

    page.get_by_label("Message").fill("Count slowly")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#streaming-reply .text")).to_have_text(re.compile(r"^word1"), timeout=REPLY_WAIT_S * 1000)
    stop = page.locator("#composer-dock").get_by_role("button", name="Stop the running turn")
    expect(stop).to_be_visible()
    screenshots.take(page, "running-with-stop")
    stop.click()

    expect(page.locator("#reply-state")).to_have_text("Stopped: the turn was aborted.", timeout=REPLY_WAIT_S * 1000)
    expect(stop).to_have_count(0)
    expect(status_line(page)).to_contain_text("status killed")
    assert page.evaluate(THE_SAME_PAGE) is True
    screenshots.take(page, "stopped")
    assert Run.objects.get(session__key="agent:main:stopped").status == RunStatus.ABORTED


def test_the_view_follows_the_newest_message_unless_the_operator_scrolled_up(
    page, model_gateway, mock_openai, django_user_model, screenshots
):
    operator_user("ops", sc.WRITE, password=PASSWORD)
    mock_openai.script(reply("\n".join(f"line {number}" for number in range(1, 61))), slow(WORDS, 0.4))
    page.set_viewport_size(PHONE)
    log_in(page, model_gateway, "ops", PASSWORD)
    open_new_session(page, model_gateway, "agent:main:followed")
    field = page.get_by_label("Message")

    field.fill("A long answer please")
    field.press("Enter")
    expect(page.locator('[data-live-region="transcript"]')).to_contain_text("line 60", timeout=REPLY_WAIT_S * 1000)
    expect(page.locator("#reply-state")).to_have_text("Reply finished.")
    assert page.evaluate(NEWEST_IN_VIEW) is True
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]

    field.fill("Now count")
    field.press("Enter")
    streaming = page.locator("#streaming-reply .text")
    expect(streaming).to_have_text(re.compile(r"^word1"), timeout=REPLY_WAIT_S * 1000)
    page.evaluate("() => window.scrollTo(0, 0)")
    expect(streaming).to_contain_text("word6 ", timeout=REPLY_WAIT_S * 1000)
    jump = page.get_by_role("button", name="Jump to newest")
    expect(jump).to_be_visible()
    # The operator reads further up: what arrives does not pull the page down.
    assert page.evaluate("() => window.scrollY") == 0
    assert page.evaluate(NEWEST_IN_VIEW) is False
    screenshots.take(page, "scrolled-up-while-streaming")

    page.set_viewport_size(PHONE)
    jump.click()
    assert page.evaluate(NEWEST_IN_VIEW) is True
    expect(jump).to_be_hidden()
    expect(streaming).to_contain_text("word12 ", timeout=REPLY_WAIT_S * 1000)
    # Following again: each new piece keeps the newest in view.
    assert page.evaluate(NEWEST_IN_VIEW) is True
    expect(page.locator('[data-live-region="transcript"]')).to_contain_text("word40", timeout=REPLY_WAIT_S * 1000)
    assert page.evaluate(NEWEST_IN_VIEW) is True
    screenshots.take(page, "followed-to-the-end")


def test_a_refused_send_keeps_the_text_and_says_why_beside_the_composer(page, gateway, django_user_model, screenshots):
    operator_user("ops", sc.WRITE, password=PASSWORD)
    log_in(page, gateway, "ops", PASSWORD)
    open_new_session(page, gateway, "agent:main:kept")
    page.evaluate(MARK_THE_PAGE)
    field = page.get_by_label("Message")

    field.fill("   \n  ")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#composer-error")).to_have_text("Not sent: message or attachment required")
    expect(field).to_have_value("   \n  ")
    expect(page.locator("#pending-turn article")).to_have_count(0)
    screenshots.take(page, "send-refused")

    page.context.set_offline(True)
    try:
        field.fill("Reply exactly: after the outage")
        field.press("Enter")
        expect(page.locator("#composer-error")).to_contain_text("Not sent: the gateway could not be reached")
        expect(field).to_have_value("Reply exactly: after the outage")
        screenshots.take(page, "network-down")
    finally:
        page.context.set_offline(False)
    field.press("Enter")
    expect(page.locator('[data-live-region="transcript"] article.role-assistant')).to_contain_text(
        "after the outage", timeout=REPLY_WAIT_S * 1000
    )
    expect(page.locator("#composer-error")).to_be_hidden()
    assert page.evaluate(THE_SAME_PAGE) is True
    assert list(Run.objects.filter(session__key="agent:main:kept").values_list("message", flat=True)) == [
        "Reply exactly: after the outage"
    ]


def test_a_session_created_with_a_label_has_it_as_its_title_and_is_renamed_in_place(
    page, gateway, django_user_model, screenshots
):
    operator_user("ops", sc.WRITE, password=PASSWORD)
    log_in(page, gateway, "ops", PASSWORD)
    open_new_session(page, gateway, "agent:main:titled", label="Quarterly numbers")
    heading = page.get_by_role("heading", level=1)
    expect(heading).to_have_text("Quarterly numbers")
    expect(page).to_have_title("Quarterly numbers · OpenClaw console")
    expect(status_line(page)).to_contain_text("agent:main:titled")
    page.evaluate(MARK_THE_PAGE)
    screenshots.take(page, "labelled")

    heading.click()
    name = page.get_by_label("Session label")
    expect(name).to_be_focused()
    name.fill("Something else")
    name.press("Escape")
    expect(heading).to_have_text("Quarterly numbers")
    expect(name).to_be_hidden()
    assert Session.objects.get(key="agent:main:titled").label == "Quarterly numbers"

    # A form drawn before some other change (here the last one, made to carry an older revision) keeps it: the rename
    # moves only the forms that showed the revision it was made on, so the server still refuses the stale one.
    revisions = "inputs => inputs.map(input => input.value)"
    assert set(page.eval_on_selector_all('input[name="revision"]', revisions)) == {"1"}
    page.eval_on_selector_all('input[name="revision"]', "inputs => { inputs[inputs.length - 1].value = '0'; }")
    page.get_by_role("button", name="Rename").click()
    name.fill("Annual numbers")
    screenshots.take(page, "renaming")
    name.press("Enter")
    expect(heading).to_have_text("Annual numbers")
    expect(page).to_have_title("Annual numbers · OpenClaw console")
    expect(page.locator("#settings-label")).to_have_text("Annual numbers")
    expect(page.locator("#settings-revision")).to_have_text("2")
    *moved, kept = page.eval_on_selector_all('input[name="revision"]', revisions)
    assert (set(moved), kept) == ({"2"}, "0")
    assert (Session.objects.get(key="agent:main:titled").label, page.evaluate(THE_SAME_PAGE)) == (
        "Annual numbers",
        True,
    )
    screenshots.take(page, "renamed")

    # Another operator renames it while this one types: theirs stands, this one is told why.
    page.get_by_role("button", name="Rename").click()
    in_a_thread(sessions.session_patch, key="agent:main:titled", changes={"label": "Their name"}, expected_revision=2)
    name.fill("My name")
    name.press("Enter")
    expect(page.locator("#rename-error")).to_contain_text(
        "Not saved: this session changed after the page showed it (revision 2, now 3)"
    )
    expect(name).to_have_value("My name")
    screenshots.take(page, "rename-refused")
    assert Session.objects.get(key="agent:main:titled").label == "Their name"


def test_a_refresh_leaves_an_unchanged_transcript_alone_with_its_opened_disclosure(
    page, gateway, django_user_model, screenshots
):
    """Django masks the CSRF token of the transcript's forms anew at every render: the comparison leaves the tokens
    (and the disclosures the operator opened) out, so a change of the title alone redraws nothing else. The
    transcript's nodes are the same objects after the refresh (a property set on one survives)."""
    operator_user("ops", sc.WRITE, password=PASSWORD)
    log_in(page, gateway, "ops", PASSWORD)
    open_new_session(page, gateway, "agent:main:steady")
    session = Session.objects.get(key="agent:main:steady")
    bodies = [
        {"role": "user", "content": [{"type": "text", "text": "think about it"}], "timestamp": 1},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "thought"}],
            "timestamp": 2,
        },
    ]
    in_a_thread(append_many, window_id=session.session_id, session_key=session.key, bodies=bodies)
    page.reload()
    transcript = page.locator('[data-live-region="transcript"]')
    expect(transcript.locator("form input[name=csrfmiddlewaretoken]").first).to_be_attached()
    page.locator("details.thinking summary").click()
    expect(page.locator("details.thinking")).to_have_attribute("open", "")
    page.evaluate("() => { document.querySelector('[data-live-region=transcript] article').kept = 'yes'; }")

    # Through the gateway (the page's live update comes from there).
    patched = httpx.patch(
        f"{gateway.http_url}/api/sessions/{session.key}",
        json={"label": "Retitled"},
        headers={"Authorization": f"Bearer {gateway.token}"},
        timeout=10,
    )
    assert patched.status_code == 200, patched.text

    expect(page.get_by_role("heading", level=1)).to_have_text("Retitled")
    assert page.evaluate("() => document.querySelector('[data-live-region=transcript] article').kept") == "yes"
    expect(page.locator("details.thinking")).to_have_attribute("open", "")
    screenshots.take(page, "unchanged-transcript")


def test_a_too_long_label_at_creation_is_refused_and_creates_nothing(page, gateway, django_user_model, screenshots):
    operator_user("ops", sc.WRITE, password=PASSWORD)
    log_in(page, gateway, "ops", PASSWORD)
    page.get_by_label("New session key").fill("agent:main:unnamed")
    label = page.get_by_label("Label", exact=True)
    # The field stops at 200 characters; a form built without that limit meets the service's.
    label.evaluate("field => field.removeAttribute('maxlength')")
    label.fill("z" * 201)
    page.get_by_role("button", name="Create session").click()
    expect(page.locator(".messages li.error")).to_have_text("/label: String should have at most 200 characters")
    screenshots.take(page, "label-refused")
    assert not Session.objects.filter(key="agent:main:unnamed").exists()


# --- the status line settles on the turn's stored end ---------------------------------------------------


def console_refresh(route: Route) -> bool:
    return route.request.method == "GET" and route.request.headers.get("x-requested-with") == "console"


def test_a_refresh_answered_after_a_newer_one_does_not_put_back_a_running_turn(
    page, model_gateway, mock_openai, django_user_model, screenshots
):
    """The first turn of a process: its page's first refresh renders slowly (nothing cached yet) and answers after
    the refresh the turn's end asked for. Here the first refresh is held until the end's refresh has been shown."""
    operator_user("ops", sc.WRITE, password=PASSWORD)
    mock_openai.script(slow(WORDS, 0.1))
    log_in(page, model_gateway, "ops", PASSWORD)
    open_new_session(page, model_gateway, "agent:main:out-of-order")
    held: list[Route] = []
    answers: list = []

    def hold_the_first(route: Route) -> None:
        if console_refresh(route) and not held:
            held.append(route)
            answers.append(route.fetch())  # the page as the server shows it now, before the turn's end
        else:
            route.continue_()

    page.route(re.compile(r"/ui/sessions/agent:main:out-of-order/$"), hold_the_first)
    page.get_by_label("Message").fill("Count")
    page.get_by_role("button", name="Send").click()
    expect(page.locator('[data-live-region="transcript"] article.role-assistant')).to_contain_text(
        "word40", timeout=REPLY_WAIT_S * 1000
    )
    expect(status_line(page)).to_contain_text("status done")
    assert len(held) == len(answers) == 1
    route, stale = held[0], answers[0]
    assert "Stop the running turn" in stale.text()

    with page.expect_request_finished(lambda request: request.headers.get("x-requested-with") == "console"):
        route.fulfill(response=stale)
    page.evaluate("() => new Promise(resolve => setTimeout(resolve, 100))")
    expect(status_line(page)).to_contain_text("status done")
    expect(page.get_by_role("button", name="Stop the running turn")).to_have_count(0)
    screenshots.take(page, "settled-after-a-late-answer")
    assert Run.objects.get(session__key="agent:main:out-of-order").status == RunStatus.OK


def test_a_refresh_that_still_reads_the_turn_running_after_its_end_is_asked_again(
    page, model_gateway, mock_openai, django_user_model, screenshots
):
    """The turn's end event arrives, but the page the refresh reads still shows the turn running (read before the
    end was stored): the page asks again until the stored run has ended."""
    operator_user("ops", sc.WRITE, password=PASSWORD)
    mock_openai.script(slow(WORDS, 0.15))
    log_in(page, model_gateway, "ops", PASSWORD)
    open_new_session(page, model_gateway, "agent:main:read-early")
    page_url = page.url
    page.get_by_label("Message").fill("Count")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#streaming-reply .text")).to_have_text(re.compile(r"^word1"), timeout=REPLY_WAIT_S * 1000)
    running_page = page.request.get(page_url, headers={"X-Requested-With": "console"})
    assert "Stop the running turn" in running_page.text()
    served_early: list[str] = []

    def first_after_the_end_reads_early(route: Route) -> None:
        try:
            ended = Run.objects.filter(session__key="agent:main:read-early", status=RunStatus.OK).exists()
        finally:
            # Playwright calls a route handler in a context of its own, whose connection nobody else would close
            # (on PostgreSQL it would stay out of the pool for every later test of this process).
            connections.close_all()
        if console_refresh(route) and ended and not served_early:
            served_early.append(route.request.url)
            route.fulfill(response=running_page)
        else:
            route.continue_()

    page.route(re.compile(r"/ui/sessions/agent:main:read-early/$"), first_after_the_end_reads_early)
    expect(page.locator('[data-live-region="transcript"] article.role-assistant')).to_contain_text(
        "word40", timeout=REPLY_WAIT_S * 1000
    )
    expect(status_line(page)).to_contain_text("status done")
    expect(page.get_by_role("button", name="Stop the running turn")).to_have_count(0)
    assert served_early, "no refresh came after the turn's end"
    screenshots.take(page, "settled-after-an-early-read")


def test_without_javascript_the_composer_and_the_label_form_post_and_redirect(
    browser, gateway, django_user_model, screenshots
):
    operator_user("ops", sc.WRITE, password=PASSWORD)
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        log_in(page, gateway, "ops", PASSWORD)
        open_new_session(page, gateway, "agent:main:no-script", label="Plain form")
        session_url = page.url
        expect(page.get_by_role("button", name="Rename")).to_be_hidden()
        expect(page.locator("#composer-hint")).to_be_hidden()

        page.get_by_label("Message").fill("Reply exactly: posted by a form")
        page.get_by_role("button", name="Send").click()
        expect(page).to_have_url(session_url)
        # No live updates without the script: the operator reloads until the reply is there.
        reply_shown = page.locator('[data-live-region="transcript"] article.role-assistant')
        reload_until_visible(page, reply_shown.filter(has_text="posted by a form"), timeout_s=REPLY_WAIT_S)
        screenshots.take(page, "sent-without-script")
        # The reply is in the transcript a moment before the turn's end writes the session (a new revision): the
        # label form must carry the revision of the session as the ended turn left it.
        turn_ended_by = time.monotonic() + REPLY_WAIT_S
        while Run.objects.filter(session__key="agent:main:no-script", status__in=ACTIVE_STATUSES).exists():
            assert time.monotonic() < turn_ended_by, "the turn did not end"
            time.sleep(0.1)
        page.reload()

        page.get_by_label("New label").fill("Renamed by a form")
        page.get_by_role("button", name="Save the label").click()
        expect(page.get_by_text("Label saved.")).to_be_visible()
        expect(page.get_by_role("heading", level=1)).to_have_text("Renamed by a form")
        screenshots.take(page, "renamed-without-script")
    finally:
        context.close()
    assert Run.objects.filter(session__key="agent:main:no-script").count() == 1
    assert Session.objects.get(key="agent:main:no-script").label == "Renamed by a form"
