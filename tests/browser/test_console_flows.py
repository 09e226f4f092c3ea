"""Operator flows of the console in Debian's Chromium against real gateway processes: a reply that streams
onto the page while its turn still runs, approving a real node host's pairing request, recovering a failed
placement from its terminal reason, and an admin recovery action with its audit row. Every page visited is
saved at the desktop and the phone size under ``test-artifacts/screenshots/``."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from openclaw_site.gateway.models import AuditLog, PairedDevice
from sessions_app.models import Run, RunStatus
from tests.browser.test_console import PASSWORD, REPLY_WAIT_S, create_session, log_in, reload_until_visible
from tests.support.mock_openai import slow
from tests.support.processes import start_node_host
from tests.workers_app.test_placement_store import make_session
from tests.workers_app.test_rpc import failed_without_environment
from workers_app.models import Placement, PlacementState

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Long enough between words that the page shows a partial reply while the turn is still running.
STREAMED_WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
WORD_DELAY_S = 0.4
NODE_WAIT_S = 30.0


def test_a_streamed_reply_shows_on_the_page_before_its_turn_ends(
    page, model_gateway, mock_openai, django_user_model, screenshots
):
    django_user_model.objects.create_user(username="ops", password=PASSWORD)
    mock_openai.script(slow(STREAMED_WORDS, WORD_DELAY_S))
    log_in(page, model_gateway, "ops", PASSWORD)
    create_session(page, "agent:main:streamed")

    page.get_by_label("Message").fill("Tell me the Greek letters")
    page.get_by_role("button", name="Send").click()
    streaming = page.locator("#streaming-reply .text")
    expect(streaming).to_have_text(re.compile(r"^alpha"), timeout=REPLY_WAIT_S * 1000)
    shown_while_streaming = streaming.inner_text()
    turn_status = Run.objects.get(session__key="agent:main:streamed").status
    screenshots.take(page, "reply-streaming")

    # What the page showed came from the running turn: a beginning of the reply, before the turn ended.
    assert STREAMED_WORDS.startswith(shown_while_streaming.strip())
    assert turn_status == RunStatus.RUNNING
    expect(page.get_by_role("button", name="Stop the running turn")).to_be_visible()

    transcript = page.locator('[data-live-region="transcript"]')
    final = transcript.locator("article.role-assistant").filter(has_text=STREAMED_WORDS)
    reload_until_visible(page, final, timeout_s=REPLY_WAIT_S)
    screenshots.take(page, "reply-finished")
    assert Run.objects.get(session__key="agent:main:streamed").status == RunStatus.OK


def test_an_operator_approves_a_node_hosts_pairing_request(page, gateway, django_user_model, screenshots):
    django_user_model.objects.create_user(username="ops", password=PASSWORD)
    node_host = start_node_host(gateway)
    try:
        node_host.pairing_request(timeout=NODE_WAIT_S)
        log_in(page, gateway, "ops", PASSWORD)
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Nodes").click()
        approve = page.get_by_role("button", name="Approve test-node-host")
        reload_until_visible(page, approve, timeout_s=NODE_WAIT_S)
        screenshots.take(page, "nodes-pending-request")

        approve.click()
        expect(page.locator(".messages li")).to_have_count(1)
        expect(page.get_by_role("button", name="Approve test-node-host")).to_have_count(0)
        node_host.wait_connects(1, timeout=NODE_WAIT_S)
        reload_until_visible(page, page.get_by_role("cell", name="test-node-host"), timeout_s=NODE_WAIT_S)
        screenshots.take(page, "nodes-paired")
        assert PairedDevice.objects.filter(display_name="test-node-host", is_node=True).exists()
        assert AuditLog.objects.filter(action__contains="approve", actor="user:ops").exists()
    finally:
        node_host.stop()


def test_an_operator_reads_a_failed_placements_reason_and_recovers_it(page, gateway, django_user_model, screenshots):
    django_user_model.objects.create_user(username="ops", password=PASSWORD)
    session = make_session("agent:main:failed-placement")
    failed = failed_without_environment(session)
    log_in(page, gateway, "ops", PASSWORD)
    page.get_by_role("link", name="agent:main:failed-placement").click()

    placement_card = page.locator('[data-live-region="placement"]')
    expect(placement_card.locator(".state")).to_have_text("failed")
    expect(placement_card).to_contain_text("cloud worker disappeared: environment record missing")
    screenshots.take(page, "placement-failed")

    page.get_by_role("button", name="Recover to this gateway").click()
    expect(page.locator(".messages li")).to_contain_text("Placement is now local.")
    expect(placement_card.locator(".state")).to_have_text("local")
    expect(placement_card.get_by_role("button", name="Recover to this gateway")).to_have_count(0)
    screenshots.take(page, "placement-recovered")
    placement = Placement.objects.get(pk=session.pk)
    assert (placement.state, placement.generation > failed.generation) == (PlacementState.LOCAL, True)


def test_an_admin_recovery_action_writes_an_audit_row_shown_in_the_admin(page, gateway, django_user_model, screenshots):
    django_user_model.objects.create_superuser(username="admin", password=PASSWORD)
    session = make_session("agent:main:admin-recovery")
    failed_without_environment(session)

    page.goto(f"{gateway.http_url}/admin/workers_app/placement/")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    row = page.get_by_role("row").filter(has_text="agent:main:admin-recovery")
    expect(row).to_be_visible()
    screenshots.take(page, "admin-placements")

    row.get_by_role("checkbox").check()
    page.locator("select[name=action]").select_option(label="Recover a failed placement to the gateway")
    page.get_by_role("button", name="Run").click()
    expect(page.locator(".messagelist")).to_contain_text("1")
    screenshots.take(page, "admin-recovered")
    assert Placement.objects.get(pk=session.pk).state == PlacementState.LOCAL

    page.goto(f"{gateway.http_url}/admin/gateway/auditlog/?q={session.key}")
    audit_row = page.get_by_role("row").filter(has_text="placement.recover_to_gateway")
    expect(audit_row).to_have_count(1)
    expect(audit_row).to_contain_text("user:admin")
    expect(audit_row).to_contain_text("failed@")
    screenshots.take(page, "admin-audit-row")
    row = AuditLog.objects.get(target_id=session.key, action="placement.recover_to_gateway")
    assert (row.actor_user.username, row.data["after"].split("@")[0]) == ("admin", PlacementState.LOCAL)
