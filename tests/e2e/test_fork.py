"""sessions.adopt and sessions.fork over real sockets, with the bundled native harness."""

from __future__ import annotations

import asyncio

import pytest

from native_harness import services
from native_harness.harness import CATALOG_ID, HOST_ID, UPSTREAM_KIND
from openclaw_client.client import GatewayError
from sessions_app.models import Session, TranscriptEvent
from sessions_app.services import links
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
