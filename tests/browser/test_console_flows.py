"""Operator flows of the console in Debian's Chromium against real gateway processes: a reply that streams
onto the page while its turn still runs, forking a session from one of its messages, approving a real node
host's pairing request, dispatching a session to that node while its stages show on the page, recovering a
failed placement from its terminal reason, and an admin recovery action with its audit row. Every page visited is
saved at the desktop and the phone size under ``test-artifacts/screenshots/``."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from playwright.sync_api import expect

from devices_app.models import PairedDevice
from gateway import scopes as sc
from gateway.models import AuditLog
from sessions_app.models import Run, RunStatus, Session
from tests.browser.test_console import PASSWORD, REPLY_WAIT_S, create_session, log_in, reload_until_visible
from tests.e2e.test_seed_004_paired_node_worker_lifecycle import model_env, publish_workspace
from tests.support.clients import call_once
from tests.support.mock_openai import slow
from tests.support.operators import operator_user
from tests.support.processes import start_node_host
from tests.workers_app.test_placement_store import make_session
from tests.workers_app.test_rpc import failed_without_environment
from workers_app.models import Placement, PlacementState

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Long enough between words that the page shows a partial reply while the turn is still running.
STREAMED_WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
WORD_DELAY_S = 0.4
NODE_WAIT_S = 30.0


def call_beside_the_browser(gateway, method: str, params: dict) -> dict:
    """One gateway call from a thread of its own: Playwright's sync API holds this thread's event loop."""
    with ThreadPoolExecutor(max_workers=1) as executor:
        return executor.submit(call_once, gateway, method, params).result()


def test_a_streamed_reply_shows_on_the_page_before_its_turn_ends(
    page, model_gateway, mock_openai, django_user_model, screenshots
):
    operator_user("ops", sc.WRITE, password=PASSWORD)
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
    # The status line follows the turn that started after the page was rendered.
    expect(page.locator('[data-live-region="status"]')).to_contain_text("status running")

    transcript = page.locator('[data-live-region="transcript"]')
    final = transcript.locator("article.role-assistant").filter(has_text=STREAMED_WORDS)
    reload_until_visible(page, final, timeout_s=REPLY_WAIT_S)
    screenshots.take(page, "reply-finished")
    assert Run.objects.get(session__key="agent:main:streamed").status == RunStatus.OK


def test_an_operator_forks_a_session_from_one_of_its_messages(page, gateway, django_user_model, screenshots):
    operator_user("ops", sc.WRITE, password=PASSWORD)
    log_in(page, gateway, "ops", PASSWORD)
    create_session(page, "agent:main:fork-source")
    transcript = page.locator('[data-live-region="transcript"]')
    for marker in ("first answer", "second answer"):
        page.get_by_label("Message").fill(f"Reply exactly: {marker}")
        page.get_by_role("button", name="Send").click()
        reply = transcript.locator("article.role-assistant").filter(has_text=marker)
        reload_until_visible(page, reply, timeout_s=REPLY_WAIT_S)
    screenshots.take(page, "fork-source")

    second_question = transcript.locator("article.role-user").filter(has_text="second answer")
    second_question.get_by_role("button", name=re.compile("^Fork from here")).click()

    expect(page.locator(".messages li")).to_contain_text("Forked from agent:main:fork-source")
    expect(page.locator(".session-key")).not_to_have_text("agent:main:fork-source")
    expect(page.get_by_label("Message")).to_have_value("Reply exactly: second answer")
    forked = page.locator('[data-live-region="transcript"]')
    expect(forked.locator("article.role-user")).to_have_count(1)
    expect(forked.locator("article.role-assistant")).to_have_text(re.compile("first answer"))
    screenshots.take(page, "fork-opened")

    # The draft is the operator's to send: the forked session goes on from there.
    page.get_by_role("button", name="Send").click()
    reload_until_visible(
        page, forked.locator("article.role-assistant").filter(has_text="second answer"), timeout_s=REPLY_WAIT_S
    )
    screenshots.take(page, "fork-continued")
    fork_key = page.locator(".session-key").inner_text()
    assert Run.objects.filter(session__key=fork_key, status=RunStatus.OK).count() == 1
    assert Run.objects.filter(session__key="agent:main:fork-source").count() == 2
    assert AuditLog.objects.filter(action="session.fork", actor="user:ops", target_id="agent:main:fork-source").exists()


def open_the_node_hosts_request(page, gateway, node_host):
    """Log in as ``ops``, open the nodes page and wait for the node host's pairing request; its Approve button."""
    node_host.pairing_request(timeout=NODE_WAIT_S)
    log_in(page, gateway, "ops", PASSWORD)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Nodes").click()
    approve = page.get_by_role("button", name="Approve test-node-host")
    reload_until_visible(page, approve, timeout_s=NODE_WAIT_S)
    return approve


