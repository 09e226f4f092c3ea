"""agent.wait's waiter: answered from the run-finished notification, never ahead of its connection's events."""

from __future__ import annotations

import asyncio
import json

import pytest

from devices_app import events as device_events
from gateway import events as gateway_events
from gateway import state
from gateway.consumers import GatewayConsumer
from gateway.context import RpcContext
from sessions_app import events, waiters
from sessions_app.events import RUN_FINISHED
from sessions_app.services import runs, sessions

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "agent:main:w"


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


@pytest.fixture(autouse=True)
def _short_grace(monkeypatch):
    monkeypatch.setattr(waiters, "DELIVERY_GRACE_S", 0.4)


@pytest.fixture(autouse=True)
def _fresh_waiters(monkeypatch):
    # Channel names are unique per connection in a gateway; the tests reuse theirs.
    monkeypatch.setattr(waiters, "run_waiters", waiters.RunWaiters())


def _ctx(channel: str, *, subscribed: bool = False, scopes=("operator.write",)) -> RpcContext:
    ctx = RpcContext(
        conn_id=channel,
        channel_name=channel,
        role="operator",
        scopes=list(scopes),
        auth_method="token",
        client_id="test",
        client_mode="cli",
    )
    if subscribed:
        ctx.subscriptions.add("sessions")
    return ctx


def _submit(run_id: str, origin: str = "") -> None:
    if sessions.Session.objects.filter(key=KEY).first() is None:
        sessions.session_create(spec=sessions.SessionSpec(key=KEY, agent_id="main"))
    runs.run_submit(session_key=KEY, message="one", idempotency_key=run_id, origin_channel=origin)


def _finish(run_id: str, text: str = "ONE"):
    runs.run_claim(run_id=run_id, executor="test")
    return runs.run_finish(run_id=run_id, outcome=runs.TurnOutcome(status="ok", text=text))


async def _registered(task: asyncio.Task, run_id: str) -> None:
    """Until the wait is registered and past its first read (or failed: awaiting it raises that)."""
    for _ in range(1000):
        if task.done() or waiters.run_waiters._waiters.get(run_id):
            await asyncio.sleep(0.05)
            return
        await asyncio.sleep(0.01)


def _notify(run_id: str, result: dict | None, origin: str = "") -> None:
    message = {"type": RUN_FINISHED, "runId": run_id, "originChannel": origin}
    if result is not None:
        message["result"] = result
    state.process_message_handler(RUN_FINISHED)(message)


def _deliver(run_id: str, result: dict, channel: str) -> None:
    state.delivery_handler(RUN_FINISHED)({"type": RUN_FINISHED, "runId": run_id, "result": result}, channel)


def test_a_wait_without_a_connection_answers_from_the_notification_without_reading_the_run():
    _submit("r1")
    answer = {"runId": "r1", "status": "ok", "outputText": "carried"}

    async def scenario():
        waiting = asyncio.create_task(waiters.wait_for_run("r1", 10_000))
        await _registered(waiting, "r1")
        _notify("r1", answer)
        return await asyncio.wait_for(waiting, 5)

    # The run is still queued in the database: the answer can only have come from the notification.
    assert asyncio.run(scenario()) == answer


def test_a_bare_notification_reads_the_run_and_keeps_waiting_while_it_is_not_terminal():
    _submit("r1")

    async def scenario():
        waiting = asyncio.create_task(waiters.wait_for_run("r1", 300))
        await _registered(waiting, "r1")
        _notify("r1", None)
        return await asyncio.wait_for(waiting, 5)

    assert asyncio.run(scenario()) == {"runId": "r1", "status": "timeout"}


def test_the_notification_carries_what_agent_wait_reads_back():
    _submit("r1")
    finished = _finish("r1")
    carried = events.run_finished_notification(finished)["result"]

    read_back = asyncio.run(waiters.wait_for_run("r1", 1_000))
    assert carried == read_back
    assert read_back["status"] == "ok" and read_back["outputText"] == "ONE"


