"""The sessions list as an index in Chromium: search over the transcripts, sort, and the bulk archive and reset
flow, at 1440 px and at 390 px wide without horizontal scrolling. Screenshots under
``test-artifacts/screenshots/``."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from gateway import scopes as sc
from gateway.models import AuditLog
from sessions_app.models import Session
from tests.browser.test_console import PASSWORD, log_in
from tests.operator_ui.test_session_fork import with_transcript
from tests.support.operators import operator_user

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WIDE = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}


def page_width(page: Page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


def rows(page: Page):
    return page.locator("table.session-table tbody tr")


def test_the_index_searches_sorts_and_archives_and_resets_in_bulk_at_both_widths(page, gateway, screenshots):
    operator_user("boss", sc.ADMIN, password=PASSWORD)
    for index in range(6):
        long_words = "a-very-long-unbroken-word-" * 8
        with_transcript(
            f"agent:main:dashboard:0f4c2a9e-{index:04d}-4b5e-9c1d-7a6b5c4d3e2f",
            ("user", f"question {index} {long_words}"),
            ("assistant", "the zeppelin answer" if index == 2 else f"answer {index}"),
        )

    page.set_viewport_size(WIDE)
    log_in(page, gateway, "boss", PASSWORD)
    expect(page).to_have_url(f"{gateway.http_url}/ui/sessions/")
    expect(rows(page)).to_have_count(6)
    assert page_width(page) <= WIDE["width"]
    screenshots.take(page, "sessions-index")

    page.set_viewport_size(PHONE)
    assert page_width(page) <= PHONE["width"]

    page.get_by_label("Search").fill("zeppelin")
    page.get_by_role("button", name="Filter").click()
    expect(rows(page)).to_have_count(1)
    expect(rows(page).first.locator(".preview")).to_have_text("the zeppelin answer")
    assert page_width(page) <= PHONE["width"]
    screenshots.take(page, "sessions-searched")

    page.goto(f"{gateway.http_url}/ui/sessions/?sort=created")
    page.set_viewport_size(PHONE)
    first, second = (rows(page).nth(index).locator('input[type="checkbox"]') for index in (0, 1))
    first.check()
    second.check()
    page.get_by_role("button", name="Archive", exact=True).click()
    expect(page.locator(".messages")).to_have_text(re.compile(r"Archive: 2 done, 0 skipped\."))
    expect(rows(page)).to_have_count(4)
    assert page_width(page) <= PHONE["width"]
    screenshots.take(page, "sessions-archived")

    rows(page).first.locator('input[type="checkbox"]').check()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Reset", exact=True).click()
    expect(page.locator(".messages")).to_have_text(re.compile(r"Reset: 1 done, 0 skipped\."))

    assert Session.objects.filter(archived_at__isnull=False).count() == 2
    assert AuditLog.objects.filter(action="session.patch", actor="user:boss").count() == 2
    assert AuditLog.objects.filter(action="session.reset", actor="user:boss").count() == 1
    page.set_viewport_size(WIDE)
    screenshots.take(page, "sessions-reset")
