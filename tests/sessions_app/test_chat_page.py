"""OpenClaw's Control UI chat page against this gateway: chat.startup, sessions.resolve, sessions.messages.subscribe /
unsubscribe (their params, answers and refusals in OpenClaw's words), and the session.message / session.tool /
session.approval events they bring, routed to the subscribed connection of the subscribed session only."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from django.utils import timezone

from approvals_app.models import ExecApproval
from approvals_app.session_events import session_approval_payload, session_approvals_subscription
from gateway import scopes as sc
from gateway.events import keyed_subscription, subscription_group
from gateway.exceptions import InvalidRequest, NotFound
from gateway.registry import registry
from gateway.visibility import event_visible
from sessions_app import startup
from sessions_app.message_subscriptions import messages_subscription
from sessions_app.models import Run, RunStatus, Session, SessionWindow
from sessions_app.resolve import control_ui_slug, session_resolve
from sessions_app.schemas import ChatStartupParams, SessionsResolveParams
from sessions_app.services import sessions, transcripts
from tests.support.connections import dispatched, operator_context

pytestmark = pytest.mark.django_db

METHODS = ("chat.startup", "sessions.resolve", "sessions.messages.subscribe", "sessions.messages.unsubscribe")


def make(key: str, **fields) -> Session:
    return sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id=key.split(":")[1], **fields))


def dashboard(label: str = "", agent: str = "main", uid: str | None = None) -> Session:
    return make(f"agent:{agent}:dashboard:{uid or uuid.uuid4()}", label=label)


def append(session: Session, role: str, text: str, **extra):
    window = SessionWindow.objects.get(pk=session.session_id)
    return transcripts.transcript_append(
        session=session, window=window, type="message", body=transcripts.message_body(role, text, **extra)
    )


def refusal(method: str, params: dict, scopes: list[str] | None = None) -> str:
    response = dispatched(method, params, scopes=scopes or [sc.READ])
    assert response["ok"] is False, response
    assert response["error"]["code"] == "INVALID_REQUEST"
    return response["error"]["message"]


def resolve(**params) -> dict:
    return session_resolve(SessionsResolveParams(**params)).payload()


def page(**params) -> dict:
    return startup.chat_startup(ChatStartupParams(**params))


# --- registration and scopes ---------------------------------------------------------------------------------


def test_the_methods_need_operator_read_and_only_resolve_is_unadvertised():
    assert {name: registry.methods[name].scope for name in METHODS} == dict.fromkeys(METHODS, sc.READ)
    advertised = set(registry.method_names())
    assert "sessions.resolve" not in advertised
    assert {"chat.startup", "sessions.messages.subscribe", "sessions.messages.unsubscribe"} <= advertised
    assert {"session.message", "session.tool", "session.approval"} <= set(registry.event_names())
    for method in METHODS:
        assert refusal(method, {"key": "main"}, scopes=[sc.PAIRING]) == "missing scope: operator.read"


# --- params -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "expected"),
    [
        ("chat.startup", {}, "sessionKey or shortId is required"),
        ("chat.startup", {"sessionKey": "main", "bogus": 1}, "at /bogus: unexpected property"),
        ("chat.startup", {"sessionKey": "main", "limit": 0}, "at /limit"),
        ("chat.startup", {"sessionKey": "main", "limit": 1001}, "at /limit"),
        ("chat.startup", {"sessionKey": "main", "maxBytes": 1000}, "at /maxBytes"),
        ("chat.startup", {"sessionKey": "main", "inputRunIds": []}, "at /inputRunIds"),
        ("chat.startup", {"sessionKey": "main", "inputRunIds": ["a", "a"]}, "inputRunIds must be unique"),
        ("chat.startup", {"sessionKey": "main", "slugHint": "x"}, "slugHint requires shortId"),
        ("chat.startup", {"shortId": "0123abcd"}, "a shortId startup requires agentId"),
        ("chat.startup", {"shortId": "0123abcd", "agentId": "main", "cursor": "c"}, "not cursor"),
        ("chat.startup", {"sessionKey": "", "limit": 5}, "at /sessionKey"),
        ("sessions.resolve", {"key": "main", "nope": True}, "at /nope: unexpected property"),
        ("sessions.resolve", {"reference": {"slug": "x"}}, "at /reference/key"),
        ("sessions.resolve", {"label": "x" * 513}, "at /label"),
        ("sessions.messages.subscribe", {}, "at /key"),
        ("sessions.messages.subscribe", {"key": "main", "includeApprovals": False}, "at /includeApprovals"),
        ("sessions.messages.subscribe", {"key": "main", "extra": 1}, "at /extra: unexpected property"),
        ("sessions.messages.unsubscribe", {"key": "main", "includeApprovals": True}, "unexpected property"),
    ],
)
def test_bad_params_are_refused_with_the_reason(method, params, expected):
    message = refusal(method, params)
    assert message.startswith(f"invalid {method} params: ")
    assert expected in message


@pytest.mark.django_db(transaction=True)
def test_selector_refusals_are_openclaws_words():
    assert refusal("sessions.resolve", {}) == "Either key, sessionId, label, shortId, or reference is required"
    assert (
        refusal("sessions.resolve", {"key": "main", "label": "x"})
        == "Provide either key, sessionId, label, shortId, or reference (not multiple)"
    )
    assert refusal("sessions.resolve", {"key": "main", "slugHint": "x"}) == "slugHint requires shortId"
    assert refusal("sessions.resolve", {"shortId": "xyz12345"}) == "shortId must be 8-32 hexadecimal characters"
    assert refusal("sessions.resolve", {"shortId": "abc"}) == "shortId must be 8-32 hexadecimal characters"
    assert refusal("sessions.resolve", {"label": "   "}) == "invalid label: empty"
    assert (
        refusal("sessions.resolve", {"key": "agent:main:nothing-here"}) == "No session found: agent:main:nothing-here"
    )
    assert refusal("sessions.resolve", {"key": "agent:Bad Agent:x"}) == "invalid agentId: bad agent"
    assert refusal("sessions.messages.subscribe", {"key": "agent::x"}) == "invalid session key: agent::x"
    assert (
        refusal("chat.startup", {"sessionKey": "agent:main:nothing-here"})
        == "session not found: agent:main:nothing-here"
    )
    assert Session.objects.count() == 0


# --- sessions.resolve ---------------------------------------------------------------------------------------


def test_resolve_by_key_session_id_and_label():
    work = make("agent:main:work", label="Work one")
    other = make("agent:ops:work")
    assert resolve(key="work") == {"ok": True, "key": work.key, "agentId": "main"}
    assert resolve(key="work", agentId="ops") == {"ok": True, "key": other.key, "agentId": "ops"}
    assert resolve(sessionId=work.session_id) == {"ok": True, "key": work.key, "agentId": "main"}
    assert resolve(label=" Work one ") == {"ok": True, "key": work.key, "agentId": "main"}
    assert resolve(key="missing", allowMissing=True) == {"ok": False}
    assert resolve(label="nobody", allowMissing=True) == {"ok": False}
    with pytest.raises(InvalidRequest, match=r"^No session found with label: nobody$"):
        resolve(label="nobody")
    with pytest.raises(InvalidRequest, match=r"^No session found: no-such-id$"):
        resolve(sessionId="no-such-id")


def test_a_label_two_sessions_carry_is_refused_naming_both():
    first = make("agent:main:a", label="twin")
    second = make("agent:main:b", label="twin")
    with pytest.raises(InvalidRequest) as refused:
        resolve(label="twin")
    assert refused.value.message.startswith("Multiple sessions found with label: twin (")
    assert first.key in refused.value.message and second.key in refused.value.message
    assert resolve(label="twin", agentId="ops", allowMissing=True) == {"ok": False}


def test_resolve_a_chat_links_short_id_and_narrow_by_slug():
    a = dashboard("Release notes", uid="abcdef12-0000-4000-8000-000000000001")
    b = dashboard("Bug triage", uid="abcdef12-0000-4000-8000-000000000002")
    solo = dashboard(uid="12345678-9abc-4def-8000-000000000003")
    assert resolve(shortId="123456789ABC", agentId="main") == {"ok": True, "key": solo.key, "agentId": "main"}
    ambiguous = resolve(shortId="abcdef12", agentId="main")
    assert ambiguous["ok"] is False
    assert {c["key"] for c in ambiguous["candidates"]} == {a.key, b.key}
    assert {c["displayName"] for c in ambiguous["candidates"]} == {"Release notes", "Bug triage"}
    assert control_ui_slug("Bug triage") == "bug-triage"
    assert resolve(shortId="abcdef12", slugHint="bug-triage", agentId="main") == {
        "ok": True,
        "key": b.key,
        "agentId": "main",
        "displayName": "Bug triage",
    }
    assert resolve(shortId="abcdef1200004000800000000000000", agentId="main")["ok"] is False  # both still
    assert resolve(shortId="ffffffff", agentId="main", allowMissing=True) == {"ok": False}
    assert resolve(shortId="12345678", agentId="ops", allowMissing=True) == {"ok": False}
    with pytest.raises(InvalidRequest, match=r"^No session found: ffffffff$"):
        resolve(shortId="FFFFFFFF", agentId="main")


def test_resolve_a_reference_by_key_then_by_slug():
    named = dashboard("Design review")
    assert resolve(reference={"key": named.key}) == {
        "ok": True,
        "key": named.key,
        "agentId": "main",
        "displayName": "Design review",
    }
    assert resolve(reference={"key": "agent:main:dashboard:gone", "slug": "design-review"})["key"] == named.key
    dashboard("Design review")
    assert len(resolve(reference={"key": "agent:main:dashboard:gone", "slug": "design-review"})["candidates"]) == 2
    with pytest.raises(InvalidRequest, match=r"^No session found: agent:main:dashboard:gone$"):
        resolve(reference={"key": "agent:main:dashboard:gone"})


# --- chat.startup -------------------------------------------------------------------------------------------


def test_startup_answers_the_page_the_session_and_the_defaults():
    session = make("agent:main:chat")
    first = append(session, "user", "hello")
    append(session, "assistant", "hi there", runId="r1")
    answer = page(sessionKey="chat", limit=80, maxBytes=262144)
    assert answer["sessionKey"] == "chat"
    assert answer["sessionId"] == session.session_id
    assert [(m["role"], m["content"][0]["text"]) for m in answer["messages"]] == [
        ("user", "hello"),
        ("assistant", "hi there"),
    ]
    assert answer["messages"][0]["__openclaw"] == {"id": first.event_id, "seq": 1}
    assert answer["pendingInputs"] == {"items": [], "total": 0}
    assert (answer["hasMore"], answer["totalMessages"]) == (False, 2)
    assert "nextOffset" not in answer and "kind" not in answer
    assert answer["defaults"]["mainSessionKey"] == "agent:main:main"
    assert answer["sessionInfo"]["key"] == session.key
    assert (answer["sessionInfo"]["hasActiveRun"], answer["sessionInfo"]["activeRunIds"]) == (False, [])
    assert "inFlightRun" not in answer
    json.dumps(answer)


def test_startup_pages_by_limit_offset_and_bytes():
    session = make("agent:main:long")
    for index in range(6):
        append(session, "user", f"m{index} " + "x" * 2000)
    texts = lambda answer: [m["content"][0]["text"][:2] for m in answer["messages"]]  # noqa: E731
    newest = page(sessionKey="long", limit=2)
    assert texts(newest) == ["m4", "m5"]
    assert (newest["hasMore"], newest["nextOffset"], newest["totalMessages"]) == (True, 2, 6)
    older = page(sessionKey="long", limit=2, offset=2)
    assert texts(older) == ["m2", "m3"] and older["offset"] == 2 and older["nextOffset"] == 4
    small = page(sessionKey="long", maxBytes=5000)
    assert texts(small) == ["m4", "m5"] and small["hasMore"] is True
    cut = page(sessionKey="long", limit=1, maxChars=10)
    assert cut["messages"][0]["content"][0]["text"] == "m5 xxxxxxx\n...(truncated)..."
    assert page(sessionKey="long", cursor="anything") == {"kind": "reset"}


def test_startup_refuses_contradicting_params_and_foreign_transcripts():
    session = make("agent:main:strict")
    event = append(session, "user", "one")
    other = make("agent:main:other")
    for params, message in (
        ({"offset": 1, "messageId": event.event_id}, "offset and messageId cannot be used together"),
        ({"cursor": "c", "offset": 1}, "cursor cannot be used with offset or messageId"),
        ({"sessionId": session.session_id}, "sessionId requires messageId"),
        ({"sessionId": other.session_id, "messageId": event.event_id}, "sessionId does not belong to sessionKey"),
    ):
        with pytest.raises(InvalidRequest) as refused:
            page(sessionKey="strict", **params)
        assert refused.value.message == message
    with pytest.raises(NotFound, match=r"^message not found: nope$"):
        page(sessionKey="strict", messageId="nope")
    around = page(sessionKey="strict", messageId=event.event_id, sessionId=session.session_id)
    assert [m["__openclaw"]["id"] for m in around["messages"]] == [event.event_id]


def test_startup_of_a_main_session_not_created_yet_is_an_empty_page():
    answer = page(sessionKey="main", agentId="ops", limit=80)
    assert answer["messages"] == [] and answer["totalMessages"] == 0 and answer["hasMore"] is False
    assert answer["sessionInfo"] == {"key": "agent:ops:main", "agentId": "ops", "kind": "direct", "hasActiveRun": False}
    assert not Session.objects.filter(key="agent:ops:main").exists()  # a read creates nothing
    with pytest.raises(NotFound, match=r"^session not found: agent:main:never$"):
        page(sessionKey="never")


def test_startup_shows_queued_input_receipts_and_the_running_turn():
    session = make("agent:main:busy")
    window = SessionWindow.objects.get(pk=session.session_id)
    asked = append(session, "user", "first")
    now = timezone.now()
    Run.objects.create(
        run_id="running-1", session=session, session_key=session.key, window=window, message="first",
        status=RunStatus.RUNNING, started_at=now, user_event_id=asked.event_id,
    )  # fmt: skip
    Run.objects.create(
        run_id="queued-1", session=session, session_key=session.key, window=window, message="second",
        status=RunStatus.QUEUED,
    )  # fmt: skip
    answer = page(sessionKey="busy", inputRunIds=["queued-1", "running-1", "unknown"])
    (item,) = answer["pendingInputs"]["items"]
    assert answer["pendingInputs"]["total"] == 1
    assert (item["id"], item["runId"], item["state"]) == ("queued-1", "queued-1", "queued")
    assert item["message"]["content"] == [{"type": "text", "text": "second"}]
    assert item["message"]["__openclaw"] == {"id": "pending:queued-1"}
    assert answer["inputReceipts"] == [
        {"runId": "queued-1", "state": "pending"},
        {"runId": "running-1", "state": "consumed", "consumedByEventId": asked.event_id},
    ]
    assert answer["inputConsumptions"] == [{"runId": "running-1", "consumedByEventId": asked.event_id}]
    assert answer["sessionInfo"]["hasActiveRun"] is True and answer["sessionInfo"]["status"] == "running"
    assert answer["sessionInfo"]["activeRunIds"] == ["running-1"]
    assert answer["inFlightRun"] == {
        "runId": "running-1",
        "text": "",
        "startedAt": int(now.timestamp() * 1000),
        "sessionAbortable": True,
    }


def test_startup_by_short_link_resolves_first():
    linked = dashboard("Linked", uid="0badc0de-0000-4000-8000-000000000001")
    append(linked, "user", "through the link")
    dashboard(uid="feedbeef-0000-4000-8000-000000000001")
    dashboard(uid="feedbeef-0000-4000-8000-000000000002")
    answer = page(shortId="0badc0de", agentId="main", limit=80, maxBytes=262144)
    assert answer["resolution"] == {"ok": True, "key": linked.key, "agentId": "main", "displayName": "Linked"}
    assert answer["sessionKey"] == linked.key and answer["messages"][0]["content"][0]["text"] == "through the link"
    ambiguous = page(shortId="feedbeef", agentId="main")
    assert set(ambiguous) == {"resolution"} and len(ambiguous["resolution"]["candidates"]) == 2
    assert page(shortId="00000000", agentId="main") == {"resolution": {"ok": False}}


# --- subscriptions and their events ------------------------------------------------------------------------


def test_subscriptions_are_per_connection_per_session_and_end_when_unsubscribed(monkeypatch):
    joined: list[tuple[str, str, str]] = []

    class Layer:
        async def group_add(self, group, channel):
            joined.append(("add", group, channel))

        async def group_discard(self, group, channel):
            joined.append(("discard", group, channel))

    monkeypatch.setattr("gateway.context.get_channel_layer", lambda: Layer())
    spec = registry.methods["sessions.messages.subscribe"]
    unsubscribe = registry.methods["sessions.messages.unsubscribe"]
    reader = operator_context([sc.READ])
    params = spec.params.model_validate({"key": "work"})
    assert asyncio.run(spec.handler(reader, params)) == {"subscribed": True, "key": "agent:main:work"}
    assert asyncio.run(spec.handler(reader, params)) == {"subscribed": True, "key": "agent:main:work"}
    assert reader.subscriptions == {messages_subscription("agent:main:work")}
    assert joined == [("add", subscription_group(messages_subscription("agent:main:work")), reader.channel_name)]
    done = unsubscribe.params.model_validate({"key": "agent:main:work"})
    assert asyncio.run(unsubscribe.handler(reader, done)) == {"subscribed": False, "key": "agent:main:work"}
    assert asyncio.run(unsubscribe.handler(reader, done)) == {"subscribed": False, "key": "agent:main:work"}
    assert reader.subscriptions == set() and [step[0] for step in joined] == ["add", "discard"]
    with pytest.raises(InvalidRequest) as refused:
        asyncio.run(spec.handler(reader, spec.params.model_validate({"key": "work", "includeApprovals": True})))
    assert refused.value.message == (
        "sessions.messages.subscribe includeApprovals requires a paired device and gateway scope: operator.approvals"
    )
    assert reader.subscriptions == set()


def test_a_connection_follows_a_bounded_number_of_sessions(monkeypatch):
    class Layer:
        async def group_add(self, group, channel):
            pass

    monkeypatch.setattr("gateway.context.get_channel_layer", lambda: Layer())
    monkeypatch.setattr("sessions_app.message_subscriptions.MAX_FOLLOWED_SESSIONS", 2)
    spec = registry.methods["sessions.messages.subscribe"]
    reader = operator_context([sc.READ])
    for key in ("one", "two", "two"):
        asyncio.run(spec.handler(reader, spec.params.model_validate({"key": key})))
    with pytest.raises(InvalidRequest) as refused:
        asyncio.run(spec.handler(reader, spec.params.model_validate({"key": "three"})))
    assert refused.value.message == "this connection already follows 2 sessions: unsubscribe from one first"
    assert len(reader.subscriptions) == 2


def test_an_event_of_one_session_reaches_only_holders_of_that_sessions_subscription():
    spec = registry.events["session.message"]
    mine, theirs = messages_subscription("agent:main:a"), messages_subscription("agent:main:b")
    assert mine != theirs and mine == keyed_subscription("session.messages", "agent:main:a")
    assert len(subscription_group(messages_subscription("agent:main:" + "x" * 290))) < 100
    seen = lambda held, scopes=(sc.READ,): event_visible(  # noqa: E731
        spec, role="operator", scopes=scopes, subscriptions=held, subscription=mine
    )
    assert seen({mine}) is True
    assert seen({theirs}) is False
    assert seen({"sessions"}) is False  # following the session list is not following its messages
    assert seen(set()) is False  # unsubscribed: what was already on its way is dropped
    assert seen({mine}, scopes=(sc.PAIRING,)) is False
    approval = registry.events["session.approval"]
    held = {session_approvals_subscription("agent:main:a")}
    assert event_visible(
        approval, role="operator", scopes=[sc.APPROVALS], subscriptions=held, subscription=next(iter(held))
    )
    assert not event_visible(
        approval, role="operator", scopes=[sc.READ], subscriptions=held, subscription=next(iter(held))
    )


def test_an_appended_message_is_published_to_its_session_after_commit(monkeypatch, django_capture_on_commit_callbacks):
    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(
        "sessions_app.message_subscriptions.publish_to_subscription_rollback_unsafe",
        lambda subscription, event, payload: sent.append((subscription, {"event": event, **payload})),
    )
    session = make("agent:main:live", label="Live")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        event = append(session, "assistant", "streamed", runId="run-9")
    assert sent == []  # nothing before the commit
    for callback in callbacks:
        callback()
    ((subscription, payload),) = [item for item in sent if item[1]["event"] == "session.message"]
    assert subscription == messages_subscription(session.key)
    assert payload["sessionKey"] == session.key and payload["agentId"] == "main"
    assert (payload["messageId"], payload["messageSeq"], payload["runId"]) == (event.event_id, 1, "run-9")
    assert payload["message"]["role"] == "assistant"
    assert payload["message"]["content"] == [{"type": "text", "text": "streamed"}]
    assert payload["message"]["__openclaw"] == {"id": event.event_id, "seq": 1}
    assert (payload["sessionId"], payload["label"]) == (session.session_id, "Live")


def test_a_session_approval_payload_is_openclaws_snapshot():
    now = timezone.now()
    approval = ExecApproval(
        id="ap 1",
        command="ls",
        host="gateway",
        session_key="agent:main:a",
        request={"command": "ls", "allowedDecisions": ["allow-once", "deny"]},
        requested_by="turn",
        created_at=now,
        expires_at=now,
    )
    payload = session_approval_payload(approval)
    assert payload["phase"] == "pending" and payload["sessionKey"] == "agent:main:a"
    assert payload["approval"]["status"] == "pending" and payload["approval"]["urlPath"] == "/approve/ap%201"
    assert payload["approval"]["presentation"]["commandText"] == "ls"


@pytest.mark.django_db(transaction=True)
def test_a_startup_by_link_follows_the_session_list_as_openclaws_does(monkeypatch):
    joined: list[str] = []

    class Layer:
        async def group_add(self, group, channel):
            joined.append(group)

    monkeypatch.setattr("gateway.context.get_channel_layer", lambda: Layer())
    spec = registry.methods["chat.startup"]
    reader = operator_context([sc.READ])
    by_key = spec.params.model_validate({"sessionKey": "main", "limit": 80})
    assert asyncio.run(spec.handler(reader, by_key))["messages"] == []
    assert reader.subscriptions == set()  # the key form subscribes to nothing
    by_link = spec.params.model_validate({"shortId": "0123abcd", "agentId": "main"})
    assert asyncio.run(spec.handler(reader, by_link)) == {"resolution": {"ok": False}}
    assert reader.subscriptions == {"sessions"} and joined == [subscription_group("sessions")]
