"""axe-core (bundled with pytest-playwright-axe, never fetched) over the console's main pages in Debian's
Chromium, against WCAG 2.2 AA rules: no serious or critical violation on any of them, in the light theme and in
the dark one. Each page's full axe report (JSON and HTML) is written under ``test-artifacts/axe/`` for a person
to read."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect
from pytest_playwright_axe import OPTIONS_WCAG_22AA, Axe

from gateway import scopes as sc
from tests.browser.test_console import PASSWORD, REPLY_WAIT_S, create_session, log_in, reload_until_visible
from tests.browser.test_look import DARK, PAGES, wide_world
from tests.operator_ui.test_pairing import operator_request
from tests.support.browser import AXE_REPORTS
from tests.support.operators import operator_user
from tests.workers_app.test_placement_store import make_session
from tests.workers_app.test_rpc import failed_without_environment

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

BLOCKING_IMPACTS = {"serious", "critical"}


def blocking_violations(page: Page, name: str) -> list[str]:
    results = Axe(output_directory=AXE_REPORTS, use_minified_file=True).run(
        page, filename=name, options=OPTIONS_WCAG_22AA
    )
    return [
        f"{name}: {violation['id']} ({violation['impact']}) {violation['help']} at "
        + ", ".join(str(node["target"]) for node in violation["nodes"][:3])
        for violation in results["violations"]
        if violation["impact"] in BLOCKING_IMPACTS
    ]


def test_the_main_pages_have_no_serious_accessibility_violations(page, gateway, django_user_model):
    # Staff: the pages show everything they can (the pairing page, dispatch profiles) to be checked.
    operator_user("ops", sc.ADMIN, password=PASSWORD, is_staff=True)
    operator_request()
    failed_without_environment(make_session("agent:main:failed-placement"))
    problems: list[str] = []

    page.goto(f"{gateway.http_url}/ui/login/")
    problems += blocking_violations(page, "login")
    log_in(page, gateway, "ops", PASSWORD)
    create_session(page, "agent:main:a11y")
    page.get_by_label("Message").fill("Reply exactly: an accessible reply")
    page.get_by_role("button", name="Send").click()
    reply = page.locator('[data-live-region="transcript"] article.role-assistant')
    reload_until_visible(page, reply, timeout_s=REPLY_WAIT_S)
    problems += blocking_violations(page, "session-with-a-turn")

    page.goto(f"{gateway.http_url}/ui/sessions/agent:main:failed-placement/")
    expect(page.get_by_role("button", name="Recover to this gateway")).to_be_visible()
    problems += blocking_violations(page, "session-with-a-failed-placement")

    for name in ("sessions", "runs", "environments", "nodes", "pairing", "approvals", "system", "logs", "usage"):
        page.goto(f"{gateway.http_url}/ui/{name}/")
        expect(page.get_by_role("heading", level=1)).to_be_visible()
        problems += blocking_violations(page, name)

    assert problems == [], "\n".join(problems)


def test_the_pages_in_dark_mode_have_no_serious_accessibility_violations(page, gateway, django_user_model, monkeypatch):
    # The system asks for dark and the chooser stays on "auto": the colours axe checks are the dark theme's.
    operator_user("ops", sc.ADMIN, password=PASSWORD, is_staff=True)
    key = wide_world(monkeypatch)
    page.emulate_media(color_scheme="dark")
    problems: list[str] = []

    page.goto(f"{gateway.http_url}/ui/login/")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == DARK
    problems += blocking_violations(page, "dark-login")
    log_in(page, gateway, "ops", PASSWORD)
    for name in PAGES:
        page.goto(f"{gateway.http_url}/ui/{name}/")
        expect(page.get_by_role("heading", level=1)).to_be_visible()
        problems += blocking_violations(page, f"dark-{name}")
    page.goto(f"{gateway.http_url}/ui/sessions/{key}/")
    expect(page.locator(".tool-card")).to_have_count(1)
    problems += blocking_violations(page, "dark-session-with-a-tool-card-and-a-placement")
    page.goto(f"{gateway.http_url}/ui/no-such-page/")
    problems += blocking_violations(page, "dark-not-found")

    assert problems == [], "\n".join(problems)
