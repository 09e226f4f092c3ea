"""Exec approvals over real sockets against a real gateway process: one operator asks and waits, another hears
of it and decides, the asker's answer comes with the decision (woken by the gateway's settled notification,
not its periodic re-read), and an operator without operator.approvals hears nothing."""

from __future__ import annotations

import asyncio
import time

import pytest

from approvals_app.models import ExecApproval
from openclaw_client.client import GatewayError
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_an_operator_decides_what_another_asked_and_the_asker_is_answered_at_once(gateway):
    async def scenario():
        asker = operator(gateway, scopes=["operator.approvals"])
        approver = operator(gateway, scopes=["operator.approvals"])
        reader = operator(gateway, scopes=["operator.read", "operator.write"])
        for client in (asker, approver, reader):
            await client.connect()
        asking = asyncio.create_task(
            asker.request(
                "exec.approval.request",
                {"command": "make deploy", "cwd": "/srv/app", "runId": "e2e-run", "toolCallId": "c1"},
                timeout=30,
            )
        )
        requested = await approver.next_event("exec.approval.requested", timeout=10)
        listed = await approver.request("exec.approval.list")
        decided_at = time.monotonic()
        resolved_answer = await approver.request(
            "exec.approval.resolve", {"id": requested["payload"]["id"], "decision": "allow-once"}
        )
        answer = await asyncio.wait_for(asking, 10)
        answered_after = time.monotonic() - decided_at
        resolved = await approver.next_event("exec.approval.resolved", timeout=10)
        with pytest.raises(GatewayError) as refused:
            await reader.request("exec.approval.resolve", {"id": requested["payload"]["id"], "decision": "deny"})
        await asyncio.sleep(0.3)  # anything the reader was (wrongly) sent has arrived by now
        reader_events = [frame["event"] for frame in reader.drain_events()]
        for client in (asker, approver, reader):
            await client.close()
        return requested, listed, resolved_answer, answer, answered_after, resolved, refused.value, reader_events

    requested, listed, resolved_answer, answer, answered_after, resolved, refused, reader_events = asyncio.run(
        scenario()
    )
    approval = ExecApproval.objects.get()
    assert requested["payload"]["id"] == approval.pk and requested["payload"]["request"]["command"] == "make deploy"
    assert [item["id"] for item in listed] == [approval.pk]
    assert resolved_answer == {"ok": True}
    assert answer == {
        "id": approval.pk,
        "decision": "allow-once",
        "createdAtMs": int(approval.created_at.timestamp() * 1000),
        "expiresAtMs": int(approval.expires_at.timestamp() * 1000),
    }
    # The settled notification woke the asker's wait (its periodic re-read is 5 s away).
    assert answered_after < 2.5
    assert resolved["payload"]["decision"] == "allow-once"
    assert (refused.code, refused.message) == ("INVALID_REQUEST", "missing scope: operator.approvals")
    assert not [event for event in reader_events if event.startswith("exec.approval")]
    assert approval.requested_by.startswith("device:") and approval.resolved_by.startswith("device:")