def test_a_queued_run_aborted_at_once_is_announced_as_stored(monkeypatch):
    _submit("r1")
    published = []
    original = events.run_finished_notification
    monkeypatch.setattr(
        events, "run_finished_notification", lambda run: published.append(original(run)) or published[-1]
    )
    runs.run_abort(session_key=KEY, run_id="r1")
    assert published, "the abort announced the run's end"
    assert published[-1]["result"] == asyncio.run(waiters.wait_for_run("r1", 1_000))
    assert published[-1]["result"]["error"] == "aborted"


@pytest.mark.parametrize("subscribed", [False, True])
def test_the_sending_or_subscribed_connection_answers_only_after_it_sent_the_terminal_event(subscribed):
    _submit("r1", origin="" if subscribed else "conn-a")
    answer = {"runId": "r1", "status": "ok", "outputText": "carried"}

    async def scenario():
        waiting = asyncio.create_task(waiters.wait_for_run("r1", 10_000, _ctx("conn-a", subscribed=subscribed)))
        await _registered(waiting, "r1")
        _notify("r1", answer, origin="conn-a" if not subscribed else "other")
        await asyncio.sleep(0.1)
        held_back = not waiting.done()
        _deliver("r1", {**answer, "via": "delivery"}, "other-connection")  # someone else's copy
        await asyncio.sleep(0.05)
        still_held = not waiting.done()
        _deliver("r1", {**answer, "via": "delivery"}, "conn-a")
        return held_back, still_held, await asyncio.wait_for(waiting, 5)

    held_back, still_held, waited = asyncio.run(scenario())
    assert held_back and still_held
    assert waited == {**answer, "via": "delivery"}


def test_a_connection_that_receives_no_events_of_the_run_answers_from_the_notification_at_once():
    _submit("r1", origin="conn-a")
    answer = {"runId": "r1", "status": "ok", "outputText": "carried"}

    async def scenario():
        # Neither the sender nor subscribed; nor may it see chat events at all.
        bystander = asyncio.create_task(waiters.wait_for_run("r1", 10_000, _ctx("conn-b")))
        unscoped = asyncio.create_task(
            waiters.wait_for_run("r1", 10_000, _ctx("conn-a", subscribed=True, scopes=("operator.approvals",)))
        )
        await _registered(bystander, "r1")
        _notify("r1", answer, origin="conn-a")
        return await asyncio.wait_for(asyncio.gather(bystander, unscoped), 0.3)

    assert asyncio.run(scenario()) == [answer, answer]


def test_a_lost_terminal_event_delays_the_answer_by_the_grace_period_only():
    _submit("r1", origin="conn-a")
    answer = {"runId": "r1", "status": "ok", "outputText": "carried"}

    async def scenario():
        loop = asyncio.get_running_loop()
        waiting = asyncio.create_task(waiters.wait_for_run("r1", 10_000, _ctx("conn-a")))
        await _registered(waiting, "r1")
        notified_at = loop.time()
        _notify("r1", answer, origin="conn-a")
        waited = await asyncio.wait_for(waiting, 5)
        return waited, loop.time() - notified_at

    waited, took = asyncio.run(scenario())
    assert waited == answer
    assert took >= 0.4


def test_a_run_that_just_ended_waits_for_its_event_unless_this_connection_already_sent_it():
    _submit("r1", origin="conn-a")
    _submit("r2", origin="conn-a")
    _finish("r1")
    _finish("r2")

    async def scenario():
        _deliver("r2", {"runId": "r2", "status": "ok"}, "conn-a")
        delivered_before = await asyncio.wait_for(waiters.wait_for_run("r2", 10_000, _ctx("conn-a")), 0.3)
        waiting = asyncio.create_task(waiters.wait_for_run("r1", 10_000, _ctx("conn-a")))
        await _registered(waiting, "r1")
        held_back = not waiting.done()
        _deliver("r1", {"runId": "r1", "status": "ok", "via": "delivery"}, "conn-a")
        return delivered_before, held_back, await asyncio.wait_for(waiting, 5)

    delivered_before, held_back, waited = asyncio.run(scenario())
    assert delivered_before["runId"] == "r2" and delivered_before["outputText"] == "ONE"
    assert held_back
    assert waited["via"] == "delivery"


