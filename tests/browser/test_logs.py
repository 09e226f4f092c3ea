"""The Logs page in Debian's Chromium: the level filter without JavaScript's help, and live follow appending the
lines the gateway writes after the page was loaded."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from gateway import scopes as sc
from tests.browser.test_console import PASSWORD, log_in
from tests.support.operators import operator_user

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FOLLOW_WAIT_MS = 15_000


def write(path, level: str, message: str) -> None:
    line = {"time": "2026-12-04T10:00:00+00:00", "level": level, "logger": "test.browser", "process": "browser-test"}
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(json.dumps({**line, "message": message}) + "\n")


def test_the_logs_page_filters_by_level_and_follows_new_lines(
    page, gateway_factory, django_user_model, screenshots, tmp_path
):
    log_file = tmp_path / "gateway.log"
    gateway = gateway_factory(extra_env={"OPENCLAW_LOG_FILE": str(log_file)}, worker=False)
    operator_user("boss", sc.ADMIN, password=PASSWORD, is_staff=True)
    write(log_file, "INFO", "an ordinary line")
    write(log_file, "ERROR", "an old error")

    log_in(page, gateway, "boss", PASSWORD)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Logs").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Logs")
    lines = page.locator("#log-lines tbody")
    expect(lines).to_contain_text("an ordinary line")
    screenshots.take(page, "logs")

    page.get_by_label("Level").select_option("ERROR")
    page.get_by_role("button", name="Show").click()
    expect(page).to_have_url(f"{gateway.http_url}/ui/logs/?level=ERROR&lines=500")
    expect(lines).to_contain_text("an old error")
    expect(lines).not_to_contain_text("an ordinary line")

    write(log_file, "INFO", "a new ordinary line")
    write(log_file, "ERROR", "a new error")
    expect(lines).to_contain_text("a new error", timeout=FOLLOW_WAIT_MS)
    expect(lines).not_to_contain_text("a new ordinary line")
    expect(page.locator("#logs-follow-status")).to_have_text("Following.")
    screenshots.take(page, "logs-followed")
