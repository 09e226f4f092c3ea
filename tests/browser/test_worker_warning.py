"""The missing-worker banner in Debian's Chromium: a gateway with Redis and no Celery worker shows operators that no
worker runs turns, on a page that still fits a phone; the System page shows the ``taskWorkers`` warning."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from gateway import scopes as sc
from tests.browser.test_console import PASSWORD, log_in
from tests.support.operators import operator_user

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

# The first check is on its way when the first page is drawn; a reload shows its answer.
BANNER_WAIT_S = 30


def test_a_gateway_without_a_worker_shows_the_banner_on_every_page(page, gateway_factory, screenshots):
    gateway = gateway_factory(extra_env={"OPENCLAW_TURN_PICKUP_TIMEOUT_S": "60"}, worker=False)
    queue = gateway.env["OPENCLAW_CELERY_QUEUE"]
    operator_user("boss", sc.ADMIN, password=PASSWORD, is_staff=True)

    log_in(page, gateway, "boss", PASSWORD)
    banner = page.locator(".worker-warning")
    for _ in range(BANNER_WAIT_S):
        if banner.count():
            break
        page.wait_for_timeout(1000)
        page.reload()
    expect(banner).to_have_attribute("role", "alert")
    expect(banner).to_contain_text(f"No Celery worker is consuming the turn queue {queue}")
    expect(banner).to_contain_text("and fail after 60 s")
    expect(banner).to_contain_text(".venv/bin/celery -A openclaw_site worker -l info")
    screenshots.take(page, "sessions-without-a-worker")

    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.set_viewport_size({"width": 1280, "height": 800})

    page.get_by_role("navigation", name="Main").get_by_role("link", name="System").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("System")
    expect(page.locator(".worker-warning")).to_be_visible()
    expect(page.locator("tr", has_text="taskWorkers").locator(".pill-warn")).to_have_text("warning")
    screenshots.take(page, "system-without-a-worker")
