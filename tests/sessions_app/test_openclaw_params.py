"""OpenClaw's params of the sessions and chat methods, with the effect they have here: sessions.list's filters, its
clamped limit, derived titles and last-message previews (sessions.describe too, and sessions.subscribe's list);
chat.history's offsets, byte budget, page around a message and input receipts; sessions.create's succession
checks; sessions.delete's archivedOnly; chat.abort's preserveSideRuns; chat.send's suppressCommandInterpretation;
and their failure paths (bad types, out-of-range numbers, params that exclude each other), which change nothing."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gateway import scopes as sc
from gateway.exceptions import Busy, InvalidRequest, NotFound
from sessions_app import history, titles
from sessions_app.models import Run, RunStatus, Session, SessionWindow
from sessions_app.schemas import SessionsCreateParams
from sessions_app.services import creation, runs, sessions, transcripts
from tests.e2e.test_openclaw_client_startup import PAGE_LOAD_CALLS
from tests.support.connections import dispatched, handled

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


def make(key: str, **fields) -> Session:
    return sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id=key.split(":")[1], **fields))


def finished_turn(session: Session, run_id: str, message: str, reply: str) -> Run:
    runs.run_submit(session_key=session.key, message=message, idempotency_key=run_id)
    runs.run_claim(run_id=run_id, executor="test")
    return runs.run_finish(run_id=run_id, outcome=runs.TurnOutcome(status=RunStatus.OK, text=reply))


def listed(params: dict, scopes=(sc.READ,)) -> dict:
    return handled("sessions.list", params, scopes=list(scopes))


def keys_of(payload: dict) -> list[str]:
    return [row["key"] for row in payload["sessions"]]


def refusal(method: str, params: dict, scopes=(sc.ADMIN,)) -> str:
    response = dispatched(method, params, scopes=list(scopes))
    assert response["ok"] is False, response
    assert response["error"]["code"] == "INVALID_REQUEST"
    return response["error"]["message"]


# --- sessions.list ------------------------------------------------------------------------------------------


def test_the_control_uis_and_tuis_list_params_are_answered():
    # A child of the main session, as the Control UI's second list (spawnedBy) asks for.
    make("agent:main:one", label="One", parent_session_key="agent:main:main")
    tui_picker = {
        "limit": 50,
        "activeMinutes": 10080,
        "includeGlobal": False,
        "includeUnknown": False,
        "includeDerivedTitles": True,
        "includeLastMessage": True,
        "agentId": "main",
    }
    calls = [params for method, params in PAGE_LOAD_CALLS if method == "sessions.list"] + [tui_picker]

    for params in calls:
        assert "agent:main:one" in keys_of(listed(params)), params


def test_a_limit_above_a_page_is_clamped_not_refused():
    make("agent:main:a")

    payload = listed({"limit": 10000, "spawnedBy": "agent:main:main", "configuredAgentsOnly": True})

    assert payload["limitApplied"] == 1000


@pytest.mark.parametrize(
    ("params", "where"),
    [
        ({"limit": 0}, "/limit"),
        ({"limit": "ten"}, "/limit"),
        ({"activeMinutes": 0}, "/activeMinutes"),
        ({"activeMinutes": 1.5}, "/activeMinutes"),
        ({"spawnedBy": ""}, "/spawnedBy"),
        ({"includeDerivedTitles": "maybe"}, "/includeDerivedTitles"),
        ({"sortBy": "name"}, "/sortBy"),
        ({"profileRelation": {"profileId": "p"}}, "/profileRelation/relationship"),
    ],
)
def test_bad_list_params_are_refused_by_name(params, where):
    assert refusal("sessions.list", params, scopes=(sc.READ,)).startswith(f"invalid sessions.list params: at {where}: ")


def test_active_minutes_keeps_the_sessions_updated_since():
    make("agent:main:old")
    make("agent:main:new")
    Session.objects.filter(key="agent:main:old").update(updated_at=timezone.now() - timedelta(minutes=90))

    assert keys_of(listed({"activeMinutes": 60})) == ["agent:main:new"]
    assert set(keys_of(listed({"activeMinutes": 120}))) == {"agent:main:old", "agent:main:new"}


def test_spawned_by_keeps_the_children_of_a_session():
    make("agent:main:parent")
    make("agent:main:child", parent_session_key="agent:main:parent")
    make("agent:main:other", parent_session_key="agent:main:main")

    assert keys_of(listed({"spawnedBy": "agent:main:parent"})) == ["agent:main:child"]
    assert keys_of(listed({"spawnedBy": "parent", "agentId": "main"})) == ["agent:main:child"]
    assert keys_of(listed({"spawnedBy": "agent:main:nobody"})) == []


def test_pinned_group_workspace_and_interaction_filter_as_openclaws():
    make("agent:main:plain")
    make("agent:main:filed", category="ops", cwd="/srv/work")
    sessions.session_patch(key="agent:main:filed", changes={"pinned": True})
    Session.objects.filter(key="agent:main:filed").update(last_interaction_at=timezone.now())

    assert keys_of(listed({"pinned": True})) == ["agent:main:filed"]
    assert "agent:main:filed" not in keys_of(listed({"pinned": False}))
    assert keys_of(listed({"group": "ops"})) == ["agent:main:filed"]
    # The working directory as rows show it (spawnedCwd: the last part outside the state directory); the host
    # path itself is not a reader's to probe.
    assert keys_of(listed({"workspaceDir": "work"})) == ["agent:main:filed"]
    assert keys_of(listed({"workspaceDir": "/srv/work"})) == []
    assert keys_of(listed({"workspaceDir": "../srv/work"})) == []
    assert keys_of(listed({"requireLastInteraction": True})) == ["agent:main:filed"]


def test_workspace_dir_under_the_state_directory_is_its_relative_path(settings, tmp_path):
    settings.STATE_DIR = str(tmp_path)
    inside = make("agent:main:inside", cwd=str(tmp_path / "worktrees" / "x"))

    assert handled("sessions.describe", {"key": inside.key}, scopes=[sc.READ])["session"]["spawnedCwd"] == "worktrees/x"
    assert keys_of(listed({"workspaceDir": "worktrees/x"})) == ["agent:main:inside"]
    assert keys_of(listed({"workspaceDir": "x"})) == []


@pytest.mark.parametrize(
    "params",
    [
        {"projectId": "p1"},
        {"creatorId": "u1"},
        {"ownerId": "u1"},
        {"involvingProfileId": "p1"},
        {"profileRelation": {"profileId": "p1", "relationship": "owned"}},
        {"boardFace": "dashboard"},
        {"hasBoard": True},
    ],
)
def test_a_filter_on_what_no_session_has_here_selects_nothing(params):
    make("agent:main:any")

    payload = listed(params)

    assert (payload["sessions"], payload["count"], payload["hasMore"]) == ([], 0, False)


def test_derived_titles_and_last_message_previews_per_row():
    labelled = make("agent:main:labelled", label="My label")
    named = make("agent:main:named", display_name="Shown name")
    plain = make("agent:main:plain")
    command = make("agent:main:command")
    finished_turn(labelled, "r1", "anything", "answer one")
    finished_turn(plain, "r2", "hello there. please fix the login page before friday! thanks", "Sure.")
    finished_turn(command, "r3", "/status", "status text")

    rows = {row["key"]: row for row in listed({"includeDerivedTitles": True, "includeLastMessage": True})["sessions"]}

    assert rows["agent:main:labelled"]["derivedTitle"] == "My label"
    assert rows["agent:main:named"]["derivedTitle"] == "Shown name"
    assert rows["agent:main:plain"]["derivedTitle"] == "Hello there. please fix the login page before friday! thanks"
    assert "derivedTitle" not in rows["agent:main:command"]  # a slash command is no title
    assert rows["agent:main:labelled"]["lastMessagePreview"] == "answer one"
    assert rows["agent:main:plain"]["lastMessagePreview"] == "Sure."
    assert "lastMessagePreview" not in rows[named.key]  # no message yet
    without = {row["key"]: row for row in listed({})["sessions"]}
    assert not {"derivedTitle", "lastMessagePreview"} & set(without["agent:main:plain"])


def append_message(session: Session, body: dict) -> None:
    window = SessionWindow.objects.get(pk=session.session_id)
    transcripts.transcript_append(session=session, window=window, type="message", body=body)


def test_a_preview_comes_from_the_newest_twenty_messages_only():
    tools = make("agent:main:tools")
    finished_turn(tools, "r1", "read the file", "Reading it.")
    # The newest assistant message calls a tool and says nothing: the preview is the one before.
    append_message(tools, {"role": "assistant", "content": [{"type": "toolCall", "id": "t", "name": "read"}]})
    quiet = make("agent:main:quiet")
    finished_turn(quiet, "r2", "long ago", "Long ago.")
    for index in range(titles.PREVIEW_SCAN):
        append_message(quiet, {"role": "toolResult", "content": [{"type": "text", "text": f"output {index}"}]})
    edge = make("agent:main:edge")
    finished_turn(edge, "r3", "at the edge", "Just in.")
    for index in range(titles.PREVIEW_SCAN - 1):
        append_message(edge, {"role": "toolResult", "content": [{"type": "text", "text": f"output {index}"}]})

    rows = {row["key"]: row for row in listed({"includeLastMessage": True})["sessions"]}

    assert rows[tools.key]["lastMessagePreview"] == "Reading it."
    assert "lastMessagePreview" not in rows[quiet.key]  # no user or assistant text among the newest 20
    assert rows[edge.key]["lastMessagePreview"] == "Just in."


def test_titles_and_previews_of_a_page_cost_the_same_queries_for_any_number_of_rows():
    def page_queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            listed({"includeDerivedTitles": True, "includeLastMessage": True})
        return len(captured.captured_queries)

    for index in range(3):
        finished_turn(make(f"agent:main:few-{index}"), f"few-{index}", f"plan step {index}", "ok")
    few = page_queries()
    for index in range(30):
        finished_turn(make(f"agent:main:many-{index}"), f"many-{index}", f"plan step {index}", "ok")

    assert page_queries() == few


def test_titles_and_previews_are_cut_as_openclaws():
    # A task verb picks its sentence; the title is cut at 60 UTF-16 units on a word boundary with "…".
    assert titles.title_from_message("hi!  Please   help. fix the flaky deploy script") == "Fix the flaky deploy script"
    long_task = "write " + "word " * 30
    title = titles.title_from_message(long_task)
    assert title.startswith("Write word") and title.endswith("…") and titles.utf16_length(title) <= 60
    assert titles.title_from_message("   ") is None
    assert titles.title_from_message("<environment_context> x") is None
    # The preview: the newest user or assistant text, 240 UTF-16 units at most (237 and "...").
    long_reply = {"role": "assistant", "content": [{"type": "text", "text": "x" * 500}]}
    tool_only = {"role": "assistant", "content": [{"type": "toolCall", "id": "t", "name": "read", "arguments": {}}]}
    tool_result = {"role": "toolResult", "content": [{"type": "text", "text": "output"}]}
    assert titles.preview_of([tool_result, tool_only, long_reply]) == "x" * 237 + "..."
    # Never half a surrogate pair.
    assert titles.utf16_prefix("ab\U0001f600c", 3) == "ab"


def test_describe_adds_the_same_row_fields():
    session = make("agent:main:described")
    finished_turn(session, "r1", "summarize the report", "Done.")

    row = handled(
        "sessions.describe",
        {"key": session.key, "includeDerivedTitles": True, "includeLastMessage": True},
        scopes=[sc.READ],
    )["session"]

    assert (row["derivedTitle"], row["lastMessagePreview"]) == ("Summarize the report", "Done.")
    assert handled("sessions.describe", {"key": "agent:main:none", "includeDerivedTitles": True}, scopes=[sc.READ]) == {
        "session": None
    }


@pytest.mark.django_db(transaction=True)
def test_subscribe_with_list_params_answers_the_list_too():
    make("agent:main:listed")

    bare = handled("sessions.subscribe", {}, scopes=[sc.READ])
    with_list = handled("sessions.subscribe", {"limit": 5, "includeDerivedTitles": True}, scopes=[sc.READ])

    assert bare == {"subscribed": True}
    assert with_list["subscribed"] is True and "agent:main:listed" in keys_of(with_list["list"])
    assert refusal("sessions.subscribe", {"limit": 0}, scopes=(sc.READ,)).startswith(
        "invalid sessions.subscribe params: at /limit: "
    )


# --- chat.history -------------------------------------------------------------------------------------------


def texts(payload: dict) -> list[str]:
    return [message["content"][0]["text"] for message in payload["messages"]]


@pytest.fixture
def talk() -> Session:
    session = make("agent:main:talk")
    for index in range(1, 6):
        finished_turn(session, f"r{index}", f"q{index}", f"a{index}")
    return session


def chat_history(params: dict) -> dict:
    return handled("chat.history", params, scopes=[sc.READ])


def test_the_history_of_a_main_session_not_created_yet_is_an_empty_page_and_of_another_unknown_key_refused():
    # The TUI reads the main session's history at connect, before any turn created it.
    assert chat_history({"sessionKey": "main", "agentId": "ops"}) == {
        "sessionKey": "main",
        "messages": [],
        "hasMore": False,
        "totalMessages": 0,
    }
    assert not Session.objects.filter(key="agent:ops:main").exists()
    with pytest.raises(NotFound, match=r"^session not found: agent:main:never$"):
        chat_history({"sessionKey": "never"})


def test_offset_pages_back_from_the_newest(talk):
    first = chat_history({"sessionKey": talk.key, "limit": 4})
    second = chat_history({"sessionKey": talk.key, "limit": 4, "offset": first["nextOffset"]})
    last = chat_history({"sessionKey": talk.key, "limit": 4, "offset": 8})

    assert texts(first) == ["q4", "a4", "q5", "a5"] and first["nextOffset"] == 4 and first["hasMore"] is True
    assert texts(second) == ["q2", "a2", "q3", "a3"] and second["offset"] == 4 and second["nextOffset"] == 8
    assert texts(last) == ["q1", "a1"] and last["hasMore"] is False and "nextOffset" not in last
    assert first["totalMessages"] == 10


def test_max_bytes_drops_the_oldest_and_the_next_page_goes_on_from_there(talk):
    whole = chat_history({"sessionKey": talk.key, "limit": 10})
    budget = history.json_bytes(whole["messages"][-3:])

    capped = chat_history({"sessionKey": talk.key, "limit": 10, "maxBytes": max(budget, 1024)})

    assert texts(capped) == texts(whole)[-len(capped["messages"]) :]
    assert history.json_bytes(capped["messages"]) <= max(budget, 1024) or len(capped["messages"]) == 1
    assert capped["nextOffset"] == len(capped["messages"])


def test_a_byte_budget_keeps_the_newest_message_whatever_its_size():
    assert history.cap_by_bytes([{"t": "a" * 10}, {"t": "b" * 5000}], 1024) == [{"t": "b" * 5000}]


def test_max_chars_cuts_each_text(talk):
    finished_turn(talk, "r6", "y" * 50, "z")

    payload = chat_history({"sessionKey": talk.key, "limit": 2, "maxChars": 10})

    assert payload["messages"][0]["content"][0]["text"] == "y" * 10 + "\n...(truncated)..."


def test_a_page_around_a_message_and_an_earlier_window(talk):
    middle = chat_history({"sessionKey": talk.key, "limit": 10})["messages"][4]  # q3
    around = chat_history({"sessionKey": talk.key, "limit": 3, "messageId": middle["__openclaw"]["id"]})
    old_window = talk.session_id
    sessions.session_reset(key=talk.key)
    earlier = chat_history(
        {"sessionKey": talk.key, "limit": 2, "messageId": middle["__openclaw"]["id"], "sessionId": old_window}
    )
    unknown = chat_history({"sessionKey": talk.key, "messageId": "no-such-message"})

    assert texts(around) == ["a2", "q3", "a3"]
    assert texts(earlier)[-1] in ("q3", "a3") and "q3" in texts(earlier) and earlier["sessionId"] == old_window
    assert unknown["messages"] == []


def test_input_run_ids_report_each_turns_receipt(talk):
    runs.run_submit(session_key=talk.key, message="queued one", idempotency_key="waiting")

    payload = chat_history({"sessionKey": talk.key, "limit": 2, "inputRunIds": ["r5", "waiting", "unknown"]})

    consumed = Run.objects.get(run_id="r5").user_event_id
    assert payload["inputReceipts"] == [
        {"runId": "r5", "state": "consumed", "consumedByEventId": consumed},
        {"runId": "waiting", "state": "pending"},
    ]
    assert payload["inputConsumptions"] == [{"runId": "r5", "consumedByEventId": consumed}]


def test_a_delta_cursor_asks_for_a_reload(talk):
    assert chat_history({"sessionKey": talk.key, "cursor": "anything"}) == {"kind": "reset"}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"offset": 1, "messageId": "m"}, "offset and messageId cannot be used together"),
        ({"cursor": "c", "offset": 1}, "cursor cannot be used with offset or messageId"),
        ({"sessionId": "s"}, "sessionId requires messageId"),
        ({"inputRunIds": ["a", "a"]}, "inputRunIds must be unique"),
        ({"inputRunIds": []}, "/inputRunIds"),
        ({"inputRunIds": [f"r{i}" for i in range(51)]}, "/inputRunIds"),
        ({"maxBytes": 1023}, "/maxBytes"),
        ({"limit": 1001}, "/limit"),
        ({"offset": -1}, "/offset"),
        ({"maxChars": 0}, "/maxChars"),
        ({"pendingBefore": "soon"}, "/pendingBefore"),
    ],
)
def test_bad_history_params_are_refused(params, message):
    assert message in refusal("chat.history", {"sessionKey": "agent:main:main", **params}, scopes=(sc.READ,))


def test_a_session_id_of_another_session_is_refused(talk):
    other = make("agent:main:other")

    with pytest.raises(InvalidRequest, match=re.escape("sessionId does not belong to sessionKey")):
        chat_history({"sessionKey": talk.key, "messageId": "m", "sessionId": other.session_id})


# --- sessions.create, sessions.delete, chat.abort, chat.send -------------------------------------------------------


def test_the_tuis_new_creates_the_successor_of_an_idle_parent():
    make("agent:main:parent")

    created = handled(
        "sessions.create",
        {
            "key": "tui-1",
            "agentId": "main",
            "parentSessionKey": "agent:main:parent",
            "succeedsParent": True,
            "emitCommandHooks": True,
        },
        scopes=[sc.WRITE],
    )

    assert created["key"] == "agent:main:tui-1"
    assert Session.objects.get(key="agent:main:tui-1").parent_session_key == "agent:main:parent"


def test_new_waits_for_a_parent_with_a_turn_under_way_and_creates_nothing():
    parent = make("agent:main:busy")
    runs.run_submit(session_key=parent.key, message="working", idempotency_key="busy-1")
    request = SessionsCreateParams(key="tui-2", parentSessionKey=parent.key, succeedsParent=True, emitCommandHooks=True)

    with pytest.raises(Busy, match=re.escape("Parent session agent:main:busy is still active; try again in a moment.")):
        creation.session_create_requested(request=request)

    assert not Session.objects.filter(key="agent:main:tui-2").exists()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"succeedsParent": True, "emitCommandHooks": True}, "succeedsParent requires parentSessionKey"),
        ({"succeedsParent": True, "parentSessionKey": "agent:main:main"}, "succeedsParent requires emitCommandHooks"),
        (
            {"succeedsParent": True, "parentSessionKey": "p", "emitCommandHooks": True, "fork": True},
            "succeedsParent conflicts with fork: a fork runs in parallel to its parent",
        ),
        ({"emitCommandHooks": "maybe"}, "/emitCommandHooks"),
        ({"spawnDepth": 0}, "/spawnDepth"),
        ({"visibility": "public"}, "/visibility"),
        ({"attachments": [{"type": "image"}]}, "attachments are not taken by this gateway"),
    ],
)
def test_bad_create_params_are_refused_and_nothing_is_created(params, message):
    before = Session.objects.count()

    assert message in refusal("sessions.create", {"key": "agent:main:refused", **params}, scopes=(sc.WRITE,))
    assert Session.objects.count() == before


def test_archived_only_deletes_an_archived_session_only():
    kept = make("agent:main:kept")
    shelved = make("agent:main:shelved")
    sessions.session_patch(key=shelved.key, changes={"archived": True})

    with pytest.raises(InvalidRequest, match=re.escape("Session agent:main:kept is not archived. Archive it first")):
        handled("sessions.delete", {"key": kept.key, "archivedOnly": True}, scopes=[sc.WRITE])
    deleted = handled("sessions.delete", {"key": shelved.key, "archivedOnly": True}, scopes=[sc.WRITE])

    assert deleted["deleted"] is True
    assert set(Session.objects.values_list("key", flat=True)) >= {"agent:main:kept"}
    assert not Session.objects.filter(key=shelved.key).exists()


def test_an_ordinary_patch_needs_only_operator_write():
    session = make("agent:main:renamed")

    patched = handled("sessions.patch", {"key": session.key, "label": "New", "pinned": True}, scopes=[sc.WRITE])

    assert (patched["entry"]["label"], patched["entry"]["pinned"]) == ("New", True)


def test_a_patch_of_openclaw_only_fields_changes_nothing_here():
    session = make("agent:main:settings", label="kept")

    patched = handled(
        "sessions.patch", {"key": session.key, "thinkingLevel": "high", "unread": True}, scopes=[sc.ADMIN]
    )

    stored = Session.objects.get(key=session.key)
    assert (stored.label, patched["entry"]["label"]) == ("kept", "kept")


def test_abort_with_preserve_side_runs_stops_every_turn_here():
    session = make("agent:main:abort")
    runs.run_submit(session_key=session.key, message="long", idempotency_key="a1")

    stopped = handled("chat.abort", {"sessionKey": session.key, "preserveSideRuns": True}, scopes=[sc.WRITE])

    assert stopped == {"ok": True, "aborted": True, "runIds": ["a1"]}
    assert Run.objects.get(run_id="a1").status == RunStatus.ABORTED
    assert "/preserveSideRuns" in refusal("chat.abort", {"sessionKey": session.key, "preserveSideRuns": "maybe"})


def test_suppress_command_interpretation_sends_a_slash_command_to_the_model():
    session = make("agent:main:literal")

    sent = handled(
        "chat.send",
        {
            "sessionKey": session.key,
            "message": "/status",
            "idempotencyKey": "lit-1",
            "suppressCommandInterpretation": True,
        },
        scopes=[sc.WRITE],
    )

    assert sent == {"runId": "lit-1", "status": "started"}
    assert Run.objects.get(run_id="lit-1").status == RunStatus.QUEUED


def test_a_message_with_attachments_is_refused_and_nothing_is_sent():
    message = refusal(
        "chat.send",
        {"sessionKey": "agent:main:main", "message": "see", "idempotencyKey": "att-1", "attachments": [{"type": "x"}]},
        scopes=(sc.WRITE,),
    )

    assert "attachments are not taken by this gateway; send the message as text" in message
    assert not Run.objects.filter(run_id="att-1").exists()


@pytest.mark.parametrize(
    ("reference", "stored"),
    [
        ("openai/gpt-x", "gpt-x"),  # the TUI's picker: provider/model as models.list shows it
        ("OpenAI/gpt-x", "gpt-x"),
        ("gpt-x", "gpt-x"),
        ("meta-llama/Llama-3-8B", "meta-llama/Llama-3-8B"),  # a model id of its own with a slash
        ("openai/", "openai/"),
    ],
)
def test_a_patched_model_reference_of_the_configured_provider_stores_its_model_id(settings, reference, stored):
    settings.OPENCLAW_MODEL = {**settings.OPENCLAW_MODEL, "PROVIDER": "openai"}
    make("agent:main:picked")
    handled("sessions.patch", {"key": "agent:main:picked", "model": reference}, scopes=[sc.WRITE])

    assert Session.objects.get(key="agent:main:picked").model == stored
