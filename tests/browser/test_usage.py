"""The Usage page in Debian's Chromium against a real gateway process: a turn answered by the built-in echo model
records its usage, and the page shows it — totals, the chart, the session that used the tokens (a link to its
page), the model without a price named — with no serious accessibility violation; then a refused range."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from sessions_app.models import Run, RunStatus
from tests.browser.test_accessibility import blocking_violations
from tests.browser.test_console import PASSWORD, REPLY_WAIT_S, create_session, log_in, reload_until_visible

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_turn_shows_on_the_usage_page(page: Page, gateway, django_user_model, screenshots):
    django_user_model.objects.create_user(username="ops", password=PASSWORD)
    log_in(page, gateway, "ops", PASSWORD)

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Usage").click()
    expect(page.get_by_text("No turns in these days.")).to_be_visible()
    screenshots.take(page, "usage-empty")

    page.goto(f"{gateway.http_url}/ui/sessions/")
    create_session(page, "agent:main:spender")
    page.get_by_label("Message").fill("Reply exactly: counted words")
    page.get_by_role("button", name="Send").click()
    reload_until_visible(
        page, page.locator('[data-live-region="transcript"] article.role-assistant'), timeout_s=REPLY_WAIT_S
    )
    run = Run.objects.get(session__key="agent:main:spender")
    assert run.status == RunStatus.OK
    recorded = run.usage

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Usage").click()
    expect(page.locator('[data-figure="input"]')).to_have_text(str(recorded["input"]))
    expect(page.locator('[data-figure="output"]')).to_have_text(str(recorded["output"]))
    expect(page.get_by_role("img", name=re.compile("Tokens per day"))).to_be_visible()
    expect(page.get_by_text("No price for echo/echo")).to_be_visible()
    screenshots.take(page, "usage-one-turn")
    assert blocking_violations(page, "usage") == []

    page.get_by_role("link", name="agent:main:spender").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("agent:main:spender")

    page.goto(f"{gateway.http_url}/ui/usage/?startDate=2026-03-09&endDate=2026-03-01")
    expect(page.get_by_role("alert")).to_have_text("startDate must not be after endDate")
    screenshots.take(page, "usage-refused")
