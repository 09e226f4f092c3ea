"""The routes the project's worker on OpenClaw's node host calls (docs/node-worker-protocol.md, OpenClaw's dialect),
and a whole turn through them: ``GET …/launch``, ``POST …/progress``, ``POST …/approval`` under
``/api/workers/turns/<runId>/``, each authorized by the run's inference token (the launch's credential) while the
run is running on the token's node.

Items and exec questions reach the turn's thread through the channel layer (Redis under the PostgreSQL + Redis
profile, the process's memory under the embedded one); a decision comes back to the asking request's channel.
The gateway's ASGI application serves the requests, on the loop the turn's launch runs on (the in-memory layer's
queues belong to one loop, as in the embedded gateway); the node is a script of receipts.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

from approvals_app.models import ExecApproval, ExecApprovalPolicy
from gateway import publisher
from gateway.invoke import InvokeTarget
from openclaw_site.asgi import application
from sessions_app.events import TurnEmitter
from sessions_app.models import RunStatus, Session, TranscriptEvent
from sessions_app.services import runs
from tests.support.processes import ROOT
from tests.workers_app.test_inference_proxy import ENVIRONMENT, NODE, OTHER_NODE, placed_session, running
from workers_app.models import WorkerEnvironment
from workers_app.nodes.openclaw import turns, worker_routes
from workers_app.nodes.openclaw.turns import OpenClawNodeTurn, launch_identity, turn_channel
from workers_app.nodes.turn_lookups import NodeTurnPlace
from workers_app.nodes.turn_tokens import inference_token

pytestmark = pytest.mark.django_db(transaction=True)

BUILD = {"bundleHash": "f" * 64, "openclawVersion": "2026.9.6-django+1", "protocolFeatures": []}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def request(method: str, path: str, token: str | None, body: Any = None, *, raw: bytes | None = None) -> Answer:
    headers = [(b"content-type", b"application/json")]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 18789),
    }
    incoming = [{"type": "http.request", "body": payload, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await asyncio.Event().wait()  # never hangs up
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await application(scope, receive, send)
    start = sent[0]
    return Answer(
        start["status"],
        {name.decode().lower(): value.decode() for name, value in start["headers"]},
        b"".join(message.get("body", b"") for message in sent[1:]),
    )


def call(method: str, path: str, token: str | None, body: Any = None, *, raw: bytes | None = None) -> Answer:
    """One request, on the loop the channel layer is used from elsewhere in the test (the publisher's)."""
    return publisher.submit(lambda: request(method, path, token, body, raw=raw)).result(60)


def route(run_id: str, action: str) -> str:
    return f"/api/workers/turns/{run_id}/{action}"


def receive_on(channel: str, timeout_s: float = 10.0) -> dict[str, Any]:
    return publisher.submit(lambda: asyncio.wait_for(get_channel_layer().receive(channel), timeout_s)).result(30)


def error_of(answer: Answer) -> dict[str, Any]:
    return answer.json()["error"]


# --- authorization and bounds ----------------------------------------------------------------------


def test_every_route_needs_the_runs_token_while_it_runs_on_that_node():
    session = placed_session()
    run = running(session)
    token = inference_token(run.run_id, NODE)

    missing = call("GET", route(run.run_id, "launch"), None)
    refused = call("GET", route(run.run_id, "launch"), "not-a-token")
    other_runs = call("GET", route(run.run_id, "launch"), inference_token("another-run", NODE))
    other_nodes = call("GET", route(run.run_id, "launch"), inference_token(run.run_id, OTHER_NODE))

    assert (missing.status, error_of(missing)["details"]["code"]) == (401, "AUTH_TOKEN_MISSING")
    assert (refused.status, error_of(refused)["details"]["code"]) == (401, "AUTH_TOKEN_MISMATCH")
    assert (other_runs.status, error_of(other_runs)["details"]["code"]) == (401, "AUTH_TOKEN_MISMATCH")
    assert other_nodes.status == 409 and error_of(other_nodes)["message"] == worker_routes.NOT_RUNNING
    assert call("GET", route(run.run_id, "launch"), token).status == 200

    runs.run_finish(run_id=run.run_id, outcome=runs.TurnOutcome(status=RunStatus.OK, text="done"))
    for action, body in (("launch", None), ("progress", {"items": [{"kind": "delta", "text": "x"}]})):
        ended = call("GET" if action == "launch" else "POST", route(run.run_id, action), token, body)
        assert ended.status == 409 and error_of(ended)["code"] == "INVALID_REQUEST"


def test_methods_paths_and_bodies_are_bounded():
    run = running(placed_session())
    token = inference_token(run.run_id, NODE)

    wrong_method = call("POST", route(run.run_id, "launch"), token, {})
    unknown = call("GET", route(run.run_id, "status"), token)
    too_big = call("POST", route(run.run_id, "progress"), token, raw=b"x" * (worker_routes.PROGRESS_MAX_BYTES + 1))
    not_json = call("POST", route(run.run_id, "progress"), token, raw=b"{nope")
    bad_items = [
        {"items": []},
        {"items": [{"kind": "delta", "text": "x"}] * 65},
        {"items": [{"kind": "shell", "cmd": "rm"}]},
        {"items": [{"kind": "end", "result": {"status": "ok", "text": ""}}, {"kind": "delta", "text": "x"}]},
        {"items": [{"kind": "message", "key": "../etc", "message": {"role": "assistant", "content": []}}]},
        {"items": [{"kind": "message", "key": "s1.a", "message": {"role": "user", "content": []}}]},
        {"items": [{"kind": "end", "result": {"status": "done"}}]},
        {"items": "all"},
    ]
    bad_questions = [
        {"toolCallId": "c1", "command": "ls", "workdir": "/w", "envKeys": [], "timeoutS": 5, "extra": 1},
        {"toolCallId": "", "command": "ls", "workdir": "/w", "envKeys": [], "timeoutS": 5},
        {"toolCallId": "c1", "command": "x" * 70_000, "workdir": "/w", "envKeys": [], "timeoutS": 5},
        {"toolCallId": "c1", "command": "ls", "workdir": "/w", "envKeys": ["K"] * 300, "timeoutS": 5},
        {"toolCallId": "c1", "command": "ls", "workdir": "/w", "envKeys": [], "timeoutS": True},
    ]

    assert wrong_method.status == 405 and wrong_method.headers["allow"] == "GET"
    assert unknown.status == 404
    assert too_big.status == 413
    assert not_json.status == 400
    for body in bad_items:
        answer = call("POST", route(run.run_id, "progress"), token, body)
        assert answer.status == 400, body
        assert error_of(answer)["message"].startswith("invalid request:")
    for body in bad_questions:
        assert call("POST", route(run.run_id, "approval"), token, body).status == 400, body


def test_the_launch_is_the_turns_context_and_bounds():
    session = placed_session()
    run = running(session, "Reply exactly: LAUNCH-MARKER")

    answer = call("GET", route(run.run_id, "launch"), inference_token(run.run_id, NODE))

    assert answer.status == 200 and answer.headers["cache-control"] == "no-store"
    launch = answer.json()
    assert launch["runId"] == run.run_id
    assert launch["messages"][-1] == {"role": "user", "content": "Reply exactly: LAUNCH-MARKER"}
    assert launch["inference"] == {"path": "/api/workers/inference/chat/completions"}
    assert launch["agent"] == {
        "maxSteps": settings.OPENCLAW_AGENT["MAX_STEPS"],
        "tools": True,
        "execTimeoutMs": int(settings.OPENCLAW_AGENT["EXEC_TIMEOUT_S"] * 1000),
    }
    assert launch["timeoutMs"] == int(settings.OPENCLAW_AGENT["TURN_TIMEOUT_S"] * 1000)
    assert isinstance(launch["model"], str) and launch["model"]


# --- delivery through the channel layer ------------------------------------------------------------


def test_progress_reaches_the_runs_channel_in_order():
    run = running(placed_session())
    token = inference_token(run.run_id, NODE)
    batches = [[{"kind": "delta", "text": f"part {n}"}] for n in range(5)]

    for items in batches:
        answer = call("POST", route(run.run_id, "progress"), token, {"items": items})
        assert (answer.status, answer.json()) == (200, {"ok": True})

    received = [receive_on(turn_channel(run.run_id)) for _ in batches]
    assert [message["items"] for message in received] == batches
    assert {message["type"] for message in received} == {turns.ITEMS_MESSAGE}


def test_progress_sent_by_another_process_reaches_the_turn_through_redis():
    """A Celery worker's turn and the gateway process serving the worker's requests are two processes: the
    channel is a normal (not process-local) channel of the shared layer."""
    if "Redis" not in settings.CHANNEL_LAYERS["default"]["BACKEND"]:
        pytest.skip("only a Redis channel layer is shared between processes (the embedded profile has one process)")
    channel = turn_channel("run-from-another-process")
    script = (
        "import django, sys; django.setup()\n"
        "from asgiref.sync import async_to_sync\n"
        "from channels.layers import get_channel_layer\n"
        "async_to_sync(get_channel_layer().send)(sys.argv[1], {'type': 'openclaw.worker.items', "
        "'items': [{'kind': 'delta', 'text': 'from afar'}]})\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "openclaw_site.settings")}
    subprocess.run([sys.executable, "-c", script, channel], cwd=ROOT, env=env, check=True, timeout=120)

    assert receive_on(channel)["items"] == [{"kind": "delta", "text": "from afar"}]


def test_an_approval_waits_for_the_turns_decision_and_times_out_undecided(monkeypatch):
    run = running(placed_session())
    token = inference_token(run.run_id, NODE)
    question = {"toolCallId": "call-1", "command": "ls -la", "workdir": "/w", "envKeys": ["HOME"], "timeoutS": 30}

    def decide() -> None:
        asked = receive_on(turn_channel(run.run_id))
        assert asked["type"] == turns.APPROVAL_MESSAGE and asked["question"] == question
        answer = {"type": turns.DECISION_MESSAGE, "toolCallId": "call-1", "allowed": True, "aborted": False}
        publisher.submit(lambda: get_channel_layer().send(asked["reply"], {**answer, "reason": ""})).result(10)

    responder = threading.Thread(target=decide)
    responder.start()
    decided = call("POST", route(run.run_id, "approval"), token, question)
    responder.join(30)

    assert (decided.status, decided.json()) == (200, {"allowed": True, "aborted": False, "reason": ""})

    monkeypatch.setattr(worker_routes, "APPROVAL_WAIT_S", 0.2)
    pending = call("POST", route(run.run_id, "approval"), token, question)
    assert pending.status == 504
    assert error_of(pending)["code"] == "TIMEOUT" and error_of(pending)["retryable"] is True


def test_a_run_may_hold_only_so_many_exec_questions_open_at_once(monkeypatch):
    """Each open question holds a request and an operator's approval row: past the cap the worker is told to ask
    again later (429, retryable), and a question answered (here: timed out) frees its place."""
    monkeypatch.setattr(worker_routes, "APPROVALS_IN_FLIGHT_PER_RUN", 1)
    monkeypatch.setattr(worker_routes, "APPROVAL_WAIT_S", 1.0)
    run = running(placed_session())
    token = inference_token(run.run_id, NODE)
    path = route(run.run_id, "approval")

    def question(call_id: str) -> dict:
        return {"toolCallId": call_id, "command": "ls", "workdir": "/w", "envKeys": [], "timeoutS": 30}

    async def two_at_once():
        first = asyncio.ensure_future(request("POST", path, token, question("call-1")))
        await asyncio.sleep(0.3)
        second = await request("POST", path, token, question("call-2"))
        return await first, second

    first, second = publisher.submit(two_at_once).result(30)
    third = call("POST", path, token, question("call-3"))

    assert first.status == 504  # nobody decided: it timed out, as usual
    assert second.status == 429
    assert error_of(second)["retryable"] is True and error_of(second)["retryAfterMs"] == 1000
    assert "already waits on 1 exec decisions" in error_of(second)["message"]
    assert third.status == 504  # the place was freed
    assert worker_routes._approvals_in_flight[run.run_id] == 0


# --- a whole turn --------------------------------------------------------------------------------


class ScriptedNode:
    """OpenClaw's node host as the turn sees it: a receipt at launch, ``running`` while its worker runs, then
    ``completed``; its "worker" calls the gateway's routes with the launch's credential."""

    def __init__(self, worker):
        self.worker = worker
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.done = False
        self.task: asyncio.Task | None = None
        self.final_state = "completed"

    async def __call__(self, node_id: str, command: str, params: dict[str, Any], **options: Any) -> Any:
        self.calls.append((command, params))
        if command == "worker.launch.v1":
            self.params = params
            if self.task is None:
                self.task = asyncio.ensure_future(self._run_worker(params))
        state = "running"
        if command == "worker.cancel.v1":
            self.final_state = "cancelled"
        if self.done or (command == "worker.cancel.v1" and self.task.done()):
            state = self.final_state
        receipt = {**launch_identity(self.params), "state": state}
        if state == "completed":
            receipt["resultJson"] = json.dumps(
                {"status": "completed", "transcriptLeafId": None, "transcriptNextSeq": 1}
            )
        elif state == "cancelled":
            receipt["errorText"] = "node worker turn cancelled"
        return receipt

    async def _run_worker(self, params: dict[str, Any]) -> None:
        try:
            await self.worker(params)
        finally:
            self.done = True


def openclaw_place(session: Session) -> NodeTurnPlace:
    WorkerEnvironment.objects.filter(pk=ENVIRONMENT).update(
        bootstrap_bundle_hash=BUILD["bundleHash"],
        bootstrap_openclaw_version=BUILD["openclawVersion"],
        bootstrap_protocol_features=BUILD["protocolFeatures"],
        bootstrap_install_kind="bundle",
    )
    return NodeTurnPlace(NODE, ENVIRONMENT, "lease", session.session_id, BUILD["bundleHash"], route=None)


def run_turn(session: Session, message: str, node: Any, monkeypatch, *, abort_when=None) -> tuple[Any, Any]:
    """One turn of ``session`` on the scripted ``node`` (the turn's invoke), claimed as the worker-turn task
    claims it; ``abort_when(turn)``: the run's abort flag."""
    monkeypatch.setattr(turns, "invoke_openclaw", node)
    # This test is the worker-turn task: the one the submit would hand the run to (a gateway thread when embedded)
    # would claim it first.
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)
    submitted = runs.run_submit(session_key=session.key, message=message, idempotency_key=str(uuid.uuid4()))
    claim = runs.run_claim(run_id=submitted.run.run_id, executor="test")
    assert claim is not None
    turn = OpenClawNodeTurn(
        claim.run,
        InvokeTarget("channel", "conn", []),
        openclaw_place(session),
        claim.history,
        "echo-model",
        "echo",
        TurnEmitter(claim.run, session),
        agent_id=session.agent_id,
        session_key=session.key,
    )
    if abort_when is not None:
        monkeypatch.setattr(turn, "_abort_requested", lambda now: abort_when(turn))
    return claim.run, turn.run()


def worker_posting(*batches: list[dict[str, Any]], question: dict[str, Any] | None = None, answers: list | None = None):
    async def worker(params: dict[str, Any]) -> None:
        run_id = params["descriptor"]["assignment"]["runId"]
        token = params["descriptor"]["admission"]["credential"]
        launch = await request("GET", route(run_id, "launch"), token)
        assert launch.status == 200, launch.body
        if question is not None:
            answer = await request("POST", route(run_id, "approval"), token, question)
            answers.append((answer.status, answer.json()))
            again = await request("POST", route(run_id, "approval"), token, question)  # asked again: same decision
            answers.append((again.status, again.json()))
        for items in batches:
            answer = await request("POST", route(run_id, "progress"), token, {"items": items})
            assert answer.status == 200, answer.body

    return worker


def test_a_turn_on_openclaws_node_records_what_its_worker_reported(monkeypatch):
    session = placed_session()
    ExecApprovalPolicy.objects.create(
        scope="gateway", document={"version": 1, "defaults": {"security": "deny"}}, hash="h", updated_at=timezone.now()
    )
    answers: list = []
    question = {"toolCallId": "call-1", "command": "rm -rf /", "workdir": "/w", "envKeys": [], "timeoutS": 5}
    assistant = {
        "role": "assistant",
        "content": [{"type": "toolCall", "id": "call-1", "name": "exec", "arguments": {"command": "rm -rf /"}}],
    }
    tool_result = {
        "role": "toolResult",
        "toolCallId": "call-1",
        "toolName": "exec",
        "content": [{"type": "text", "text": "exec denied"}],
        "isError": True,
    }
    node = ScriptedNode(
        worker_posting(
            [{"kind": "delta", "text": "Checking"}],
            [
                {"kind": "message", "key": "s1.a", "message": assistant},
                {
                    "kind": "tool",
                    "phase": "start",
                    "toolCallId": "call-1",
                    "name": "exec",
                    "args": {"command": "rm -rf /"},
                },
            ],
            [{"kind": "message", "key": "s1.r1", "message": tool_result}],
            [
                {"kind": "delta", "text": "NODE-MARKER done"},
                {"kind": "end", "result": {"status": "ok", "text": "NODE-MARKER done", "stopReason": "stop"}},
            ],
            question=question,
            answers=answers,
        )
    )

    run, outcome = run_turn(session, "Reply exactly: NODE-MARKER", node, monkeypatch)

    assert outcome.status == RunStatus.OK and outcome.text == "NODE-MARKER done"
    assert node.calls[0][0] == "worker.launch.v1"
    assert node.calls[-1][0] == "worker.status.v1"
    # The exec question was decided by the gateway's policy, and the repeated question got the same answer.
    assert answers[0][0] == 200 and answers[0][1]["allowed"] is False and "denied" in answers[0][1]["reason"]
    assert answers[1] == answers[0]
    assert not ExecApproval.objects.exists()
    finished = runs.run_finish(run_id=run.run_id, outcome=outcome)
    assert finished.status == RunStatus.OK
    recorded = TranscriptEvent.objects.filter(window_id=run.window_id, type="message").order_by("seq")
    bodies = {event.idempotency_key: event.body for event in recorded}
    assert bodies[f"{run.run_id}:s1.a"]["content"] == assistant["content"]
    assert bodies[f"{run.run_id}:s1.r1"]["toolCallId"] == "call-1"
    assert list(bodies.values())[-1]["role"] == "assistant"  # the final reply, recorded with the run's end


def test_a_worker_that_exits_without_its_end_fails_the_turn(monkeypatch):
    session = placed_session()
    node = ScriptedNode(worker_posting([{"kind": "delta", "text": "half"}]))

    _run, outcome = run_turn(session, "Reply exactly: hi", node, monkeypatch)

    assert outcome.status == RunStatus.ERROR and outcome.error == turns.NO_OUTCOME


def test_a_crashed_worker_fails_the_turn_with_the_receipts_error(monkeypatch):
    session = placed_session()
    node = ScriptedNode(worker_posting([{"kind": "delta", "text": "half"}]))
    node.final_state = "failed"

    async def failed_receipt(node_id: str, command: str, params: dict[str, Any], **options: Any) -> Any:
        receipt = await ScriptedNode.__call__(node, node_id, command, params, **options)
        if receipt["state"] == "failed":
            receipt["errorText"] = "node worker failed with exit code 1: boom"
        return receipt

    _run, outcome = run_turn(session, "hi", failed_receipt, monkeypatch)

    assert outcome.status == RunStatus.ERROR
    assert outcome.error == "device worker turn failed: node worker failed with exit code 1: boom"


def test_an_aborted_turn_is_cancelled_on_the_node_and_ends_aborted(monkeypatch):
    session = placed_session()
    release = asyncio.Event()

    async def slow_worker(params: dict[str, Any]) -> None:
        run_id = params["descriptor"]["assignment"]["runId"]
        token = params["descriptor"]["admission"]["credential"]
        await request("POST", route(run_id, "progress"), token, {"items": [{"kind": "delta", "text": "so far"}]})
        await release.wait()  # until the node passes the gateway's cancel on

    node = ScriptedNode(slow_worker)
    original = ScriptedNode.__call__

    async def node_call(node_id: str, command: str, params: dict[str, Any], **options: Any) -> Any:
        if command == "worker.cancel.v1":
            release.set()
            await asyncio.sleep(0)
        return await original(node, node_id, command, params, **options)

    _run, outcome = run_turn(session, "hi", node_call, monkeypatch, abort_when=lambda turn: turn.text == "so far")

    assert outcome.status == RunStatus.ABORTED and outcome.text == "so far"
    cancels = [params for command, params in node.calls if command == "worker.cancel.v1"]
    assert cancels and all(params == launch_identity(node.params) for params in cancels)
