"""agent.wait's waiter: woken by the run-finished notification, answered from it when it carries the answer."""

from __future__ import annotations

import asyncio

import pytest

from openclaw_site.gateway import state
from sessions_app import waiters
from sessions_app.events import RUN_FINISHED
from sessions_app.services import runs, sessions

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


def _submit(run_id: str) -> None:
    session = sessions.session_create(spec=sessions.SessionSpec(key="agent:main:w", agent_id="main"))
    runs.run_submit(session_key=session.key, message="one", idempotency_key=run_id)


def _wait_then_notify(run_id: str, message: dict, timeout_ms: int = 10_000) -> dict:
    handler = state.process_message_handler(RUN_FINISHED)

    async def scenario() -> dict:
        waiting = asyncio.create_task(waiters.wait_for_run(run_id, timeout_ms))
        # Registered and past its first read (or failed: the await below raises it).
        for _ in range(1000):
            if waiting.done() or run_id in waiters.run_waiters._futures:
                break
            await asyncio.sleep(0.01)
        handler(message)
        return await asyncio.wait_for(waiting, 30)

    return asyncio.run(scenario())


def test_a_wake_up_carrying_the_answer_is_returned_without_reading_the_run():
    _submit("r1")
    answer = {"runId": "r1", "status": "ok", "outputText": "carried"}
    # The run is still queued in the database: the answer can only have come from the notification.
    assert _wait_then_notify("r1", {"type": RUN_FINISHED, "runId": "r1", "result": answer}) == answer


def test_a_bare_wake_up_reads_the_run_and_keeps_waiting_while_it_is_not_terminal():
    _submit("r1")
    waited = _wait_then_notify("r1", {"type": RUN_FINISHED, "runId": "r1"}, timeout_ms=300)
    assert waited == {"runId": "r1", "status": "timeout"}


def test_the_finish_notification_carries_what_agent_wait_reads_back():
    _submit("r1")
    runs.run_claim(run_id="r1", executor="test")
    finished = runs.run_finish(run_id="r1", outcome=runs.TurnOutcome(status="ok", text="ONE"))
    bare = _wait_then_notify("r1", {"type": RUN_FINISHED, "runId": "r1"})
    assert bare["outputText"] == "ONE"
    assert waiters.selectors.run_wait_payload(finished) == bare
