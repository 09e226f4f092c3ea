"""The Usage page in Debian's Chromium against a real gateway process: a turn answered by the built-in echo model
records its usage, and the page shows it — totals, the chart, the session that used the tokens (a link to its
page), the model without a price named — with no serious accessibility violation; then a refused range."""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from gateway import scopes as sc
from sessions_app.models import Run, RunStatus
from tests.browser.test_accessibility import blocking_violations
from tests.browser.test_console import PASSWORD, REPLY_WAIT_S, create_session, log_in, reload_until_visible
from tests.e2e.test_openclaw_compat import OPENCLAW, openclaw_call
from tests.support.operators import operator_user

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_turn_shows_on_the_usage_page(page: Page, gateway, django_user_model, screenshots):
    operator_user("ops", sc.WRITE, password=PASSWORD)
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
    expect(page.locator(".session-key")).to_have_text("agent:main:spender")

    page.goto(f"{gateway.http_url}/ui/usage/?startDate=2026-03-09&endDate=2026-03-01")
    expect(page.get_by_role("alert")).to_have_text("startDate must not be after endDate")
    screenshots.take(page, "usage-refused")


# --- OpenClaw's Control UI ---------------------------------------------------------------------------------


class SinglePageApp(SimpleHTTPRequestHandler):
    """The Control UI's files, and its index for every other path (its router owns ``/usage``)."""

    def send_head(self):
        if not Path(self.translate_path(self.path)).is_file():
            self.path = "/index.html"
        return super().send_head()

    def log_message(self, format, *args):
        pass


@pytest.fixture
def control_ui() -> Iterator[str]:
    folder = OPENCLAW.parent / "dist" / "control-ui"
    if not folder.is_dir():
        pytest.skip(f"OpenClaw's Control UI is not installed ({folder})")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(SinglePageApp, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.openclaw_cli
def test_openclaw_control_ui_draws_this_gateways_usage(page: Page, gateway, control_ui, screenshots):
    for n in (1, 2):
        code, _, _ = openclaw_call(gateway, "sessions.create", {"key": f"ui-usage-{n}"})
        assert code == 0
        code, _, _ = openclaw_call(
            gateway,
            "chat.send",
            {"sessionKey": f"ui-usage-{n}", "message": f"Reply exactly: usage {n}", "idempotencyKey": f"ui-u{n}"},
        )
        assert code == 0
        code, waited, _ = openclaw_call(gateway, "agent.wait", {"runId": f"ui-u{n}", "timeoutMs": 20000})
        assert code == 0 and waited["status"] == "ok"
    tokens = sum(run.usage["input"] + run.usage["output"] for run in Run.objects.all())
    answers: dict[str, dict] = {}
    asked: dict[str, str] = {}

    def record(websocket) -> None:
        def sent(payload) -> None:
            frame = json.loads(payload)
            if frame.get("type") == "req":
                asked[frame["id"]] = frame["method"]

        def received(payload) -> None:
            frame = json.loads(payload)
            if frame.get("type") == "res" and asked.get(frame["id"], "").startswith(("usage.", "sessions.usage")):
                answers[asked[frame["id"]]] = frame

        websocket.on("framesent", sent)
        websocket.on("framereceived", received)

    page.on("websocket", record)
    page.goto(f"{control_ui}/usage?gatewayUrl={gateway.url}#token={gateway.token}")
    # Served from another origin than the gateway's, the Control UI asks before it connects where the link says.
    page.get_by_role("button", name=re.compile(r"^Switch to 127\.0\.0\.1:")).click(timeout=30_000)

    expect(page.get_by_text("Daily Token Usage")).to_be_visible(timeout=30_000)
    expect(page.get_by_text(f"Total: {tokens}", exact=True)).to_be_visible(timeout=30_000)
    screenshots.take(page, "openclaw-control-ui-usage")
    assert answers["sessions.usage"]["ok"] is True
    assert answers["usage.status"]["ok"] is True and answers["usage.status"]["payload"]["providers"] == []
    listed = answers["sessions.usage"]["payload"]
    assert sorted(row["key"] for row in listed["sessions"]) == ["agent:main:ui-usage-1", "agent:main:ui-usage-2"]
    assert [day["totalTokens"] for day in listed["aggregates"]["costDaily"]] == [tokens]