def test_an_operator_approves_a_node_hosts_pairing_request(page, gateway, django_user_model, screenshots):
    operator_user("ops", sc.WRITE, sc.PAIRING, password=PASSWORD)
    node_host = start_node_host(gateway)
    try:
        approve = open_the_node_hosts_request(page, gateway, node_host)
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
        node_host.remove_state()


def test_an_operator_dispatches_a_session_to_a_node_and_watches_its_stages(
    page, gateway_factory, mock_openai, django_user_model, screenshots, tmp_path
):
    operator_user("ops", sc.WRITE, password=PASSWORD)
    workspace_root = tmp_path / "allowed"
    workspace_root.mkdir()
    published = publish_workspace(workspace_root)
    gateway = gateway_factory(extra_env=model_env(mock_openai, workspace_root))
    node_host = start_node_host(gateway, capacity=1, capacity_wait_ms=500)
    try:
        call_beside_the_browser(
            gateway, "node.pair.approve", {"requestId": node_host.pairing_request(timeout=NODE_WAIT_S)}
        )
        node_host.wait_connects(1, timeout=NODE_WAIT_S)
        key = "agent:qa:browser-dispatch"
        call_beside_the_browser(
            gateway,
            "sessions.create",
            {"key": key, "agentId": "qa", "worktree": True, "worktreeName": "browser-dispatch",
             "worktreeBaseRef": "main", "cwd": str(published)},
        )  # fmt: skip
        log_in(page, gateway, "ops", PASSWORD)
        page.goto(f"{gateway.http_url}/ui/sessions/{key}/")
        target = page.get_by_label("Dispatch to")
        # The node host is connected (above): the page offers it among the dispatch targets.
        expect(target.locator("option", has_text="test-node-host")).to_have_count(1)
        target.select_option(label="node test-node-host (1/1 free)")
        screenshots.take(page, "dispatch-chosen")
        page.get_by_role("button", name="Dispatch", exact=True).click()
        expect(page.locator(".messages li")).to_contain_text("Dispatch started")

        # The stages come in over the live socket while the dispatch runs, up to the placement being active.
        card = page.locator('[data-live-region="placement"]')
        expect(card.locator("ol.stages li").first).to_contain_text("Requested")
        reload_until_visible(page, card.locator(".state", has_text=re.compile("^active$")), timeout_s=NODE_WAIT_S * 2)
        screenshots.take(page, "dispatch-active")
        assert card.locator("ol.stages li .name").all_inner_texts() == [
            "Requested", "Provisioning the environment", "Syncing the workspace", "Starting the worker",
            "Active on the worker",
        ]  # fmt: skip
        assert "failed" not in card.locator("ol.stages li .status").all_inner_texts()
        assert Placement.objects.get(session_key=key).state == PlacementState.ACTIVE

        # A turn of the dispatched session runs on the node and its reply reaches the page.
        page.get_by_label("Message").fill("Reply exactly: answered on the node")
        page.get_by_role("button", name="Send").click()
        reply = page.locator('[data-live-region="transcript"] article.role-assistant').filter(
            has_text="answered on the node"
        )
        reload_until_visible(page, reply, timeout_s=REPLY_WAIT_S * 2)
        screenshots.take(page, "dispatch-turn")
    finally:
        mock_openai.release()
        node_host.stop()
        node_host.remove_state()


def test_an_operator_reads_a_failed_placements_reason_and_recovers_it(page, gateway, django_user_model, screenshots):
    operator_user("ops", sc.WRITE, password=PASSWORD)
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


def test_two_operators_rename_a_session_and_the_later_page_is_told_it_changed_first(
    page, browser, gateway, screenshots
):
    """Both pages show revision 1; the first rename wins, the second changes nothing and says why, and its page
    then shows the other operator's label with the new revision in every form."""
    for name in ("boss", "deputy"):
        operator_user(name, sc.ADMIN, password=PASSWORD)
    log_in(page, gateway, "boss", PASSWORD)
    create_session(page, "agent:main:renamed-twice")
    other_context = browser.new_context(viewport=page.viewport_size)
    try:
        other = other_context.new_page()
        log_in(other, gateway, "deputy", PASSWORD)
        other.goto(page.url)

        page.get_by_label("New label").fill("Boss's name")
        page.get_by_role("button", name="Save the label").click()
        expect(page.get_by_text("Label saved.")).to_be_visible()
        other.get_by_label("New label").fill("Deputy's name")
        other.get_by_role("button", name="Save the label").click()

        expect(
            other.get_by_text("Not saved: this session changed after the page showed it (revision 1, now 2)")
        ).to_be_visible()
        expect(other.get_by_label("New label")).to_have_value("Boss's name")
        # The title's rename in place and the card's four forms.
        expect(other.locator('input[name="revision"][value="2"]')).to_have_count(5)
        screenshots.take(other, "rename-refused")
    finally:
        other_context.close()
    stored = Session.objects.get(key="agent:main:renamed-twice")
    assert (stored.label, stored.revision) == ("Boss's name", 2)
