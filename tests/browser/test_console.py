"""The operators' console in Debian's Chromium against a real gateway process (Daphne, as ``./dev run`` serves
it): logging in, creating and opening a session, sending a message and reading the reply, and the refusals a
person sees. Every page visited is saved at the desktop and the phone size under ``test-artifacts/screenshots/``."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Locator, Page, expect

from gateway import scopes as sc
from sessions_app.models import Run, RunStatus
from tests.support.operators import operator_user

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PASSWORD = "a-long-enough-password"
REPLY_WAIT_S = 30.0
# How long to wait for a live update before reloading.
LIVE_UPDATE_GRACE_MS = 3000


def log_in(page: Page, gateway, username: str, password: str) -> None:
    page.goto(f"{gateway.http_url}/ui/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()


def create_session(page: Page, key: str) -> None:
    page.get_by_label("New session key").fill(key)
    page.get_by_role("button", name="Create session").click()
    expect(page).to_have_url(re.compile(re.escape(f"/ui/sessions/{key}/") + "$"))


def reload_until_visible(page: Page, locator: Locator, *, timeout_s: float) -> None:
    """The page swaps in a finished turn over its live socket, but a turn that ends before the socket is open
    (the echo model answers in milliseconds) reaches the page only with a reload."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            expect(locator).to_be_visible(timeout=LIVE_UPDATE_GRACE_MS)
            return
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        page.reload()


def test_an_operator_logs_in_creates_a_session_and_reads_the_reply(page, gateway, django_user_model, screenshots):
    operator_user("ops", sc.WRITE, password=PASSWORD)

    page.goto(f"{gateway.http_url}/ui/login/")
    screenshots.take(page, "login")
    log_in(page, gateway, "ops", PASSWORD)
    expect(page).to_have_url(f"{gateway.http_url}/ui/sessions/")
    expect(page.get_by_text("No sessions yet.")).to_be_visible()
    screenshots.take(page, "sessions-empty")

    create_session(page, "agent:main:browser")
    screenshots.take(page, "session-created")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Sessions").click()
    session_link = page.get_by_role("link", name="agent:main:browser")
    expect(session_link).to_be_visible()
    screenshots.take(page, "sessions-listed")
    session_link.click()
    # No label: the title is the key's last part, the whole key is under it.
    expect(page.get_by_role("heading", level=1)).to_have_text("browser")
    expect(page.locator('[data-live-region="status"]')).to_contain_text("agent:main:browser")
    expect(page.get_by_text("No messages yet.")).to_be_visible()
    screenshots.take(page, "session-opened")

    page.get_by_label("Message").fill("Reply exactly: hello from the browser")
    page.get_by_role("button", name="Send").click()
    transcript = page.locator('[data-live-region="transcript"]')
    reply = transcript.locator("article.role-assistant").filter(has_text="hello from the browser")
    reload_until_visible(page, reply, timeout_s=REPLY_WAIT_S)
    screenshots.take(page, "session-replied")

    expect(transcript.locator("article.role-user")).to_have_text(re.compile("Reply exactly: hello from the browser"))
    expect(reply.locator(".text")).to_have_text("hello from the browser")
    run = Run.objects.get(session__key="agent:main:browser")
    assert (run.message, run.status) == ("Reply exactly: hello from the browser", RunStatus.OK)


def test_a_wrong_password_shows_the_error_and_logs_nobody_in(page, gateway, django_user_model, screenshots):
    operator_user("ops", sc.WRITE, password=PASSWORD)

    page.goto(f"{gateway.http_url}/ui/login/")
    screenshots.take(page, "login")
    log_in(page, gateway, "ops", "not-the-password")

    expect(page.get_by_role("alert")).to_have_text("Your username and password did not match. Please try again.")
    expect(page.get_by_label("Username")).to_have_value("ops")
    screenshots.take(page, "login-refused")
    page.goto(f"{gateway.http_url}/ui/sessions/")
    expect(page).to_have_url(re.compile(re.escape(f"{gateway.http_url}/ui/login/?next=")))
    expect(page.get_by_role("alert")).to_have_count(0)
    screenshots.take(page, "sessions-sends-to-login")


def test_an_empty_or_blank_message_is_refused_and_creates_no_turn(page, gateway, django_user_model, screenshots):
    operator_user("ops", sc.WRITE, password=PASSWORD)
    log_in(page, gateway, "ops", PASSWORD)
    screenshots.take(page, "sessions")
    create_session(page, "agent:main:refusals")
    screenshots.take(page, "session-created")
    session_url = page.url
    message = page.get_by_label("Message")

    # An empty message never leaves the browser: the field is required.
    page.get_by_role("button", name="Send").click()
    assert message.evaluate("field => field.validity.valueMissing") is True
    expect(page).to_have_url(session_url)

    # Blank text passes the browser's check; the run service refuses it, and the text stays in the box.
    message.fill("   \n\t  ")
    page.get_by_role("button", name="Send").click()
    expect(page).to_have_url(session_url)
    expect(page.locator("#composer-error")).to_have_text("Not sent: message or attachment required")
    expect(message).to_have_value("   \n\t  ")
    screenshots.take(page, "message-refused")

    expect(page.get_by_text("No turns yet.")).to_be_visible()
    expect(page.get_by_text("No messages yet.")).to_be_visible()
    assert not Run.objects.filter(session__key="agent:main:refusals").exists()
