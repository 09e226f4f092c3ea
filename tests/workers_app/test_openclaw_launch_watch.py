"""The launch on OpenClaw's node host, watched as OpenClaw's gateway watches it (node-worker-dialect.md §1.6, §1.8):
``worker.launch.v1`` for a receipt, ``worker.status.v1`` until it is terminal (250 ms, backing off to 2 s), the
retryable transport codes asked again, a missed admission re-armed under a new launch id, and a cancel sent with
the launch's full identity until the receipt is terminal.

The node is a script of answers (the transport is not under test here); the clock is the test's, so nothing
waits for real time.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from gateway.invoke import NodeCommandFailed
from sessions_app.models import Run
from tests.workers_app.test_openclaw_launch_input import FACTS, built
from workers_app.nodes.openclaw import turns
from workers_app.nodes.openclaw.turns import (
    LaunchAbandoned,
    LaunchWatch,
    OpenClawNodeTurn,
    ReceiptInvalid,
    launch_identity,
)
from workers_app.nodes.turn_lookups import NodeRoute, NodeTurnPlace

NODE_ID = "e5" * 32
PARAMS = built(credential="c" * 40)
COMPLETED = json.dumps({"status": "completed", "transcriptLeafId": None, "transcriptNextSeq": 1})
MISSED = json.dumps({"status": "not-started", "reason": "admission-deadline", "errorText": "gateway unreachable"})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class Node:
    """Answers each command from a script: a receipt (its state, or a full dict), None, or a failure code;
    the last answer of a command repeats."""

    def __init__(self, clock: Clock, **scripts: list[Any]):
        self.clock = clock
        self.scripts = {command.replace("_", "."): list(answers) for command, answers in scripts.items()}
        self.calls: list[tuple[str, dict[str, Any], dict[str, Any], float]] = []
        self.on_call: Callable[[str], None] | None = None

    async def __call__(self, node_id: str, command: str, params: dict[str, Any], **options: Any) -> Any:
        assert node_id == NODE_ID
        self.calls.append((command, params, options, self.clock.now))
        if self.on_call is not None:
            self.on_call(command)
        key = command.removeprefix("worker.").removesuffix(".v1")
        answers = self.scripts[key]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, NodeCommandFailed):
            raise answer
        if answer is None or isinstance(answer, dict):
            return answer
        launch_id = params["launchId"]
        identity = {**self.identity_of(launch_id), "state": answer}
        if answer == "completed":
            identity["resultJson"] = COMPLETED
        elif answer == "missed":
            identity.update(state="completed", resultJson=MISSED)
        elif answer in ("failed", "interrupted", "cancelled"):
            identity["errorText"] = f"node worker turn {answer}"
        return identity

    def identity_of(self, launch_id: str) -> dict[str, Any]:
        params = PARAMS
        attempt = 1
        while params["launchId"] != launch_id:
            params = turns.rearmed(PARAMS, attempt)
            attempt += 1
            assert attempt < 10, "a launch id the gateway never sent"
        return launch_identity(params)

    def commands(self) -> list[str]:
        return [command for command, *_ in self.calls]


def failed(code: str) -> NodeCommandFailed:
    return NodeCommandFailed(code, f"{code} from the node")


def watch(node: Node, clock: Clock, cancel: Callable[[], bool] = lambda: False) -> LaunchWatch:
    return LaunchWatch(
        NODE_ID, PARAMS, cancel_requested=cancel, target=None, invoke=node, sleep=clock.sleep, clock=clock
    )


def run(launch: LaunchWatch) -> dict[str, Any]:
    return asyncio.run(launch.run())


def test_launched_then_polled_until_its_receipt_is_terminal():
    clock = Clock()
    node = Node(clock, launch=["pending"], status=["running", "running", "running", "running", "completed"])

    receipt = run(watch(node, clock))

    assert receipt["state"] == "completed" and receipt["resultJson"] == COMPLETED
    assert node.commands() == ["worker.launch.v1"] + ["worker.status.v1"] * 5
    _command, params, options, _at = node.calls[0]
    assert params is PARAMS and options["idempotency_key"] == PARAMS["launchId"]
    assert options["timeout_ms"] == 30_000
    assert all(call[1] == {"launchId": PARAMS["launchId"]} for call in node.calls[1:])
    gaps = [round(later[3] - earlier[3], 2) for earlier, later in zip(node.calls, node.calls[1:], strict=False)]
    assert gaps == [0.25, 0.5, 1.0, 2.0, 2.0]


def test_the_workers_end_wakes_the_poll():
    clock = Clock()
    node = Node(clock, launch=["running"], status=["running", "running", "running", "completed"])
    launch = watch(node, clock)
    node.on_call = lambda command: launch.wake() if len(node.calls) == 3 else None

    run(launch)

    gaps = [round(later[3] - earlier[3], 2) for earlier, later in zip(node.calls, node.calls[1:], strict=False)]
    # Woken during its second status poll: the next poll at once, then at the first pace again.
    assert gaps == [0.25, 0.5, 0.0, 0.25]


@pytest.mark.parametrize(
    ("receipt", "message"),
    [
        ({**launch_identity(PARAMS), "planHash": "b" * 64, "state": "running"}, "receipt identity mismatch"),
        (
            {**launch_identity(PARAMS), "ownerEpoch": FACTS.owner_epoch + 1, "state": "running"},
            "receipt identity mismatch",
        ),
        ({**launch_identity(PARAMS), "state": "running", "resultJson": COMPLETED}, "receipt contract"),
        ({**launch_identity(PARAMS), "state": "completed", "resultJson": "[]"}, "receipt contract"),
        ({**launch_identity(PARAMS), "state": "failed", "errorText": "two\nlines"}, "receipt contract"),
        ({**launch_identity(PARAMS), "state": "lost"}, "receipt contract"),
    ],
)
def test_a_receipt_of_another_launch_or_shape_is_refused(receipt, message):
    clock = Clock()
    node = Node(clock, launch=[receipt])

    with pytest.raises(ReceiptInvalid, match=message):
        run(watch(node, clock))


def test_a_node_that_forgot_the_launch_is_sent_it_again():
    clock = Clock()
    node = Node(clock, launch=["running", "running"], status=[None, "completed"])
    node.scripts["status"] = [None, "completed"]

    run(watch(node, clock))

    assert node.commands() == ["worker.launch.v1", "worker.status.v1", "worker.launch.v1", "worker.status.v1"]
    assert node.calls[2][1] is PARAMS  # the same launch id: the node answers it from its journal


def test_a_missed_admission_is_re_armed_under_a_new_launch_id_and_given_up_after_five_attempts():
    clock = Clock()
    node = Node(clock, launch=["missed"])

    receipt = run(watch(node, clock))

    launches = [call[1] for call in node.calls if call[0] == "worker.launch.v1"]
    assert len(launches) == 5
    first = PARAMS["launchId"]
    for attempt, params in enumerate(launches[1:], start=1):
        expected = hashlib.sha256(f"{first}:admission-rearm:{attempt}".encode()).hexdigest()
        assert params["launchId"] == params["descriptor"]["assignment"]["turnId"] == expected
        # Everything else is the first launch's.
        assert {**params, "launchId": first} == {**PARAMS} | {"descriptor": params["descriptor"]}
    assert [seconds for seconds in clock.slept if seconds >= 1] == [1.0, 2.0, 4.0, 8.0]
    assert turns.missed_admission(receipt) and receipt["launchId"] == launches[-1]["launchId"]


def test_a_re_armed_launch_that_runs_ends_normally():
    clock = Clock()
    node = Node(clock, launch=["missed", "running"], status=["completed"])

    receipt = run(watch(node, clock))

    assert receipt["state"] == "completed" and not turns.missed_admission(receipt)
    assert receipt["launchId"] == turns.rearmed(PARAMS, 1)["launchId"]


def test_capacity_and_refusals_end_the_launch_at_once():
    for code in ("WORKER_CAPACITY_EXHAUSTED", "INVALID_REQUEST", "UNSUPPORTED"):
        clock = Clock()
        node = Node(clock, launch=[failed(code)])
        with pytest.raises(NodeCommandFailed) as raised:
            run(watch(node, clock))
        assert raised.value.code == code and node.commands() == ["worker.launch.v1"]


def test_a_node_not_connected_at_launch_is_offline_at_once():
    clock = Clock()
    node = Node(clock, launch=[failed("NOT_CONNECTED")])

    with pytest.raises(NodeCommandFailed) as raised:
        run(watch(node, clock))

    assert raised.value.code == "NOT_CONNECTED" and len(node.calls) == 1


def test_a_launch_the_node_does_not_take_is_asked_again_within_its_availability_window():
    clock = Clock()
    node = Node(clock, launch=[failed("UNAVAILABLE"), failed("TIMEOUT"), "running"], status=["completed"])

    assert run(watch(node, clock))["state"] == "completed"

    clock = Clock()
    node = Node(clock, launch=[failed("UNAVAILABLE")])
    with pytest.raises(NodeCommandFailed) as raised:
        run(watch(node, clock))
    assert raised.value.code == "UNAVAILABLE" and 9.0 <= clock.now <= 12.0


def test_a_node_that_drops_mid_turn_is_polled_while_it_may_come_back():
    clock = Clock()
    lost = [failed("NOT_CONNECTED")] * 3
    node = Node(clock, launch=["running", *lost, "running"], status=[failed("NOT_CONNECTED"), "completed"])

    assert run(watch(node, clock))["state"] == "completed"
    # The status poll failed, then the launch was sent again until the node answered with its receipt.
    assert node.commands()[:6] == ["worker.launch.v1", "worker.status.v1"] + ["worker.launch.v1"] * 4
    assert all(call[2]["target"] is None for call in node.calls[1:])

    clock = Clock()
    node = Node(clock, launch=["running", failed("NOT_CONNECTED")], status=[failed("NOT_CONNECTED")])
    with pytest.raises(NodeCommandFailed) as raised:
        run(watch(node, clock))
    assert raised.value.code == "NOT_CONNECTED" and clock.now >= turns.RECONNECT_GRACE_S


def test_an_abort_cancels_with_the_full_identity_until_the_receipt_is_terminal():
    clock = Clock()
    cancelled = {"now": False}
    node = Node(
        clock,
        launch=["running"],
        status=["running"],
        cancel=["running", failed("TIMEOUT"), "running", "cancelled"],
    )
    node.on_call = lambda command: cancelled.update(now=True) if command == "worker.status.v1" else None

    receipt = run(watch(node, clock, cancel=lambda: cancelled["now"]))

    assert receipt["state"] == "cancelled"
    cancels = [call for call in node.calls if call[0] == "worker.cancel.v1"]
    assert len(cancels) == 4
    assert all(call[1] == launch_identity(PARAMS) for call in cancels)
    assert set(cancels[0][1]) == {
        "launchId",
        "planHash",
        "environmentId",
        "sessionId",
        "ownerEpoch",
        "placementGeneration",
        "runId",
    }


def test_a_cancel_that_never_settles_gives_up_after_its_deadline():
    clock = Clock()
    node = Node(clock, launch=["running"], cancel=["running"])

    with pytest.raises(NodeCommandFailed, match="did not produce a terminal receipt before its deadline"):
        run(watch(node, clock, cancel=lambda: len(node.calls) >= 1))

    assert turns.CANCEL_DEADLINE_S <= clock.now <= turns.CANCEL_DEADLINE_S + turns.POLL_MAX_S
    assert node.commands().count("worker.cancel.v1") > 10


def test_a_cancel_refused_by_the_node_ends_the_watch_with_that_refusal():
    clock = Clock()
    node = Node(clock, launch=["running"], cancel=[failed("INVALID_REQUEST")])

    with pytest.raises(NodeCommandFailed) as raised:
        run(watch(node, clock, cancel=lambda: len(node.calls) >= 1))

    assert raised.value.code == "INVALID_REQUEST"


def test_an_abort_before_the_node_took_the_launch_runs_nothing_there():
    clock = Clock()
    node = Node(clock, launch=[failed("UNAVAILABLE")])

    with pytest.raises(LaunchAbandoned):
        run(watch(node, clock, cancel=lambda: len(node.calls) >= 1))

    assert "worker.cancel.v1" not in node.commands()


# --- the turn's outcome from its terminal receipt ---------------------------------------------------


def turn_with(end_result: dict[str, Any] | None = None, *, cancelled: bool = False) -> OpenClawNodeTurn:
    run = Run(run_id="run-1", started_at=timezone.now())
    place = NodeTurnPlace(NODE_ID, FACTS.environment_id, "lease", FACTS.session_id, "a" * 64, route=None)
    turn = OpenClawNodeTurn(run, None, place, [], "echo-1", "echo", emitter=None)
    turn.end_result = end_result
    turn.text = "so far"
    if cancelled:
        turn.cancel.set()
    return turn


def receipt(state: str, **fields: Any) -> dict[str, Any]:
    return {**launch_identity(PARAMS), "state": state, **fields}


def test_a_completed_receipt_is_the_workers_end_or_an_error_without_it():
    ok = {"status": "ok", "text": "done", "stopReason": "stop"}

    assert turn_with(ok)._receipt_result(receipt("completed", resultJson=COMPLETED)) == ok
    assert turn_with()._receipt_result(receipt("completed", resultJson=COMPLETED)) == {
        "status": "error",
        "error": {"kind": "unknown", "message": turns.NO_OUTCOME},
    }
    assert turn_with(cancelled=True)._receipt_result(receipt("completed", resultJson=COMPLETED)) == {
        "status": "aborted",
        "text": "so far",
    }
    missed = turn_with()._receipt_result(receipt("completed", resultJson=MISSED))
    assert missed["error"] == {
        "kind": "worker-unreachable",
        "message": "device worker could not reach the gateway: gateway unreachable",
    }


def test_other_terminal_receipts_are_errors_with_their_text_or_an_abort():
    failed_receipt = receipt("failed", errorText="node worker failed with exit code 1: boom")
    interrupted = receipt("interrupted", errorText="node host restarted")

    assert turn_with()._receipt_result(failed_receipt)["error"]["message"] == (
        "device worker turn failed: node worker failed with exit code 1: boom"
    )
    assert turn_with()._receipt_result(interrupted)["error"]["message"] == (
        "device worker turn interrupted: node host restarted"
    )
    assert turn_with()._receipt_result(receipt("cancelled", errorText="node worker turn cancelled")) == {
        "status": "aborted",
        "text": "so far",
    }
    aborted = {"status": "aborted", "text": "partial"}
    assert turn_with(aborted, cancelled=True)._receipt_result(receipt("cancelled", errorText="x")) == {
        "status": "aborted",
        "text": "so far",
    }


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("WORKER_CAPACITY_EXHAUSTED", "WORKER_CAPACITY_EXHAUSTED"),
        ("PAIRING_CHANGED", "runner-offline"),
        ("ROUTE_CHANGED", "runner-offline"),
        ("PRIVATE_DIALECT_UNAVAILABLE", "runner-offline"),
        ("INVALID_REQUEST", "unknown"),
    ],
)
def test_node_failures_become_the_turns_outcome(code, kind):
    outcome = turn_with()._failed(NodeCommandFailed(code, "INVALID_REQUEST: invalid node worker launch request"))

    assert outcome.status == "error" and outcome.error_kind == kind
    if code == "WORKER_CAPACITY_EXHAUSTED":
        assert outcome.error == "device worker capacity remained full (WORKER_CAPACITY_EXHAUSTED)"


def test_only_a_node_without_the_projects_commands_is_asked_for_its_dialect(monkeypatch):
    asked: list[str] = []
    monkeypatch.setattr(turns, "node_speaks_openclaw", lambda node_id: asked.append(node_id) or True)
    project = NodeRoute("channel", "conn", ["system.run", "worker.launch.v1"], "process")
    openclaw = NodeRoute("channel", "conn", ["system.run"], "process")

    def place(route: NodeRoute | None) -> NodeTurnPlace:
        return NodeTurnPlace(NODE_ID, "env", "lease", "session", "a" * 64, route=route)

    assert turns.turn_speaks_openclaw(place(project)) is False
    assert turns.turn_speaks_openclaw(place(None)) is False
    assert asked == []
    assert turns.turn_speaks_openclaw(place(openclaw)) is True
    assert asked == [NODE_ID]
