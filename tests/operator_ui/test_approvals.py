"""Exec approvals in the console, for staff users: the header's badge (one COUNT), the approvals page
(pending ones with their command, directory, session, agent, host and asker; the recent decisions), each
decision a POST with the CSRF token through ``exec_approval_resolve`` as the logged-in user (audited;
"Always allow here" adds the entry to the gateway's policy document), the service's refusal shown when the
approval moved on, the pending approval inline in its tool call's card on the session page, and the
``approvals`` topic of the live socket. Users without staff status get 403 and nothing is read or done."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import timedelta

import pytest
from channels.layers import InMemoryChannelLayer, channel_layers
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals_app.models import GATEWAY_SCOPE, ApprovalStatus, ExecApproval, ExecApprovalPolicy
from approvals_app.services import approvals
from gateway import events
from gateway import scopes as sc
from gateway.audit import Actor
from gateway.models import AuditLog
from operator_ui.consumers import SESSIONS_GROUP, ConsoleConsumer
from tests.operator_ui.test_tool_transcript import cards, running_turn, tool_result, tool_use
from tests.operator_ui.test_views import make, session_url, text_of
from tests.support.operators import operator_user

pytestmark = pytest.mark.django_db

CWD = "/srv/work"


@pytest.fixture
def staff_client(client, django_user_model):
    client.force_login(operator_user("boss", sc.ADMIN, is_staff=True))
    return client


def ask(command: str = "git status", **fields) -> ExecApproval:
    """An approval the exec gate of turn ``run-1`` asks for its call ``c1`` (as ``ExecGate.decide`` does)."""
    defaults = dict(
        command=command,
        argv=None,
        cwd=CWD,
        host="gateway",
        node_id=None,
        agent_id="main",
        session_key="agent:main:asks",
        session_id="window-1",
        run_id="run-1",
        tool_call_id="c1",
        timeout_ms=None,
        requested_by=Actor(label="run:run-1", scopes=()),
        security="allowlist",
        ask="on-miss",
    )
    return approvals.exec_approval_request(**{**defaults, **fields})


def decide(client, approval_id: str, decision: str, **data):
    url = reverse("ui:approval-decide", kwargs={"approval_id": approval_id, "decision": decision})
    return client.post(url, data, follow=True)


def messages_of(response) -> list[str]:
    return [message.message for message in get_messages(response.wsgi_request)]


def world() -> dict:
    """Everything a decision may change."""
    return {
        "approvals": list(ExecApproval.objects.order_by("pk").values()),
        "policies": list(ExecApprovalPolicy.objects.order_by("pk").values()),
        "audit": AuditLog.objects.count(),
    }


# --- the badge and the page ---------------------------------------------------------------------


def test_staff_see_the_number_of_pending_approvals_in_the_header_for_one_count(staff_client, django_user_model):
    ask(tool_call_id="c1")
    ask(tool_call_id="c2")
    decided = ask(tool_call_id="c3")
    approvals.exec_approval_resolve(approval_id=decided.pk, decision="deny", actor=Actor.system())
    overdue = ask(tool_call_id="c4")
    ExecApproval.objects.filter(pk=overdue.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    operator = Client()
    operator.force_login(operator_user("ops", sc.WRITE))

    with CaptureQueriesContext(connection) as staff_queries:
        staff_page = text_of(staff_client.get(reverse("ui:runs")))
    with CaptureQueriesContext(connection) as operator_queries:
        operator_page = text_of(operator.get(reverse("ui:runs")))

    badge = staff_page.split('<span data-live-region="approvals-badge">', 1)[1].split("</span></a></span>", 1)[0]
    assert f'<a href="{reverse("ui:approvals")}">Approvals <span class="badge badge-alert">2' in badge
    assert '<span class="visually-hidden"> pending' in badge
    assert reverse("ui:approvals") not in operator_page
    approval_reads = [query["sql"] for query in staff_queries.captured_queries if "execapproval" in query["sql"]]
    assert len(staff_queries.captured_queries) == len(operator_queries.captured_queries) + 1
    assert len(approval_reads) == 1 and "COUNT(*)" in approval_reads[0]


def test_no_pending_approval_is_a_quiet_zero(staff_client):
    page = text_of(staff_client.get(reverse("ui:sessions")))

    assert 'Approvals <span class="badge">0<span class="visually-hidden"> pending</span></span>' in page


def test_the_page_lists_pending_approvals_and_the_recent_decisions(staff_client):
    session = make("agent:main:asks")
    waiting = ask("git push origin main", warning_text="the agent sets GIT_SSH_COMMAND")
    denied = ask("rm -rf build", tool_call_id="c2")
    approvals.exec_approval_resolve(approval_id=denied.pk, decision="deny", actor=Actor(label="user:alice"))
    expired = ask("make deploy", tool_call_id="c3")
    ExecApproval.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    approvals.exec_approval_expire(approval_id=expired.pk)

    response = staff_client.get(reverse("ui:approvals"))

    assert response.status_code == 200 and response.context["nav"] == "approvals"
    page = text_of(response)
    pending, settled = page.split('id="settled-title"', 1)
    assert "<code>git push origin main</code>" in pending and "rm -rf build" not in pending
    assert f"<code>{CWD}</code>" in pending
    assert f'<a href="{session_url(session)}">agent:main:asks</a>' in pending
    assert "<dt>Agent</dt><dd>main</dd>" in pending and "<dt>Runs on</dt><dd>this gateway</dd>" in pending
    assert "run:run-1" in pending
    assert re.search(r'expires <time datetime="[^"]+" title="[^"]+ UTC">in \d+ (s|min|h)</time>', pending)
    assert "the agent sets GIT_SSH_COMMAND" in pending
    for decision in ("allow-once", "allow-always", "deny"):
        assert reverse("ui:approval-decide", kwargs={"approval_id": waiting.pk, "decision": decision}) in pending
    assert ">Allow once<" in pending and ">Always allow here<" in pending and ">Deny<" in pending
    rows = re.findall(r"<tr>\s*<td data-label=\"Command\">(.*?)</tr>", settled, re.S)
    assert len(rows) == 2
    assert "make deploy" in rows[0] and "expired" in rows[0] and "timeout" in rows[0] and "nobody" in rows[0]
    assert "rm -rf build" in rows[1] and ">denied<" in rows[1] and ">deny<" in rows[1] and "user:alice" in rows[1]
    assert 'data-live-topics="approvals"' in page
    assert 'data-live-events="exec.approval.requested exec.approval.resolved"' in page


def test_a_command_that_cannot_be_kept_offers_no_always_allow(staff_client):
    approval = ask("echo approved > proof")  # a redirection is never an allowlist match

    page = text_of(staff_client.get(reverse("ui:approvals")))

    assert approval.request["allowedDecisions"] == ["allow-once", "deny"]
    assert "Always allow here<" not in page and "“Always allow here” is not offered for this command" in page
    assert "<code>echo approved &gt; proof</code>" in page


def test_an_empty_page_says_what_shows_here(staff_client):
    page = text_of(staff_client.get(reverse("ui:approvals")))

    assert "No command is waiting for approval." in page and "No approval decided yet." in page


# --- decisions -----------------------------------------------------------------------------------


def test_allow_once_approves_as_the_user_and_is_audited(staff_client):
    approval = ask()

    response = decide(staff_client, approval.pk, "allow-once")

    assert response.redirect_chain == [(reverse("ui:approvals"), 302)]
    assert messages_of(response) == ["Allowed once: git status"]
    approval.refresh_from_db()
    assert (approval.status, approval.decision, approval.resolved_by) == ("approved", "allow-once", "user:boss")
    row = AuditLog.objects.get(action="exec.approval.resolve")
    assert (row.actor, row.actor_user.username, row.target_id) == ("user:boss", "boss", approval.pk)
    assert row.data["decision"] == "allow-once" and row.data["command"] == "git status"
    assert not ExecApprovalPolicy.objects.exists()
    assert "No command is waiting for approval." in text_of(response)


def test_always_allow_here_adds_the_entry_to_the_gateways_policy_document(staff_client):
    approval = ask("git status")

    response = decide(staff_client, approval.pk, "allow-always")

    assert messages_of(response) == ["Always allowed here: git status"]
    approval.refresh_from_db()
    assert (approval.status, approval.decision) == ("approved", "allow-always")
    policy = ExecApprovalPolicy.objects.get(scope=GATEWAY_SCOPE)
    [entry] = policy.document["agents"]["main"]["allowlist"]
    assert entry["source"] == "allow-always" and entry["argPattern"].startswith("sha256:cwd-argv:v1:")
    assert policy.updated_by == "user:boss"
    assert AuditLog.objects.filter(action="exec.approvals.allow-always", actor="user:boss").exists()


def test_deny_denies(staff_client):
    approval = ask()

    response = decide(staff_client, approval.pk, "deny")

    assert messages_of(response) == ["Denied: git status"]
    approval.refresh_from_db()
    assert (approval.status, approval.decision, approval.resolved_by) == ("denied", "deny", "user:boss")


def test_a_stale_or_unknown_approval_shows_the_services_refusal_and_changes_nothing(staff_client):
    decided = ask(tool_call_id="c1")
    approvals.exec_approval_resolve(approval_id=decided.pk, decision="deny", actor=Actor(label="user:alice"))
    overdue = ask(tool_call_id="c2")
    ExecApproval.objects.filter(pk=overdue.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    unkeepable = ask("echo hi > out", tool_call_id="c3")
    before = world()

    other_decision = decide(staff_client, decided.pk, "allow-once")
    unknown = decide(staff_client, "no-such-approval", "allow-once")
    expired = decide(staff_client, overdue.pk, "deny")
    not_offered = decide(staff_client, unkeepable.pk, "allow-always")

    assert messages_of(other_decision) == ["approval already resolved"]
    assert messages_of(unknown) == ["unknown or expired approval id"]
    assert messages_of(expired) == ["unknown or expired approval id"]
    assert messages_of(not_offered) == ["allow-always is unavailable for this command"]
    assert 'class="error"' in text_of(unknown)
    assert world() == before


def test_the_same_decision_again_says_it_was_already_made(staff_client):
    approval = ask()
    approvals.exec_approval_resolve(approval_id=approval.pk, decision="deny", actor=Actor(label="user:alice"))
    before = world()

    response = decide(staff_client, approval.pk, "deny")

    assert messages_of(response) == ["Already decided (deny, by user:alice): git status"]
    assert world() == before


def test_an_unknown_decision_is_404_and_a_get_changes_nothing(staff_client):
    approval = ask()
    url = reverse("ui:approval-decide", kwargs={"approval_id": approval.pk, "decision": "allow-once"})

    assert decide(staff_client, approval.pk, "allow-twice").status_code == 404
    assert staff_client.get(url).status_code == 405
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


def test_users_without_staff_status_get_403_and_nothing_is_decided(operator_client):
    approval = ask()
    before = world()

    page = operator_client.get(reverse("ui:approvals"))
    responses = [decide(operator_client, approval.pk, decision) for decision in ("allow-once", "allow-always", "deny")]
    anonymous = Client().post(reverse("ui:approval-decide", kwargs={"approval_id": approval.pk, "decision": "deny"}))

    assert page.status_code == 403
    assert [response.status_code for response in responses] == [403, 403, 403]
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("ui:login"))
    assert world() == before


def test_decisions_need_the_csrf_token(django_user_model):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator_user("boss", sc.ADMIN, is_staff=True))
    approval = ask()
    before = world()

    response = strict.post(reverse("ui:approval-decide", kwargs={"approval_id": approval.pk, "decision": "allow-once"}))

    assert response.status_code == 403
    assert world() == before


def test_an_approval_id_with_a_slash_is_decided_too(staff_client):
    approval = ask(approval_id="team/build-42", run_id="", tool_call_id="")

    response = decide(staff_client, approval.pk, "allow-once")

    assert messages_of(response) == ["Allowed once: git status"]
    assert ExecApproval.objects.get(pk="team/build-42").status == ApprovalStatus.APPROVED


def test_a_decision_goes_back_to_the_console_page_it_was_made_on_and_nowhere_else(staff_client):
    session = make("agent:main:asks")
    first, second = ask(tool_call_id="c1"), ask(tool_call_id="c2")

    back = decide(staff_client, first.pk, "deny", next=session_url(session))
    away = decide(staff_client, second.pk, "deny", next="https://evil.example/ui/")

    assert back.redirect_chain == [(session_url(session), 302)]
    assert away.redirect_chain == [(reverse("ui:approvals"), 302)]


# --- inline on the session page ------------------------------------------------------------------


def test_the_pending_approval_shows_in_its_tool_calls_card_with_the_three_decisions(staff_client):
    session = make("agent:main:asks")
    run_id = running_turn(session)
    tool_use(run_id, 1, ("c1", "exec", {"command": "git status"}))
    approval = ask(run_id=run_id, tool_call_id="c1")

    [card] = cards(text_of(staff_client.get(session_url(session))))

    assert "Waiting for an operator's approval" in card
    assert '<dt>Command</dt><dd><code class="command">git status</code></dd>' in card
    assert f"<code>{CWD}</code>" in card and "run:run-1" in card
    for decision in ("allow-once", "allow-always", "deny"):
        assert reverse("ui:approval-decide", kwargs={"approval_id": approval.pk, "decision": decision}) in card
    assert card.count(f'<input type="hidden" name="next" value="{session_url(session)}">') == 3
    assert "Result: <strong" not in card

    response = decide(staff_client, approval.pk, "allow-once", next=session_url(session))

    assert response.redirect_chain == [(session_url(session), 302)]
    [card] = cards(text_of(response))
    assert "Waiting for an operator" not in card and 'status-word">running</strong>' in card


def test_users_without_staff_status_see_the_call_running_not_the_question(operator_client):
    session = make("agent:main:asks")
    run_id = running_turn(session)
    tool_use(run_id, 1, ("c1", "exec", {"command": "git status"}))
    ask(run_id=run_id, tool_call_id="c1")

    [card] = cards(text_of(operator_client.get(session_url(session))))

    assert "approval" not in card.lower() and 'status-word">running</strong>' in card


def test_an_approval_of_another_turn_is_not_put_on_a_call_with_the_same_id(staff_client):
    session = make("agent:main:asks")
    old = running_turn(session, "run-old", "before")
    tool_use(old, 1, ("call_0_0", "exec", {"command": "git status"}))
    tool_result(old, "s1.r1", "call_0_0", "exec", "clean", exitCode=0, durationMs=3)
    approval = ask(run_id="run-new", tool_call_id="call_0_0")  # its turn's messages are not on the page

    page = text_of(staff_client.get(session_url(session)))

    [card] = cards(page)
    assert "Waiting for an operator" not in card
    apart = page.split("Approvals waiting for this session", 1)[1]
    assert reverse("ui:approval-decide", kwargs={"approval_id": approval.pk, "decision": "deny"}) in apart


# --- the live socket's approvals topic -----------------------------------------------------------


@pytest.fixture
def layer(monkeypatch):
    layer = InMemoryChannelLayer()
    monkeypatch.setitem(channel_layers.backends, "default", layer)
    return layer


def _live(user: User, query: str = "") -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(ConsoleConsumer.as_asgi(), f"/ui/live/{query}")
    communicator.scope["user"] = user
    return communicator


REQUESTED = {"approvalKind": "exec", "id": "a1", "request": {"command": "ls"}, "createdAtMs": 1, "expiresAtMs": 2}


@pytest.mark.django_db(transaction=True)
def test_the_approvals_topic_passes_the_approval_events_on_to_a_user_who_may_decide_them(layer):
    staff = operator_user("boss", sc.ADMIN, is_staff=True)

    async def scenario():
        socket = _live(staff, "?topics=sessions,approvals")
        connected, _ = await socket.connect()
        assert connected
        await layer.group_send(events.BROADCAST_GROUP, events.broadcast_message("presence", {"presence": []}))
        await layer.group_send(
            events.BROADCAST_GROUP, events.broadcast_message("device.pair.requested", {"deviceId": "d"})
        )
        await layer.group_send(events.BROADCAST_GROUP, events.broadcast_message("exec.approval.requested", REQUESTED))
        resolved = {"id": "a1", "decision": "deny", "resolvedBy": "user:boss", "ts": 3, "request": {}}
        await layer.group_send(events.BROADCAST_GROUP, events.broadcast_message("exec.approval.resolved", resolved))
        frames = [json.loads(await socket.receive_from()) for _ in range(2)]
        quiet = await socket.receive_nothing()
        await socket.disconnect()
        return frames, quiet

    frames, quiet = asyncio.run(scenario())

    assert [frame["event"] for frame in frames] == ["exec.approval.requested", "exec.approval.resolved"]
    assert frames[0]["payload"] == REQUESTED
    assert quiet  # neither presence nor the pairing events (a topic not asked for)


@pytest.mark.django_db(transaction=True)
def test_the_approvals_topic_is_not_joined_for_a_user_without_operator_approvals(layer):
    operator = operator_user("ops", sc.WRITE)

    async def scenario():
        socket = _live(operator, "?topics=approvals")
        connected, _ = await socket.connect()
        await layer.group_send(events.BROADCAST_GROUP, events.broadcast_message("exec.approval.requested", REQUESTED))
        quiet = await socket.receive_nothing()
        await socket.disconnect()
        return connected, quiet, layer.groups.get(events.BROADCAST_GROUP, {})

    connected, quiet, members = asyncio.run(scenario())

    assert connected and quiet and not members


@pytest.mark.django_db(transaction=True)
def test_the_sessions_topic_passes_a_turns_tool_steps_on_and_not_its_other_agent_streams(layer):
    operator = operator_user("ops", sc.WRITE)
    start = {"sessionKey": "k", "runId": "r", "stream": "tool", "data": {"phase": "start", "name": "exec"}}

    async def scenario():
        socket = _live(operator)
        await socket.connect()
        for stream in ("lifecycle", "assistant"):
            payload = {"sessionKey": "k", "runId": "r", "stream": stream, "data": {}}
            await layer.group_send(SESSIONS_GROUP, events.broadcast_message("agent", payload))
        await layer.group_send(SESSIONS_GROUP, events.broadcast_message("agent", start))
        frame = json.loads(await socket.receive_from())
        quiet = await socket.receive_nothing()
        await socket.disconnect()
        return frame, quiet

    frame, quiet = asyncio.run(scenario())

    assert frame == {"event": "agent", "payload": start}
    assert quiet


def test_markup_in_an_approvals_command_or_directory_is_shown_never_run(staff_client):
    session = make("agent:main:asks")
    run_id = running_turn(session)
    evil = "echo '<script>alert(1)</script>'"
    tool_use(run_id, 1, ("c1", "exec", {"command": evil}))
    approval = ask(evil, cwd="/srv/<b>work</b>", run_id=run_id, tool_call_id="c1")

    listed = text_of(staff_client.get(reverse("ui:approvals")))
    inline = text_of(staff_client.get(session_url(session)))
    decided = text_of(decide(staff_client, approval.pk, "deny"))

    for page in (listed, inline, decided):
        assert "<script>alert" not in page and "<b>work" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in listed and "/srv/&lt;b&gt;work&lt;/b&gt;" in listed
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in inline
    assert "Denied: echo &#x27;&lt;script&gt;alert(1)&lt;/script&gt;&#x27;" in decided
