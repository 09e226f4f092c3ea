"""An exec approval decided in the console, in Debian's Chromium against a real gateway process whose turns call
the mock model: a turn's plan asks for one ``exec`` the default policy does not allow outright (it asks on a
miss), the session page shows the pending approval inline in the call's card (over the live socket), the
approvals page lists it with the header's badge counting it, "Allow once" on the session page lets the command
run, the turn ends ok with the exec card showing its output, and the file it wrote is in the agent workspace.
axe runs on the approvals page and on the session page with its tool cards (no serious or critical
violation); every page is saved at the desktop and the phone size under ``test-artifacts/screenshots/``."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from approvals_app.models import ApprovalStatus, ExecApproval
from gateway import scopes as sc
from gateway.models import AuditLog
from sessions_app.models import Run, RunStatus
from tests.browser.test_accessibility import blocking_violations
from tests.browser.test_console import PASSWORD, REPLY_WAIT_S, create_session, log_in, reload_until_visible
from tests.support.operators import operator_user

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

KEY = "agent:main:approve-exec"
HOLD = "HOLD-EXEC-PLAN"
COMMAND = "echo approved > proof && cat proof"
PLAN = {
    "steps": [{"text": "Writing the proof file.", "calls": [{"name": "exec", "arguments": {"command": COMMAND}}]}],
    "final": "done: {last_tool_result}",
}


def wait_until_held(mock_openai, marker: str) -> None:
    deadline = time.monotonic() + REPLY_WAIT_S
    while marker not in mock_openai.held():
        assert time.monotonic() < deadline, f"no model request carrying {marker} arrived"
        time.sleep(0.05)


def test_an_operator_allows_an_exec_once_from_the_session_page_and_the_turn_runs_it(
    page, model_gateway, mock_openai, django_user_model, screenshots
):
    operator_user("ops", sc.ADMIN, password=PASSWORD, is_staff=True)
    log_in(page, model_gateway, "ops", PASSWORD)
    create_session(page, KEY)
    session_url = page.url
    problems: list[str] = []
    # The model's first answer waits until the page is open: what follows reaches it over its live socket.
    mock_openai.hold(HOLD)
    try:
        page.get_by_label("Message").fill(f"Write the proof ({HOLD}). TOOL_PLAN: {json.dumps(PLAN)}")
        page.get_by_role("button", name="Send").click()
        expect(page.get_by_role("button", name="Stop the running turn")).to_be_visible()
        transcript = page.locator('[data-live-region="transcript"]')
        expect(transcript.locator(".tool-card")).to_have_count(0)
        wait_until_held(mock_openai, HOLD)
    finally:
        mock_openai.release(HOLD)
    card = transcript.locator(".tool-card").filter(has_text="echo approved")
    # No reload: the page follows the turn (the tool's start, the approval's request) over its live socket.
    expect(card.get_by_text("Waiting for an operator's approval")).to_be_visible(timeout=REPLY_WAIT_S * 1000)
    expect(card.locator(".tool-summary")).to_have_text(COMMAND)
    expect(card.locator("code.command")).to_have_text(COMMAND)
    # The step's text is in its assistant message; the streaming box was reset when the tool started.
    expect(transcript.locator("article.role-assistant .text").first).to_have_text("Writing the proof file.")
    expect(page.locator("#streaming-reply")).to_be_hidden()
    expect(page.locator('[data-live-region="approvals-badge"] .badge')).to_have_text(re.compile(r"^1\s*pending$"))
    assert Run.objects.get(session__key=KEY).status == RunStatus.RUNNING
    screenshots.take(page, "session-approval-pending")
    problems += blocking_violations(page, "session-approval-pending")

    page.get_by_role("navigation", name="Main").get_by_role("link", name=re.compile("^Approvals")).click()
    pending = page.locator('[data-live-region="approvals-pending"] article')
    expect(pending).to_have_count(1)
    expect(pending.locator("h3 code")).to_have_text(COMMAND)
    expect(pending.get_by_role("link", name=KEY)).to_be_visible()
    # A redirection is never an allowlist match: "Always allow here" is not offered for this command.
    expect(pending.get_by_role("button", name=re.compile("^Always allow here"))).to_have_count(0)
    screenshots.take(page, "approvals-pending")
    problems += blocking_violations(page, "approvals-pending")

    page.goto(session_url)
    card.get_by_role("button", name=re.compile("^Allow once")).click()
    expect(page).to_have_url(session_url)
    expect(page.locator(".messages li")).to_have_text(f"Allowed once: {COMMAND}")

    final = transcript.locator("article.role-assistant").filter(has_text="done: approved")
    reload_until_visible(page, final, timeout_s=REPLY_WAIT_S)
    result = card.locator(".tool-result")
    expect(result.locator(".tool-status")).to_contain_text(re.compile(r"Result: ok · exit code 0 · \d+ ms"))
    result.locator("summary").click()
    expect(result.locator("pre")).to_have_text("approved\n")
    expect(page.locator('[data-live-region="approvals-badge"] .badge')).to_have_text(re.compile(r"^0\s*pending$"))
    screenshots.take(page, "session-exec-done")
    problems += blocking_violations(page, "session-with-tool-cards")

    run = Run.objects.get(session__key=KEY)
    assert (run.status, run.output_text) == (RunStatus.OK, "done: approved\n")
    assert (Path(model_gateway.state_dir) / "workspace" / "proof").read_text() == "approved\n"
    approval = ExecApproval.objects.get(session_key=KEY)
    assert (approval.status, approval.decision, approval.resolved_by) == (
        ApprovalStatus.APPROVED, "allow-once", "user:ops",
    )  # fmt: skip
    assert (approval.run_id, approval.command) == (run.run_id, COMMAND)
    assert AuditLog.objects.filter(action="exec.approval.resolve", actor="user:ops", target_id=approval.pk).exists()

    page.goto(f"{model_gateway.http_url}/ui/approvals/")
    decided = page.locator('[data-live-region="approvals-settled"] tbody tr')
    expect(decided).to_have_count(1)
    expect(decided).to_contain_text("allow-once")
    expect(decided).to_contain_text("user:ops")
    screenshots.take(page, "approvals-decided")
    problems += blocking_violations(page, "approvals-decided")
    assert problems == [], "\n".join(problems)
