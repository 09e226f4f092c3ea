"""Every console page at phone width (390×844) in Debian's Chromium against a real gateway process: none scrolls
sideways (``document.documentElement.scrollWidth <= 390``), with data that makes pages wide — long session keys,
ids and commands, a transcript with a tool card, a placement card with its stages, an environment, a paired and a
pending node, a pending device, a pending exec approval. Then the theme chooser: dark is applied, remembered
across pages and before the first paint, and "auto" follows the system's colour scheme. Every page is saved at
the desktop and the phone size under ``test-artifacts/screenshots/``."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from devices_app.services import pairing
from gateway import scopes as sc
from gateway.audit import Actor
from sessions_app.services import runs
from tests.browser.test_console import PASSWORD, log_in
from tests.operator_ui.test_approvals import ask
from tests.operator_ui.test_nodes import pending_request
from tests.operator_ui.test_pairing import operator_request
from tests.operator_ui.test_tool_transcript import finish, running_turn, tool_result, tool_use
from tests.operator_ui.test_views import make
from tests.support.browser import DESKTOP, PHONE
from tests.support.operators import operator_user
from tests.workers_app.test_placement_store import dispatch_to_active_on

# The System page reads both databases (its readiness checks the harness store's migrations).
pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True, databases="__all__")]

LONG_KEY = "agent:main:look-" + "a-rather-long-session-key-" * 4 + "end"
LONG_COMMAND = "find /srv/projects/some/deeply/nested/folder -name '*.py' -newer " + "x" * 160
PAGES = ("sessions", "runs", "environments", "nodes", "pairing", "approvals", "usage", "logs", "system")


def wide_world(monkeypatch) -> str:
    """Rows of every kind the pages list, each with long ids and text; returns the session's key."""
    # This test claims its turn itself: no runner of this process may take it meanwhile.
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)
    session = make(LONG_KEY)
    run_id = running_turn(session, "look-run-" + "0123456789abcdef" * 3)
    tool_use(run_id, 1, ("call-look-1", "exec", {"command": LONG_COMMAND}), text="Looking for the files.")
    tool_result(run_id, "s1.r", "call-look-1", "exec", "/srv/" + "y" * 400 + "\n", exitCode=0, durationMs=12)
    finish(run_id, "Found " + "z" * 300)
    dispatch_to_active_on(session, "worker:env-look-" + "0123456789abcdef" * 4)
    pending_request("e" * 64)
    paired_node = pending_request("f" * 64)
    pairing.pairing_request_approve(request_id=str(paired_node.request_id), actor=Actor.system(), role="node")
    operator_request()
    ask(command=LONG_COMMAND, session_key=LONG_KEY)
    return session.key


def overflow(page: Page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


def test_every_console_page_fits_a_phone_without_sideways_scrolling(
    page, gateway, django_user_model, screenshots, monkeypatch
):
    operator_user("ops", sc.ADMIN, password=PASSWORD, is_staff=True)
    key = wide_world(monkeypatch)
    too_wide: list[str] = []

    def visit(name: str, path: str, status: int = 200) -> None:
        page.set_viewport_size(PHONE)
        response = page.goto(f"{gateway.http_url}{path}")
        assert response is not None and response.status == status, (name, response and response.status)
        expect(page.get_by_role("heading", level=1)).to_be_visible()
        width = overflow(page)
        if width > PHONE["width"]:
            too_wide.append(f"{name} ({path}): {width} px")
        screenshots.take(page, name)

    visit("login", "/ui/login/")
    log_in(page, gateway, "ops", PASSWORD)
    expect(page).to_have_url(f"{gateway.http_url}/ui/sessions/")
    for name in PAGES:
        visit(name, f"/ui/{name}/")
    visit("session", f"/ui/sessions/{key}/")
    expect(page.locator(".tool-card")).to_have_count(1)
    visit("not-found", "/ui/no-such-page/", status=404)

    # The navigation is one row at phone width: it scrolls inside itself, never the page.
    page.set_viewport_size(PHONE)
    nav_height = page.get_by_role("navigation", name="Main").evaluate("nav => nav.getBoundingClientRect().height")
    assert nav_height < 48, nav_height
    page.set_viewport_size(DESKTOP)
    assert too_wide == [], "pages wider than the phone:\n" + "\n".join(too_wide)


def background(page: Page) -> str:
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


LIGHT, DARK = "rgb(255, 255, 255)", "rgb(13, 17, 23)"


def test_the_theme_chooser_switches_to_dark_remembers_it_and_auto_follows_the_system(
    page, gateway, django_user_model, screenshots
):
    operator_user("ops", sc.READ, password=PASSWORD)
    page.emulate_media(color_scheme="light")
    log_in(page, gateway, "ops", PASSWORD)
    theme = page.get_by_label("Theme")
    expect(theme).to_have_value("auto")
    assert background(page) == LIGHT

    theme.select_option("dark")
    assert background(page) == DARK
    page.goto(f"{gateway.http_url}/ui/runs/")
    # Applied by the head's script before the body was drawn, and the chooser says so.
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    expect(page.get_by_label("Theme")).to_have_value("dark")
    assert background(page) == DARK
    screenshots.take(page, "runs-dark")

    page.get_by_label("Theme").select_option("auto")
    assert background(page) == LIGHT
    page.emulate_media(color_scheme="dark")
    assert background(page) == DARK  # auto: the system's scheme
    page.reload()
    assert page.evaluate("document.documentElement.hasAttribute('data-theme')") is False
    assert page.evaluate("localStorage.getItem('openclaw-console-theme')") is None


def test_without_javascript_the_theme_follows_the_system_and_no_chooser_shows(browser, gateway, django_user_model):
    context = browser.new_context(java_script_enabled=False, color_scheme="dark", viewport=PHONE)
    try:
        page = context.new_page()
        page.goto(f"{gateway.http_url}/ui/login/")
        expect(page.get_by_label("Theme")).to_be_hidden()
        assert page.locator("body").evaluate("body => getComputedStyle(body).backgroundColor") == DARK
    finally:
        context.close()
