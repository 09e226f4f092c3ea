"""Port of seed 000 (OpenClaw's runtime-agent initialization integration test).

For every stage of the failure matrix in reference/sessions.md §3.6 a fault is injected at the real
boundary (a database trigger, a failing store write, a successor's write from another transaction,
the gateway's event publication) and the flow runs through the gateway methods ``sessions.fork`` /
``sessions.adopt`` (request frame in, response frame out, as the seed's ``callGatewayHandler``). The
exact end state is asserted: result and message, the cause of an incomplete rollback, child row,
binding, child link, transcript, native archives (count and guard), deletion-participant calls,
closed handles — and that nothing of the source changed. Adoption adopts the source's own thread,
already bound to the source session, as the seed does: it must never be archived.

``tests/e2e/test_fork.py`` runs the rows whose faults are database triggers against a real gateway.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest
from django.db import DatabaseError, connection, connections

from gateway import events as gateway_events
from gateway.exceptions import GatewayError
from native_harness import services
from native_harness.harness import harness
from native_harness.models import NativeThread
from sessions_app import stages
from sessions_app.harnesses import registry
from sessions_app.models import Session, TranscriptEvent
from sessions_app.services import initialization, links
from sessions_app.services.initialization import InitializationError, RollbackIncomplete

from . import rpc
from .faults import trigger
from .seed import SOURCE_KEY

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "harness"])

FORK_FAILURES = [
    "callback",
    "import",
    "before binding",
    "after binding",
    "final readiness",
    "readiness publication",
    "lost response",
    "successor binding",
    "successor link",
    "existing link",
    "source successor",
    "rollback commit",
    "native cleanup",
    "source successor during link write",
    "source successor during link cleanup",
    "source link successor",
    "registry rotation",
]
ADOPTION_FAILURES = ["callback", "before binding", "after binding", "final readiness", "rollback commit"]
POST_WRITE_FAILURES = {
    "after binding",
    "successor binding",
    "successor link",
    "rollback commit",
    "native cleanup",
    "source successor during link cleanup",
    "registry rotation",
}
INCOMPLETE = "guarded rollback did not complete"
INCOMPLETE_FOR = "Session initialization failed and guarded rollback did not complete for {key}."
# What the caller is told when the guarded rollback completed: the failure that started it.
FAILED_WITH = {
    "callback": "injected callback failure",
    "import": "injected import failure",
    "before binding": "injected binding write failure",
    "after binding": "injected post-write failure",
    "final readiness": "injected readiness failure",
    "lost response": "injected response loss after readiness",
    "successor link": "injected post-write failure",
    "existing link": "Native initialization link could not be persisted",
    "source successor": f"Session {SOURCE_KEY} changed during fork initialization",
    "source successor during link write": f"Session {SOURCE_KEY} changed during fork initialization",
    "source successor during link cleanup": "injected post-write failure",
    "source link successor": "Session upstream source changed during initialization",
}
# Rows whose rollback cannot complete: the rollback error behind the incomplete rollback.
ROLLBACK_FAILED_WITH = {
    "successor binding": (InitializationError, "Native initialization binding owner changed before rollback"),
    "rollback commit": (DatabaseError, "injected rollback failure"),
    "native cleanup": (InitializationError, "Native fork cleanup could not be verified"),
    "registry rotation": (InitializationError, "Session initialization registry owner changed"),
}


class Injected(Exception):
    pass


@dataclass
class Observed:
    handle: Any = None
    archives: list[tuple[str, Any]] = field(default_factory=list)
    deletions: list[str] = field(default_factory=list)
    retirements: int = 0
    successor_binding: dict | None = None
    successor_link: dict | None = None
    ready_at_publication: dict | None = None
    published_at_refusal: dict | None = None
    successor_started: bool = False


def replace_source() -> None:
    Session.objects.filter(key=SOURCE_KEY).update(
        session_id="source-successor", lifecycle_revision="successor-generation"
    )


def replace_source_from_another_connection(stack: contextlib.ExitStack) -> None:
    """A successor's write in its own transaction while the link write is still open.

    PostgreSQL commits it at once, before the link write's commit-stage check. SQLite has a single
    writer: the successor commits right after the link write, and the next guard check (before the
    binding write) sees it — the initialization waits there for the successor, or the readiness
    commit could take the write lock first and the successor would arrive too late.
    """

    def write() -> None:
        try:
            replace_source()
        finally:
            connections.close_all()

    worker = threading.Thread(target=write)
    worker.start()
    if connection.vendor == "postgresql":
        worker.join(10)
    else:
        stack.enter_context(stages.listening("initialization.binding.before_write", lambda **_: worker.join(30)))
    stack.callback(worker.join, 30)


@pytest.fixture
def observed(monkeypatch) -> Observed:
    seen = Observed()
    archive, prepare, retire = harness.archive_thread, harness.prepare_deletion, harness.retire_connection

    def spy_archive(thread_id, guard=None, **kwargs):
        seen.archives.append((thread_id, guard))
        return archive(thread_id, guard, **kwargs)

    def spy_prepare(target):
        seen.deletions.append(target.session_key)
        return prepare(target)

    def spy_retire():
        seen.retirements += 1
        return retire()

    monkeypatch.setattr(harness, "archive_thread", spy_archive)
    monkeypatch.setattr(harness, "prepare_deletion", spy_prepare)
    monkeypatch.setattr(harness, "retire_connection", spy_retire)
    yield seen
    registry.register(harness)  # the rotation row re-registers; leave a clean registration behind


def inject(flow: str, failure: str, seen: Observed, stack: contextlib.ExitStack) -> None:
    """Arm the fault of one row of the matrix."""

    def listen(stage, listener):
        stack.enter_context(stages.listening(stage, listener))

    def capture(handle, **_):
        seen.handle = handle

    listen("initialization.after_create", capture)
    if failure == "callback":
        listen("initialization.after_create", lambda **_: (_ for _ in ()).throw(Injected("injected callback failure")))
    elif failure == "import":
        stack.enter_context(trigger("reject_import"))
    elif failure == "before binding":
        stack.enter_context(trigger("reject_binding"))
    elif failure == "final readiness":
        stack.enter_context(trigger("reject_readiness"))
    elif failure == "readiness publication":
        # The gateway's real publication of a committed change (what publish_on_commit runs after
        # COMMIT) throws once, for the child's first change seen ready — as the seed's throwing
        # session-change observer.
        publish = gateway_events.publish_rollback_unsafe

        def refuse_publication(event, payload, **kwargs):
            target = seen.handle.target if seen.handle is not None else None
            if seen.ready_at_publication is None and target is not None and event == "sessions.changed":
                ready = initialization.row_snapshot(target.session_key)
                if (
                    payload.get("sessionKey") == target.session_key
                    and ready is not None
                    and ready["session_id"] == target.session_id
                    and not ready["initialization_pending"]
                ):
                    seen.ready_at_publication, seen.published_at_refusal = ready, payload
                    raise Injected("injected readiness publication failure")
            return publish(event, payload, **kwargs)

        stack.enter_context(mock.patch.object(gateway_events, "publish_rollback_unsafe", refuse_publication))
    elif failure == "lost response":
        listen("fork.created", lambda **_: (_ for _ in ()).throw(Injected("injected response loss after readiness")))
    elif failure == "existing link":

        def existing_link(key, agent_id, **_):
            link = {
                "sessionKey": key,
                "agentId": agent_id,
                "catalogId": "native",
                "hostId": "gateway:local",
                "threadId": "existing-successor",
                "upstreamKind": "native-threads",
                "upstreamRef": {"threadId": "existing-successor"},
                "marker": None,
            }
            assert links.link_upsert(link)
            seen.successor_link = links.link_read(key, agent_id)

        listen("initialization.after_create", existing_link)
    elif failure == "source successor during link write":

        def successor_during_link_write(link, **_):
            if link["sessionKey"] != SOURCE_KEY and not seen.successor_started:
                seen.successor_started = True
                replace_source_from_another_connection(stack)

        listen("link.write.before_commit", successor_during_link_write)
    elif failure == "source link successor":

        def replace_source_link(link, **_):
            current = links.link_read(SOURCE_KEY, "main")
            assert links.link_upsert({**current, "threadId": "source-link-successor"})

        listen("initialization.link.before_write", replace_source_link)
    elif failure == "source successor during link cleanup":
        listen("rollback.link.before_delete", lambda **_: replace_source())

    if failure == "rollback commit":
        stack.enter_context(trigger("reject_rollback_delete"))
    if failure == "native cleanup":
        stack.enter_context(trigger("reject_archive"))

    def after_binding(identity, binding, **_):
        if failure == "source successor":
            replace_source()
            return  # no fault: the source guard notices at the next check
        if failure == "successor binding":
            assert services.binding_patch(thread_id=binding["threadId"], patch={"model": "successor-model"}, **identity)
            seen.successor_binding = services.binding_read(identity["agent_id"], identity["session_id"])
        if failure == "successor link":
            key = seen.handle.target.session_key
            current = links.link_read(key, "main")
            assert links.link_upsert(
                {
                    **current,
                    "threadId": "successor-thread",
                    "marker": {"turnId": "successor-turn", "userMessageCount": 2},
                }
            )
            seen.successor_link = links.link_read(key, "main")
        if failure == "registry rotation":
            registry.register(harness)  # retired and re-activated: a new owner generation
        if failure in POST_WRITE_FAILURES:
            raise Injected("injected post-write failure")

    if failure in POST_WRITE_FAILURES or failure in {"source successor", "successor binding"}:
        listen("initialization.binding.after_write", after_binding)


def run_flow(flow: str, seeded) -> dict[str, Any]:
    """``sessions.fork`` of the source at its second user message, or ``sessions.adopt`` of the source's thread."""
    if flow == "fork":
        response = rpc.call("sessions.fork", {"sessionKey": SOURCE_KEY, "entryId": seeded.entry_id})
    else:
        response = rpc.call("sessions.adopt", {"threadId": seeded.source_thread_id})
    if response["ok"]:
        return {"status": "created", "payload": response["payload"]}
    return {"status": "failed", "message": response["error"]["message"], "error": response["error"]}


