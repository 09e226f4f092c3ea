"""Adoption, upstream and local forks: the happy paths and the checks before any work."""

from __future__ import annotations

import pytest

from gateway.audit import Actor
from gateway.exceptions import InvalidRequest, NotFound, Unavailable
from gateway.models import AuditLog
from native_harness import services
from native_harness.models import NativeThread
from sessions_app.models import Session, TranscriptEvent
from sessions_app.services import forks, initialization, links, sessions
from sessions_app.services.transcripts import append_many

from .conftest import SOURCE_KEY

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "harness"])


def texts(session_id: str) -> list[tuple[str, str]]:
    return [
        (e.body["role"], e.body["content"][0]["text"])
        for e in TranscriptEvent.objects.filter(window_id=session_id).order_by("seq")
    ]


def test_adoption_makes_a_locked_session_bound_to_the_existing_thread(seeded):
    source = seeded.source
    assert not source.initialization_pending and source.model_selection_locked
    assert source.agent_harness_id == "native"
    assert texts(source.session_id)[:2] == [("user", "first question"), ("assistant", "first answer")]
    binding = services.binding_read("main", source.session_id)
    assert binding["threadId"] == seeded.source_thread_id
    assert binding["connectionScope"] == "supervision"
    assert binding["pendingSupervisionBranch"]["sourceThreadId"] == seeded.source_thread_id
    # A thread another session is bound to may be adopted again (the reference adopts a source's own
    # thread): a second locked session with its own pending supervision branch; nothing native is created.
    threads_before = NativeThread.objects.count()
    again = forks.session_adopt(thread_id=seeded.source_thread_id, harness_id="native", agent_id="main", key=None)
    assert again.key != SOURCE_KEY and again.model_selection_locked and not again.initialization_pending
    second = services.binding_read("main", again.session_id)
    assert second["threadId"] == seeded.source_thread_id
    assert second["pendingSupervisionBranch"]["sourceThreadId"] == seeded.source_thread_id
    assert services.binding_read("main", source.session_id) == binding
    assert links.link_read(again.key, "main") is None
    assert NativeThread.objects.count() == threads_before
    with pytest.raises(InvalidRequest, match="native thread not found: thread-nope"):
        forks.session_adopt(thread_id="thread-nope", harness_id="native", agent_id="main", key=None)


def test_upstream_fork_creates_a_ready_child_on_a_fresh_thread(seeded):
    result = forks.session_fork(session_key=SOURCE_KEY, entry_id=seeded.entry_id)
    child = Session.objects.get(key=result["sessionKey"])
    assert result["editorText"] == "second question"
    assert not child.initialization_pending and child.fork_source_session_key == SOURCE_KEY
    assert texts(child.session_id) == [("user", "first question"), ("assistant", "first answer")]
    binding = services.binding_read("main", child.session_id)
    link = links.link_read(child.key, "main")
    fresh = binding["threadId"]
    assert fresh != seeded.source_thread_id and link["threadId"] == fresh
    assert NativeThread.objects.get(thread_id=fresh).source_thread_id == seeded.source_thread_id
    assert [t.text for t in services.thread_history(fresh)] == ["first question", "first answer"]
    # Nothing of the source changed.
    assert services.binding_read("main", seeded.source.session_id)["threadId"] == seeded.source_thread_id
    assert links.link_read(SOURCE_KEY, "main") == seeded.source_link


def test_a_fork_with_an_actor_is_audited_as_that_actor_local_or_upstream(seeded):
    sessions.session_create(spec=sessions.SessionSpec(key="agent:main:plain", agent_id="main"))
    plain = Session.objects.get(key="agent:main:plain")
    body = {"role": "user", "content": [{"type": "text", "text": "q"}], "timestamp": 1}
    append_many(window_id=plain.session_id, session_key=plain.key, bodies=[body])
    entry = TranscriptEvent.objects.get(window_id=plain.session_id).event_id
    actor = Actor(label="user:ops")

    local = forks.session_fork(session_key=plain.key, entry_id=entry, actor=actor)
    upstream = forks.session_fork(session_key=SOURCE_KEY, entry_id=seeded.entry_id, actor=actor)
    forks.session_fork(session_key=SOURCE_KEY, entry_id=seeded.entry_id)  # no actor (RPC): no row

    rows = AuditLog.objects.filter(action="session.fork").order_by("id")
    assert [(row.actor, row.target_id, row.data["sessionKey"], row.data["entryId"]) for row in rows] == [
        ("user:ops", plain.key, local["sessionKey"], entry),
        ("user:ops", SOURCE_KEY, upstream["sessionKey"], seeded.entry_id),
    ]


def test_local_fork_copies_the_active_path_before_the_entry(transactional_db):
    sessions.session_create(spec=sessions.SessionSpec(key="agent:main:plain", agent_id="main"))
    window = Session.objects.get(key="agent:main:plain").session_id

    bodies = [
        {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1}
        for role, text in [("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d")]
    ]
    append_many(window_id=window, session_key="agent:main:plain", bodies=bodies)
    events = list(TranscriptEvent.objects.filter(window_id=window).order_by("seq"))
    result = forks.session_fork(session_key="agent:main:plain", entry_id=events[2].event_id)
    child = Session.objects.get(key=result["sessionKey"])
    assert result["editorText"] == "c"
    assert texts(child.session_id) == [("user", "a"), ("assistant", "b")]
    assert child.fork_source_entry_id == events[2].event_id
    with pytest.raises(InvalidRequest, match=f"entry is not a user message: {events[1].event_id}"):
        forks.session_fork(session_key="agent:main:plain", entry_id=events[1].event_id)
    sessions.session_reset(key="agent:main:plain")  # the old generation leaves the active path
    for entry, message in (
        (events[2].event_id, f"message entry is not on the active path: {events[2].event_id}"),
        ("nope", "message entry not found: nope"),
    ):
        with pytest.raises(InvalidRequest, match=message):
            forks.session_fork(session_key="agent:main:plain", entry_id=entry)
    assert Session.objects.count() == 2  # the source and the one successful fork


def test_fork_checks_come_first_and_change_nothing(seeded):
    with pytest.raises(NotFound, match="session not found: agent:main:missing"):
        forks.session_fork(session_key="agent:main:missing", entry_id=seeded.entry_id)
    Session.objects.filter(key=SOURCE_KEY).update(initialization_pending=True)
    with pytest.raises(Unavailable, match=r"Session agent:main:source is initializing; retry fork later\."):
        forks.session_fork(session_key=SOURCE_KEY, entry_id=seeded.entry_id)
    assert Session.objects.count() == 1


def test_a_ready_child_with_a_supervision_binding_refuses_owner_rollback_outside_its_initialization(seeded):
    result = forks.session_fork(session_key=SOURCE_KEY, entry_id=seeded.entry_id)
    snapshot = initialization.row_snapshot(result["sessionKey"])
    with pytest.raises(InvalidRequest, match="owned by supervision"):
        initialization.rollback_harness_session(key=result["sessionKey"], expected=snapshot)
    assert initialization.row_snapshot(result["sessionKey"]) == snapshot


def test_sessions_delete_removes_a_harness_session_and_its_binding(seeded):
    result = forks.session_fork(session_key=SOURCE_KEY, entry_id=seeded.entry_id)
    child = Session.objects.get(key=result["sessionKey"])
    assert sessions.session_delete(key=child.key)
    assert not Session.objects.filter(key=child.key).exists()
    assert services.binding_read("main", child.session_id) is None
