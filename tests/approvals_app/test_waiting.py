"""Waiting for a decision: from synchronous code (a turn: the cache flag every 5 ms at first, then every
50 ms, the database at most every second, no connection held between reads) and on the event loop
(waitDecision: woken by the settled notification, a periodic re-read otherwise); both return on a decision,
at the expiry (expiring it), and the synchronous one when its caller stops. The decision is durable: a wait
that starts after it still gets it."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.utils import timezone

from approvals_app import waiters
from approvals_app.models import ExecApproval
from approvals_app.services import approvals, waiting
from gateway import state
from gateway.audit import Actor
from gateway.exceptions import NotFound

from .conftest import ask

pytestmark = pytest.mark.django_db(transaction=True)

OPERATOR = Actor(label="device:op")


def request(**overrides) -> ExecApproval:
    return approvals.exec_approval_request(**ask(**overrides))


def later(delay_s: float, work) -> threading.Thread:
    """``work()`` in another thread after ``delay_s`` (an operator answering meanwhile)."""

    def run() -> None:
        try:
            time.sleep(delay_s)
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.fixture
def reads(monkeypatch) -> list[float]:
    """When the synchronous waiter read the row."""
    seen: list[float] = []
    original = waiting.approval_get

    def counted(approval_id: str):
        seen.append(time.monotonic())
        return original(approval_id)

    monkeypatch.setattr(waiting, "approval_get", counted)
    return seen


@pytest.fixture
def releases(monkeypatch) -> list[int]:
    released: list[int] = []
    original = waiting.release_database_connections

    def counted() -> None:
        released.append(1)
        original()

    monkeypatch.setattr(waiting, "release_database_connections", counted)
    return released


# --- synchronous waits (a turn) ---------------------------------------------------------------------


def test_a_sync_wait_returns_soon_after_a_decision_through_the_cache_flag(published, reads, releases):
    approval = request()
    answer = later(
        0.3, lambda: approvals.exec_approval_resolve(approval_id=approval.pk, decision="deny", actor=OPERATOR)
    )
    started = time.monotonic()

    settled = waiting.exec_approval_wait(approval.pk, timeout_s=30, should_stop=lambda: False)

    took = time.monotonic() - started
    answer.join()
    assert (settled.status, settled.decision) == ("denied", "deny")
    # Woken by the flag (checked every few ms), not the once-a-second read: one read to start, one after it.
    assert 0.3 <= took < 0.9
    assert len(reads) == 2
    assert len(releases) == len(reads)


def test_a_sync_wait_reads_the_database_at_most_once_a_second(published, reads, releases):
    approval = request()
    waiting.exec_approval_wait(approval.pk, timeout_s=2.5, should_stop=lambda: False)
    assert 3 <= len(reads) <= 4
    assert all(b - a >= 0.95 for a, b in itertools.pairwise(reads))
    assert len(releases) == len(reads)


def test_a_sync_wait_expires_an_approval_at_its_expiry(published):
    approval = request(timeout_ms=400)
    started = time.monotonic()
    settled = waiting.exec_approval_wait(approval.pk, timeout_s=30, should_stop=lambda: False)
    assert (settled.status, settled.terminal_reason) == ("expired", "timeout")
    assert 0.35 <= time.monotonic() - started < 2.0
    assert ExecApproval.objects.get(pk=approval.pk).status == "expired"


def test_a_sync_wait_returns_the_pending_approval_when_its_caller_stops(published):
    approval = request()
    stop_at = time.monotonic() + 0.2
    settled = waiting.exec_approval_wait(approval.pk, timeout_s=30, should_stop=lambda: time.monotonic() >= stop_at)
    assert settled.status == "pending"
    assert time.monotonic() - stop_at < 0.5


def test_a_decision_nobody_waited_for_is_kept_for_the_next_wait(published):
    approval = request()
    approvals.exec_approval_resolve(approval_id=approval.pk, decision="allow-once", actor=OPERATOR)
    # The waiting turn's process went away meanwhile; a new waiter (or a retried step) reads it at once.
    started = time.monotonic()
    settled = waiting.exec_approval_wait(approval.pk, timeout_s=30, should_stop=lambda: False)
    assert settled.decision == "allow-once" and time.monotonic() - started < 0.2
    assert approvals.exec_approval_request(**ask()).decision == "allow-once"


def test_a_sync_wait_for_an_unknown_approval_is_refused():
    with pytest.raises(NotFound, match="unknown or expired approval id"):
        waiting.exec_approval_wait("nope", timeout_s=1, should_stop=lambda: False)


# --- waits on the event loop (exec.approval.waitDecision) --------------------------------------------


def test_an_event_loop_wait_is_woken_by_the_settled_notification(published, monkeypatch):
    monkeypatch.setattr(waiters, "RECHECK_S", 30.0)  # only the notification can wake it in time
    approval = request()
    notify = state.process_message_handler("approvals.settled")
    assert notify is not None

    async def scenario() -> tuple[ExecApproval | None, float]:
        wait = asyncio.create_task(waiters.wait_for_settled(approval.pk))
        await asyncio.sleep(0.1)
        assert waiters.approval_waiters.waiting(approval.pk) == 1
        await database_sync_to_async(approvals.exec_approval_resolve)(
            approval_id=approval.pk, decision="deny", actor=OPERATOR
        )
        started = time.monotonic()
        # What this process's listener does with the notification the decision published.
        [notification] = published.notifications()
        notify(notification)
        return await asyncio.wait_for(wait, 2), time.monotonic() - started

    settled, took = asyncio.run(scenario())
    assert settled.status == "denied" and took < 0.5
    assert waiters.approval_waiters.waiting(approval.pk) == 0


def test_an_event_loop_wait_without_a_notification_rereads_and_expires_at_the_expiry(published, monkeypatch):
    monkeypatch.setattr(waiters, "RECHECK_S", 0.1)
    decided = request()
    expiring = request(tool_call_id="call-2", timeout_ms=300)

    async def scenario():
        wait = asyncio.create_task(waiters.wait_for_settled(decided.pk))
        await asyncio.sleep(0.05)
        await database_sync_to_async(approvals.exec_approval_resolve)(
            approval_id=decided.pk, decision="allow-once", actor=OPERATOR
        )
        first = await asyncio.wait_for(wait, 2)
        second = await asyncio.wait_for(waiters.wait_for_settled(expiring.pk), 3)
        missing = await waiters.wait_for_settled("nope")
        return first, second, missing

    first, second, missing = asyncio.run(scenario())
    assert first.decision == "allow-once"
    assert (second.status, second.terminal_reason) == ("expired", "timeout")
    assert missing is None


def test_the_expiry_reached_while_pending_is_recorded_once_however_many_wait(published, monkeypatch):
    monkeypatch.setattr(waiters, "RECHECK_S", 0.05)
    approval = request(timeout_ms=200)

    async def scenario():
        return await asyncio.gather(*(waiters.wait_for_settled(approval.pk) for _ in range(4)))

    results = asyncio.run(scenario())
    assert {r.status for r in results} == {"expired"}
    assert len(published.notifications()) == 1
    assert ExecApproval.objects.get(pk=approval.pk).resolved_at <= timezone.now() + timedelta(seconds=1)