def what_failed(result: dict[str, Any], raised: list[BaseException]) -> str:
    """The failure a row sees: the client's message for a domain refusal; for an unexpected failure
    (an injected exception or database error), whose text never reaches the client, the client's
    reference must match the log's, and the recorded cause chain says what failed."""
    error = result["error"]
    error_id = (error.get("details") or {}).get("errorId")
    if error_id is None or error["message"].startswith("Session initialization failed and guarded rollback"):
        return result["message"]
    assert error["message"].endswith(f"; reference {error_id}"), error
    chain, cause = [], raised[0] if raised else None
    while cause is not None:
        chain.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    return " | ".join(chain)


def details_without_reference(error: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in (error.get("details") or {}).items() if key != "errorId"}


def incomplete_rollback(flow: str, raised: list[BaseException]) -> RollbackIncomplete:
    """The incomplete rollback behind the method's error, kept as its cause (fork) or raised as is (adoption)."""
    assert len(raised) == 1, raised
    error = raised[0] if flow == "adoption" else raised[0].__cause__
    assert isinstance(error, RollbackIncomplete), repr(raised[0])
    return error


def source_state(seeded) -> dict[str, Any]:
    return {
        "binding": services.binding_read("main", seeded.source.session_id),
        "transcript": list(TranscriptEvent.objects.filter(window_id=seeded.source.session_id).order_by("seq").values()),
    }


