"""sessions.adopt and sessions.fork over real sockets, with the bundled native harness; and the rows
of seed 000's failure matrix whose faults are database triggers, against a real gateway process."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from native_harness import services
from native_harness.harness import CATALOG_ID, HOST_ID, UPSTREAM_KIND
from native_harness.models import NativeBinding, NativeConnection, NativeThread
from openclaw_client.client import GatewayError
from sessions_app.models import Session, SessionUpstreamLink, TranscriptEvent
from sessions_app.services import links
from tests.native_harness.faults import trigger
from tests.native_harness.seed import SOURCE_KEY, seed_source
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, databases=["default", "harness"])]


def test_adopt_then_fork_a_native_thread(gateway):
    thread = services.thread_create(
        [("user", "plan the trip"), ("assistant", "where to?"), ("user", "Lisbon"), ("assistant", "great")]
    )

    async def adopt():
        client = operator(gateway)
        await client.connect()
        adopted = await client.request("sessions.adopt", {"threadId": thread.thread_id, "key": "trip"})
        await client.close()
        return adopted

    adopted = asyncio.run(adopt())
    assert links.link_upsert(
        {
            "sessionKey": adopted["key"],
            "agentId": "main",
            "catalogId": CATALOG_ID,
            "hostId": HOST_ID,
            "threadId": thread.thread_id,
            "upstreamKind": UPSTREAM_KIND,
            "upstreamRef": {"connectionFingerprint": services.current_fingerprint(), "threadId": thread.thread_id},
            "marker": None,
        }
    )
    lisbon = TranscriptEvent.objects.get(window_id=adopted["sessionId"], body__content__0__text="Lisbon")

    async def fork():
        client = operator(gateway)
        await client.connect()
        await client.request("sessions.subscribe")
        forked = await client.request("sessions.fork", {"sessionKey": adopted["key"], "entryId": lisbon.event_id})
        changed = await client.next_event(
            "sessions.changed", predicate=lambda e: e["payload"]["reason"] == "fork", timeout=10
        )
        history = await client.request("chat.history", {"sessionKey": forked["sessionKey"]})
        with pytest.raises(GatewayError) as not_user:
            first_assistant = history["messages"][1]["__openclaw"]["id"]
            await client.request("sessions.fork", {"sessionKey": forked["sessionKey"], "entryId": first_assistant})
        with pytest.raises(GatewayError) as missing:
            await client.request("sessions.fork", {"sessionKey": "agent:main:nope", "entryId": "x"})
        await client.close()
        return forked, changed, history, not_user.value, missing.value

    forked, changed, history, not_user, missing = asyncio.run(fork())
    assert adopted["entry"]["initializationPending"] is False
    assert forked["editorText"] == "Lisbon"
    assert changed["payload"]["sessionKey"] == forked["sessionKey"]
    assert [m["content"][0]["text"] for m in history["messages"]] == ["plan the trip", "where to?"]
    child = Session.objects.get(key=forked["sessionKey"])
    assert child.agent_harness_id == "native" and child.model_selection_locked
    assert links.link_read(child.key, "main")["threadId"] != thread.thread_id
    assert not_user.message.startswith("entry is not a user message:")
    assert (missing.code, missing.message) == ("INVALID_REQUEST", "session not found: agent:main:nope")


# --- seed 000 over the wire ------------------------------------------------------------------------
# (flow, triggers armed in the gateway's databases, expected end state). Rows of reference §3.6 whose
# faults are database triggers; "rollback commit" and "native cleanup" need a failure after the
# binding, here the readiness UPDATE refused by its trigger.
INCOMPLETE = "Session initialization failed and guarded rollback did not complete for {key}."
WIRE_ROWS = {
    "fork-import": ("fork", ["reject_import"], "deleted"),
    "fork-before binding": ("fork", ["reject_binding"], "deleted"),
    "fork-final readiness": ("fork", ["reject_readiness"], "deleted"),
    "fork-rollback commit": ("fork", ["reject_readiness", "reject_rollback_delete"], "pending"),
    "fork-native cleanup": ("fork", ["reject_readiness", "reject_archive"], "cleanup failed"),
    "adoption-before binding": ("adoption", ["reject_binding"], "deleted"),
    "adoption-final readiness": ("adoption", ["reject_readiness"], "deleted"),
    "adoption-rollback commit": ("adoption", ["reject_readiness", "reject_rollback_delete"], "pending"),
}
INJECTED = {
    "reject_import": "injected import failure",
    "reject_binding": "injected binding write failure",
    "reject_readiness": "injected readiness failure",
}


@pytest.mark.parametrize("row", list(WIRE_ROWS))
def test_a_failed_initialization_through_the_gateway_keeps_exactly_the_committed_owner(gateway, row):
    flow, faults, outcome = WIRE_ROWS[row]
    seeded = seed_source()
    source_binding = services.binding_read("main", seeded.source.session_id)
    source_entry = Session.objects.filter(key=SOURCE_KEY).values().get()

    async def call():
        client = operator(gateway)
        await client.connect()
        try:
            if flow == "fork":
                await client.request("sessions.fork", {"sessionKey": SOURCE_KEY, "entryId": seeded.entry_id})
            else:
                await client.request("sessions.adopt", {"threadId": seeded.source_thread_id})
        finally:
            await client.close()

    with contextlib.ExitStack() as stack:
        for name in faults:
            stack.enter_context(trigger(name))
        with pytest.raises(GatewayError) as failed:
            asyncio.run(call())

    children = list(Session.objects.exclude(key=SOURCE_KEY))
    fresh = list(NativeThread.objects.filter(source_thread_id=seeded.source_thread_id))
    assert len(fresh) == (1 if flow == "fork" else 0)
    fresh_thread = fresh[0] if fresh else None
    child_bindings = list(NativeBinding.objects.exclude(session_id=seeded.source.session_id))
    child_links = [links.link_shape(link) for link in SessionUpstreamLink.objects.exclude(session_key=SOURCE_KEY)]
    error = failed.value
    if outcome == "pending":
        (child,) = children
        assert (error.code, error.message) == (
            "UNAVAILABLE" if flow == "fork" else "INVALID_REQUEST",
            INCOMPLETE.format(key=child.key),
        )
        assert child.initialization_pending
        (binding,) = child_bindings
        assert binding.session_id == child.session_id
        assert binding.binding["threadId"] == (fresh_thread.thread_id if flow == "fork" else seeded.source_thread_id)
        assert [link["threadId"] for link in child_links] == ([fresh_thread.thread_id] if flow == "fork" else [])
        if fresh_thread is not None:
            fresh_thread.refresh_from_db()
            assert fresh_thread.archived_at is None
    else:
        assert children == [] and child_bindings == [] and child_links == []
        if outcome == "cleanup failed":
            assert error.message.startswith("Session initialization failed and guarded rollback did not complete")
            fresh_thread.refresh_from_db()
            assert fresh_thread.archived_at is None  # the archive was refused ...
            assert NativeConnection.objects.filter(retired_at__isnull=False).count() == 1  # ... so it was retired
        else:
            # A database error is not the client's to read: a reference, and the log has the cause.
            error_id = error.details["errorId"]
            assert error.message.endswith(f"; reference {error_id}"), error.shape
            assert INJECTED[faults[0]] not in error.message
            log = gateway.log()
            assert error_id in log and INJECTED[faults[0]] in log[log.index(error_id) :], error.shape
            if fresh_thread is not None:
                fresh_thread.refresh_from_db()
                assert fresh_thread.archived_at is not None
    # Nothing of the source changed; the adopted (source) thread is never archived.
    assert services.binding_read("main", seeded.source.session_id) == source_binding
    assert Session.objects.filter(key=SOURCE_KEY).values().get() == source_entry
    assert links.link_read(SOURCE_KEY, "main") == seeded.source_link
    assert NativeThread.objects.get(thread_id=seeded.source_thread_id).archived_at is None
