"""A node turn watched from the thread that claimed it, whichever dialect the node speaks.

The launch itself (how the node is asked, how its progress comes back) is the dialect's: the project's node
host streams progress on ``worker.launch.v1`` (``workers_app/services/worker_turns.py``); OpenClaw's node host
only keeps a receipt, and the project's worker on it reports over HTTP (``workers_app/nodes/openclaw/turns.py``).
Both hand this thread the same progress items: a piece of the reply, a step's message, a tool's start, an exec
question, and the launch's result. Here they become the run's ``chat``/``agent`` events, transcript messages,
exec decisions and outcome, and here the run is heartbeaten and its abort flag read while it waits.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
import uuid
from collections.abc import Awaitable
from typing import Any

from django.conf import settings

from approvals_app.gate import ExecGate
from gateway import publisher
from gateway.background import release_database_connections
from gateway.invoke import InvokeTarget, NodeCommandFailed
from gateway.selectors import live_process_boot_ids
from openclaw_client.agent.loop import Approval
from openclaw_client.agent.tools import ExecRequest
from sessions_app import turns as gateway_turns
from sessions_app.events import TurnEmitter
from sessions_app.models import Run, RunStatus
from sessions_app.services import runs
from sessions_app.services.runs import TurnOutcome
from sessions_app.turns import ABORT_POLL_INTERVAL_S

from .turn_lookups import NodeTurnPlace

logger = logging.getLogger(__name__)

RUNNER_OFFLINE = "runner-offline"
RUNNER_OFFLINE_MESSAGE = (
    "⚠️ The device runner is offline. Reconnect it, retry later, or bring the session back to this gateway."
)
CAPACITY_EXHAUSTED = "WORKER_CAPACITY_EXHAUSTED"
CAPACITY_MESSAGE = "device worker capacity remained full"
GATEWAY_PROCESS_LOST = (
    "device worker turn interrupted: the gateway process holding the node's connection stopped mid-turn; "
    "the node reconnects through another process, retry the turn"
)
HEARTBEAT_INTERVAL_S = 5.0
POLL_INTERVAL_S = 0.05
LAUNCH_ENDED = object()
# A transcript message of a node turn names its step and place (``s3.a``: the assistant message of step 3,
# ``s3.r2``: the second tool result of that step), which keys it in the transcript.
MESSAGE_KEY = re.compile(r"s[1-9][0-9]{0,3}\.(a|r[1-9][0-9]{0,2})")
MESSAGE_ROLES = frozenset({"assistant", "toolResult"})


def turn_timeout_ms() -> int:
    """How long a node may take over one turn (the turn task's own limit)."""
    return int(settings.OPENCLAW_AGENT["TURN_TIMEOUT_S"] * 1000)


def agent_settings(agent_id: str) -> dict[str, Any]:
    """The agent loop's bounds a node's worker runs the turn under."""
    return {
        "maxSteps": gateway_turns.max_steps(agent_id),
        "tools": True,
        "execTimeoutMs": int(settings.OPENCLAW_AGENT["EXEC_TIMEOUT_S"] * 1000),
    }


def offline_outcome(provider_name: str, model: str) -> TurnOutcome:
    return TurnOutcome(
        status=RunStatus.ERROR,
        error=f"{RUNNER_OFFLINE_MESSAGE} ({RUNNER_OFFLINE})",
        error_kind=RUNNER_OFFLINE,
        model_provider=provider_name,
        model=model,
    )


class WatchedNodeTurn:
    """One launch on a node, watched from this thread: progress becomes events, aborts become cancels.

    A dialect supplies :meth:`_launch` (a coroutine on the channel layer's loop that puts progress items on
    :attr:`progress`, watches :attr:`cancel`, and returns the launch's result) and :meth:`_deliver_decision`."""

    def __init__(
        self,
        run: Run,
        target: InvokeTarget | None,
        place: NodeTurnPlace,
        history: list[dict[str, Any]],
        model: str,
        provider_name: str,
        emitter: TurnEmitter,
        agent_id: str = "main",
        session_key: str = "",
    ):
        self.record = run
        self.run_id = run.run_id
        self.target = target
        self.node_id = place.node_id
        self.place = place
        self.history = history
        self.model = model
        self.provider_name = provider_name
        self.emitter = emitter
        self.progress: queue.SimpleQueue[dict[str, Any] | object] = queue.SimpleQueue()
        self.cancel = threading.Event()
        self.text = ""
        self.abort_checked_at = 0.0
        self.beat_at = 0.0
        self.lost = False
        self.launch_ended = False
        self.agent_id = agent_id
        self.session_key = session_key
        self.gate = ExecGate(
            agent_id=agent_id,
            node_id=place.node_id,
            session_key=session_key,
            session_id=run.window_id,
            run_id=run.run_id,
        )

    def _launch(self) -> Awaitable[Any]:
        raise NotImplementedError

    def _deliver_decision(self, call_id: str, decision: Approval, question: dict[str, Any]) -> None:
        raise NotImplementedError

    def _prepare(self) -> None:
        """What the launch needs from the database, read on this thread before it starts (the launch runs on
        the event loop, which reads no database)."""

    def run(self) -> TurnOutcome | None:
        self._prepare()
        future = publisher.submit(self._launch)
        # After the launch: its publication would otherwise be ahead of the launch on the loop.
        self.emitter.start(int(self.record.started_at.timestamp() * 1000))
        # Progress and the launch's end arrive on one queue: this thread wakes for each, not on a timer.
        future.add_done_callback(lambda _done: self.progress.put(LAUNCH_ENDED))
        self.beat_at = self.abort_checked_at = time.monotonic()
        # A turn that waits on its node gives its database connection back (a short one ends first and
        # keeps it for recording its end, sparing the pool a checkout on its path).
        holds_connection = True
        try:
            while True:
                try:
                    item = self.progress.get(timeout=POLL_INTERVAL_S)
                except queue.Empty:
                    item = None
                    if holds_connection:
                        release_database_connections()
                        holds_connection = False
                if item is LAUNCH_ENDED:
                    break
                if item is not None:
                    self._emit_or_drop(item)
                self._tick()
        finally:
            self.gate.close()
        lost = self.lost
        try:
            result = future.result()
        except NodeCommandFailed as failure:
            return self._failed(failure)
        except Exception:
            # A bug (ours or in transport): the turn ends now, its reason names an error id only.
            error_id = uuid.uuid4().hex[:12]
            logger.exception("node turn %s failed (errorId=%s)", self.run_id, error_id)
            return self._error(f"device worker turn failed: internal error (errorId={error_id})", "unknown")
        if lost:
            return None
        return self._outcome(result)

    def _connection_process_died(self) -> bool:
        """The connection the launch went to was lost with its gateway process (killed, crashed), not
        closed by the node: the reason then names the process, since the node itself may be fine."""
        route = self.place.route
        if route is None or not route.process_id:
            return False
        alive = route.process_id in live_process_boot_ids()
        release_database_connections()
        return not alive

    def _tick(self) -> bool:
        """Heartbeat the run and pass an abort (or the loss of the run) on as a cancel; True once the turn
        should stop waiting on anything (aborted, lost, or its launch ended)."""
        now = time.monotonic()
        if now - self.beat_at >= HEARTBEAT_INTERVAL_S:
            self.beat_at = now
            self.lost = not runs.run_heartbeat(run_id=self.run_id)
            release_database_connections()
        if not self.cancel.is_set() and (self.lost or self._abort_requested(now)):
            self.cancel.set()
        return self.cancel.is_set() or self.launch_ended

    def _abort_requested(self, now: float) -> bool:
        """The run's abort flag, read at most every :data:`ABORT_POLL_INTERVAL_S` (as a local turn reads it)."""
        if now - self.abort_checked_at < ABORT_POLL_INTERVAL_S:
            return False
        self.abort_checked_at = now
        return runs.abort_requested(self.record)

    def _emit_or_drop(self, data: dict[str, Any]) -> None:
        """:meth:`_emit`, and a progress item that could not be handled is dropped with its traceback in the log: the
        turn goes on (a node's malformed item must not end this thread while the node's worker keeps running)."""
        try:
            self._emit(data)
        except Exception:
            logger.exception(
                "node %s: a progress item of run %s could not be handled; dropped", self.node_id, self.run_id
            )

    def _emit(self, data: dict[str, Any]) -> None:
        """One progress of the launch: a piece of the reply, a step's message, a tool's start, an exec question."""
        kind = data.get("kind")
        text = data.get("text")
        if kind == "delta" and isinstance(text, str) and text.startswith(self.text) and text != self.text:
            self.emitter.delta(text[len(self.text) :])
            self.text = text
        elif kind == "message":
            self._record(data)
        elif kind == "tool" and data.get("phase") == "start":
            arguments = data.get("args") if isinstance(data.get("args"), dict) else {}
            self.emitter.tool_started(str(data.get("toolCallId", ""))[:200], str(data.get("name", ""))[:64], arguments)
        elif kind == "approval":
            self._answer_exec_question(data)

    def _record(self, data: dict[str, Any]) -> None:
        """A complete message of the turn joins the transcript now (each step is durable once it happened);
        one for a run that is no longer this turn's (swept, superseded) is dropped."""
        key, message = data.get("key"), data.get("message")
        if not (
            isinstance(key, str)
            and MESSAGE_KEY.fullmatch(key)
            and isinstance(message, dict)
            and message.get("role") in MESSAGE_ROLES
            and isinstance(message.get("content"), list)
        ):
            logger.warning("node %s sent a malformed message for run %s; dropped", self.node_id, self.run_id)
            return
        full_text = data.get("fullText") if isinstance(data.get("fullText"), str) else None
        self.emitter.new_message()
        self.text = ""
        details = message.get("details") if isinstance(message.get("details"), dict) else {}
        stored = runs.run_record_message(
            run_id=self.run_id,
            body=message,
            message_key=key,
            full_text=full_text,
            total_bytes=int(details.get("outputBytes") or 0),
        )
        if stored is None:
            logger.info(
                "dropped %s of run %s from node %s: the run is no longer running on this placement",
                key,
                self.run_id,
                self.node_id,
            )
            return
        if message.get("role") == "toolResult":
            self.emitter.tool_finished(str(message.get("toolCallId", "")), str(message.get("toolName", "")), stored)

    def _answer_exec_question(self, data: dict[str, Any]) -> None:
        """The worker asks whether a command may run: the gateway decides (policy, and an operator when the
        policy asks) and answers it the dialect's way; the worker waits for it."""
        call_id = str(data.get("toolCallId", ""))[:200]
        command, workdir = data.get("command"), data.get("workdir")
        if not call_id or not isinstance(command, str) or not isinstance(workdir, str):
            decision = Approval(False, "exec refused: the worker's question was malformed")
        else:
            env_keys = data.get("envKeys") if isinstance(data.get("envKeys"), list) else []
            timeout_s = data.get("timeoutS") if isinstance(data.get("timeoutS"), int | float) else 0.0
            request = ExecRequest(
                command=command,
                workdir=workdir,
                env_keys=tuple(str(key) for key in env_keys),
                timeout_s=float(timeout_s),
            )
            decision = self.gate.decide(call_id, request, should_stop=self._tick)
        self._deliver_decision(call_id, decision, data)

    def _outcome(self, result: Any) -> TurnOutcome:
        if not isinstance(result, dict):
            return self._error("device worker returned an invalid result", "unknown")
        status = result.get("status")
        text = result.get("text") if isinstance(result.get("text"), str) else self.text
        if status in ("ok", "aborted"):
            # What the node did not report as progress (it coalesces; a short reply comes whole here).
            self._emit({"kind": "delta", "text": text})
        if status == "ok":
            usage = result.get("usage")
            return TurnOutcome(
                status=RunStatus.OK,
                text=text,
                stop_reason=str(result.get("stopReason") or "stop")[:32],
                usage=usage if isinstance(usage, dict) else None,
                model_provider=self.provider_name,
                model=str(result.get("model") or self.model)[:200],
            )
        if status == "aborted":
            return self._aborted(text)
        error = result.get("error") if isinstance(result.get("error"), dict) else {}
        return self._error(
            str(error.get("message") or "device worker turn failed"), str(error.get("kind") or "unknown")
        )

    def _failed(self, failure: NodeCommandFailed) -> TurnOutcome:
        if failure.code == "NOT_CONNECTED":
            if self._connection_process_died():
                return self._error(f"{GATEWAY_PROCESS_LOST} ({RUNNER_OFFLINE})", RUNNER_OFFLINE)
            return offline_outcome(self.provider_name, self.model)
        if failure.code == CAPACITY_EXHAUSTED:
            return self._error(f"{CAPACITY_MESSAGE} ({CAPACITY_EXHAUSTED})", CAPACITY_EXHAUSTED)
        return self._error(f"device worker turn failed: {failure.message} ({failure.code})", "unknown")

    def _aborted(self, text: str) -> TurnOutcome:
        return TurnOutcome(
            status=RunStatus.ABORTED,
            text=text,
            stop_reason="aborted",
            model_provider=self.provider_name,
            model=self.model,
        )

    def _error(self, message: str, kind: str) -> TurnOutcome:
        return TurnOutcome(
            status=RunStatus.ERROR,
            error=message,
            error_kind=kind[:32],
            model_provider=self.provider_name,
            model=self.model,
        )
