"""The System page in Debian's Chromium against a real gateway process: a staff operator types the gateway's
address, lands on the console's login, and finds the process serving the page, its readiness and its connections.
Screenshots under ``test-artifacts/screenshots/``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from playwright.sync_api import expect

from gateway import scopes as sc
from tests.browser.test_console import PASSWORD
from tests.support.clients import call_once
from tests.support.operators import operator_user

# The gateway's System page reads both databases (its readiness checks the harness store's migrations).
pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True, databases="__all__")]


def test_a_staff_operator_finds_the_system_page_from_the_gateways_address(
    page, gateway, django_user_model, screenshots
):
    operator_user("boss", sc.ADMIN, password=PASSWORD, is_staff=True)
    # A client call, so that the process has registered. Its own thread: Playwright's loop runs on this one.
    with ThreadPoolExecutor(max_workers=1) as caller:
        assert caller.submit(call_once, gateway, "health").result(timeout=30)["ok"] is True

    page.goto(f"{gateway.http_url}/")
    expect(page).to_have_url(f"{gateway.http_url}/ui/login/")
    page.get_by_label("Username").fill("boss")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("navigation", name="Main").get_by_role("link", name="System").click()

    expect(page).to_have_url(f"{gateway.http_url}/ui/system/")
    expect(page.get_by_role("heading", name="System", level=1)).to_be_visible()
    expect(page.get_by_text("This process is ready")).to_be_visible()
    for check in ("database", "channelLayer", "broker", "migrations"):
        expect(page.get_by_role("cell", name=check, exact=True)).to_be_visible()
    serving = page.get_by_role("row").filter(has_text="this one")
    expect(serving).to_have_count(1)
    expect(serving.get_by_text("live", exact=True)).to_be_visible()
    expect(page.get_by_role("heading", name="Recent errors", level=2)).to_be_visible()
    screenshots.take(page, "system")