def test_a_wait_times_out_and_leaves_no_waiter_behind():
    _submit("r1", origin="conn-a")
    assert asyncio.run(waiters.wait_for_run("r1", 200, _ctx("conn-a"))) == {"runId": "r1", "status": "timeout"}
    assert "r1" not in waiters.run_waiters._waiters


class _RecordingConsumer(GatewayConsumer):
    """The gateway's consumer with a transport that records frames and takes a while per frame."""

    def __init__(self, ctx: RpcContext, frames: list):
        super().__init__()
        self.ctx, self.phase, self.seq, self.conn_id = ctx, "open", 0, ctx.conn_id
        self.channel_name = ctx.channel_name
        self.frames = frames

    async def send(self, text_data=None, bytes_data=None, close=False):
        await asyncio.sleep(0.05)  # the transport (or the loop) is busy: the notification gets there first
        self.frames.append(("event", json.loads(text_data)["payload"]["state"]))


@pytest.mark.parametrize("subscribed", [False, True])
def test_through_the_consumer_the_answer_follows_the_terminal_event(subscribed):
    _submit("r1", origin="conn-a")
    finished = _finish("r1")
    notification = events.run_finished_notification(finished)
    final = gateway_events.broadcast_message(
        events.EVENT_CHAT, {"runId": "r1", "sessionKey": KEY, "seq": 2, "state": "final"}, follow_up=notification
    )
    delivered_copy = {**final, "direct": True} if not subscribed else final
    frames: list = []

    async def scenario():
        ctx = _ctx("conn-a", subscribed=subscribed)
        consumer = _RecordingConsumer(ctx, frames)
        waiting = asyncio.create_task(waiters.wait_for_run("r1", 10_000, ctx))
        waiting.add_done_callback(lambda task: frames.append(("answer", task.result()["status"])))
        # As the worker sends them: the event to the connection, then the process notification,
        # which the process handles while the connection is still sending the event.
        delivering = asyncio.create_task(consumer.gateway_event(delivered_copy))
        await asyncio.sleep(0)
        _notify("r1", notification["result"], origin="conn-a")
        await delivering
        await asyncio.wait_for(waiting, 5)

    asyncio.run(scenario())
    assert frames == [("event", "final"), ("answer", "ok")]


def test_a_copy_the_connection_drops_lets_no_answer_out():
    """A subscribed sender drops the direct copy (it gets the subscription's): that copy releases nothing."""
    ctx = _ctx("conn-a", subscribed=True)
    frames: list = []
    notification = {"type": RUN_FINISHED, "runId": "r1", "result": {"runId": "r1", "status": "ok"}}
    direct = {
        **gateway_events.broadcast_message(
            events.EVENT_CHAT, {"runId": "r1", "state": "final"}, follow_up=notification
        ),
        "direct": True,
    }
    asyncio.run(_RecordingConsumer(ctx, frames).gateway_event(direct))
    assert frames == []
    assert not waiters.run_waiters.was_delivered("conn-a", "r1")


def test_a_follow_up_rides_only_on_events_that_are_never_dropped():
    notification = {"type": RUN_FINISHED, "runId": "r1", "result": {}}
    with pytest.raises(ValueError):
        gateway_events.broadcast_message(events.EVENT_CHAT, {}, drop_if_slow=True, follow_up=notification)
    with pytest.raises(ValueError):
        gateway_events.broadcast_message(device_events.EVENT_DEVICE_PAIR_REQUESTED, {}, follow_up=notification)