@pytest.mark.parametrize(
    ("flow", "failure"),
    [("fork", f) for f in FORK_FAILURES] + [("adoption", f) for f in ADOPTION_FAILURES],
)
def test_preserves_exactly_the_committed_owner(seeded, observed, flow, failure):
    source_before = source_state(seeded)
    source_entry_before = initialization.row_snapshot(SOURCE_KEY)
    source_link_before = links.link_read(SOURCE_KEY, "main")
    assert source_before["binding"]["threadId"] == seeded.source_thread_id  # adoption adopts a bound thread
    with contextlib.ExitStack() as stack:
        inject(flow, failure, observed, stack)
        raised = stack.enter_context(rpc.raised_by("sessions.fork", "sessions.adopt"))
        result = run_flow(flow, seeded)

    handle = observed.handle
    assert handle is not None, result
    child_key, child_session_id = handle.target.session_key, handle.target.session_id
    child = Session.objects.filter(key=child_key).first()
    binding = services.binding_read("main", child_session_id)
    link = links.link_read(child_key, "main")
    fresh = [t.thread_id for t in NativeThread.objects.filter(source_thread_id=seeded.source_thread_id)]
    fresh_thread = fresh[0] if fresh else None
    archives_of_fresh = [guard for thread_id, guard in observed.archives if thread_id == fresh_thread]
    rollback_guard = handle.assert_rollback_current
    expected_thread = fresh_thread if flow == "fork" else seeded.source_thread_id
    # Only the fork's fresh thread may ever be archived: never the adopted one, nor any other.
    assert [thread_id for thread_id, _ in observed.archives if thread_id != fresh_thread] == []
    if flow == "adoption":
        assert fresh_thread is None and observed.archives == []
        assert NativeThread.objects.get(thread_id=expected_thread).archived_at is None

    # --- result -------------------------------------------------------------------------
    assert result["status"] == ("created" if failure == "readiness publication" else "failed"), result
    if result["status"] == "failed":
        error = result["error"]
        if flow == "fork":  # every upstream-fork failure (reference §3.5)
            assert (error["code"], details_without_reference(error)) == (
                "UNAVAILABLE",
                {"reason": "upstream-unavailable"},
            ), error
        elif failure in ROLLBACK_FAILED_WITH:
            assert error["code"] == "INVALID_REQUEST", error
        else:
            assert (error["code"], details_without_reference(error)) == (
                "UNAVAILABLE",
                {"reason": "initialization-failed"},
            ), error
    if failure in FAILED_WITH:
        assert FAILED_WITH[failure] in what_failed(result, raised), result
    if failure == "source link successor":
        assert result["message"] == "Session upstream source changed during initialization"
    if failure in ROLLBACK_FAILED_WITH:
        # The injected fault (and no other failure) is what left the rollback incomplete.
        assert result["message"] == INCOMPLETE_FOR.format(key=child_key)
        incomplete = incomplete_rollback(flow, raised)
        rollback_error_class, rollback_message = ROLLBACK_FAILED_WITH[failure]
        assert isinstance(incomplete.original, Injected), repr(incomplete.original)
        assert str(incomplete.original) == "injected post-write failure"
        assert isinstance(incomplete.rollback_error, rollback_error_class), repr(incomplete.rollback_error)
        assert rollback_message in str(incomplete.rollback_error)
        if failure == "native cleanup":
            assert isinstance(incomplete.rollback_error.__cause__, DatabaseError)
            assert "injected archive failure" in str(incomplete.rollback_error.__cause__)
    if failure == "readiness publication":
        # The publication ran after readiness committed, threw, and the child stayed created.
        assert observed.ready_at_publication is not None, "the readiness publication was never attempted"
        assert observed.ready_at_publication["session_id"] == child_session_id
        assert observed.ready_at_publication["initialization_pending"] is False
        assert observed.published_at_refusal["initializationPending"] is False
        assert result["payload"]["sessionKey"] == child_key

    # --- end state of the child -----------------------------------------------------------
    if failure in ("readiness publication", "lost response"):
        assert child is not None and not child.initialization_pending and child.session_id == child_session_id
        assert binding["threadId"] == fresh_thread
        assert link["threadId"] == fresh_thread
        assert archives_of_fresh == []
        assert observed.deletions == []
    elif failure in ("successor binding", "rollback commit", "registry rotation"):
        assert INCOMPLETE in result["message"]
        assert child is not None and child.initialization_pending
        if failure == "successor binding":
            assert binding == observed.successor_binding
        else:
            assert binding["threadId"] == expected_thread
        assert (link or {}).get("threadId") == (fresh_thread if flow == "fork" else None)
        assert archives_of_fresh == []
    else:
        assert child is None
        assert binding is None
        assert TranscriptEvent.objects.filter(window_id=child_session_id).count() == 0
        assert observed.deletions == [child_key]  # the deletion participant, exactly once
        assert link == observed.successor_link  # None, or the successor's / pre-existing link
        if failure == "successor link" or flow == "adoption":
            assert archives_of_fresh == []
        elif failure == "callback":
            assert archives_of_fresh == [None]  # the fork cleaned up itself, unguarded
        else:
            assert archives_of_fresh == [rollback_guard]
        if failure == "native cleanup":
            assert observed.retirements == 1
            assert INCOMPLETE in result["message"]
        elif flow == "fork" and failure not in ("successor link", "callback"):
            assert NativeThread.objects.get(thread_id=fresh_thread).archived_at is not None

    # --- the retained handle is closed ----------------------------------------------------
    for check in (handle.assert_current, handle.assert_rollback_current):
        with pytest.raises(GatewayError, match="closed"):
            check()

    # --- a later owner rollback of a ready, supervised child refuses and changes nothing --
    if failure == "lost response":
        snapshot = initialization.row_snapshot(child_key)
        with pytest.raises(GatewayError, match="owned by supervision"):
            initialization.rollback_harness_session(key=child_key, expected=snapshot)
        assert initialization.row_snapshot(child_key) == snapshot
        assert services.binding_read("main", child_session_id) == binding

    # --- the source is untouched (or is exactly its injected successor) --------------------
    assert source_state(seeded) == source_before
    source_entry = initialization.row_snapshot(SOURCE_KEY)
    if failure.startswith("source successor"):
        assert (source_entry["session_id"], source_entry["lifecycle_revision"]) == (
            "source-successor",
            "successor-generation",
        )
    else:
        assert source_entry == source_entry_before
    if failure == "source link successor":
        assert links.link_read(SOURCE_KEY, "main")["threadId"] == "source-link-successor"
    else:
        assert links.link_read(SOURCE_KEY, "main") == source_link_before
    assert seeded.source_thread_id not in [thread_id for thread_id, _ in observed.archives]
    assert NativeThread.objects.get(thread_id=seeded.source_thread_id).archived_at is None
