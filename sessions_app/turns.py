"""Executing one chat turn on the gateway: claim it, run the agent loop, record the outcome.

Runs in a Celery worker (production) or a worker thread of the gateway (embedded), never in a
consumer's receive loop. The turn is a guarded state machine in the database (queued → running
→ ok | error | aborted), so a duplicate task, a sweep or an abort racing with it change nothing
that is not theirs.

The turn is an agent loop (:mod:`openclaw_client.agent.loop`): the model may ask for tools, which run
in the session's workspace on this host (a session placed on a worker runs its turns there instead,
``sessions_app.ports``); every step's messages join the transcript as they happen, and an ``exec`` the
policy does not allow outright waits for an operator's decision (:mod:`approvals_app`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings

from approvals_app.gate import ExecGate
from gateway import background, log_context, metrics
from openclaw_client.agent.loop import (
    AgentLoop,
    Approval,
    LoopAborted,
    ModelReply,
    StepLimitReached,
    run_watched,
)
from openclaw_client.agent.tools import ExecRequest, ExecSlots, ToolLimits, ToolResult, ToolRunner, Workspace

from .events import TurnEmitter
from .model_providers import ChatMessage, ToolCall, default_model, get_model_provider
from .model_providers.base import Aborted, Delta, Finish, ModelProviderError
from .models import Run, RunStatus, Session
from .services import runs
from .services.runs import TurnOutcome
from .services.workspace import session_workspace_dir

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 5.0
ABORT_POLL_INTERVAL_S = 0.1


class RunLost(Exception):
    """The run stopped being this runner's (swept as dead): stop, and record nothing more."""


class _TurnProbe:
    """``should_abort`` for the provider and the loop, called between chunks, every 100 ms while the provider
    or a tool works, and between tool calls: reads the abort flag (at most every 100 ms) and heartbeats the
    run (every 5 s), so a model or a command that is slow to answer is not mistaken for a dead worker.
    """

    def __init__(self, run):
        self.run = run
        self.run_id = run.run_id
        # None: never checked. Not 0.0, which time.monotonic() may not have passed on a just-booted host.
        self.checked_at: float | None = None
        self.beat_at = time.monotonic()
        self.aborted = False
        # The run stopped being ours (swept as dead): stop, and record nothing.
        self.lost = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self.beat_at >= HEARTBEAT_INTERVAL_S:
            self.beat_at = now
            self.lost = not runs.run_heartbeat(run_id=self.run_id)
            background.release_database_connections()  # back to waiting on the model or a tool
        if not self.aborted and (self.checked_at is None or now - self.checked_at >= ABORT_POLL_INTERVAL_S):
            self.checked_at = now
            self.aborted = runs.abort_requested(self.run)
        return self.aborted or self.lost


def tool_limits() -> ToolLimits:
    agent = settings.OPENCLAW_AGENT
    return ToolLimits(exec_timeout_s=agent["EXEC_TIMEOUT_S"], exec_max_timeout_s=agent["EXEC_MAX_TIMEOUT_S"])


def exec_slots() -> ExecSlots:
    """The bound on commands running at once on this host, shared by every process of the state dir."""
    return ExecSlots(Path(settings.STATE_DIR) / "exec-slots", settings.OPENCLAW_AGENT["EXEC_CONCURRENCY"])


def max_steps(agent_id: str) -> int:
    agent = settings.OPENCLAW_AGENT
    return agent["MAX_STEPS_BY_AGENT"].get(agent_id, agent["MAX_STEPS"])


def tool_runner(workspace_dir: Path | None) -> ToolRunner | None:
    """Tools for a workspace that exists on this host; None (the model is offered no tools) otherwise."""
    if workspace_dir is None or not workspace_dir.is_dir():
        return None
    return ToolRunner(Workspace(workspace_dir), limits=tool_limits(), exec_slots=exec_slots())


def chat_messages(messages: list[dict[str, Any]]) -> list[ChatMessage]:
    """The loop's chat-completions messages as the model providers take them."""
    return [
        ChatMessage(
            role=message["role"],
            content=message.get("content") or "",
            tool_calls=tuple(
                ToolCall(id=call["id"], name=call["function"]["name"], arguments=call["function"]["arguments"])
                for call in message.get("tool_calls", ())
            ),
            tool_call_id=message.get("tool_call_id"),
        )
        for message in messages
    ]


class GatewayTurnHooks:
    """The loop's hooks for a turn run by this gateway: its provider, its transcript, its approvals."""

    def __init__(self, run: Run, session: Session, emitter: TurnEmitter, probe: _TurnProbe, *, model: str):
        self.run = run
        self.session = session
        self.emitter = emitter
        self.probe = probe
        self.model = model
        self.provider_name = ""
        self.parts: list[str] = []  # the current model step's text so far (an aborted turn keeps it)
        self.step = 0
        self.results = 0
        self.gate = ExecGate(
            agent_id=session.agent_id,
            node_id=None,
            session_key=session.key,
            session_id=run.window_id,
            run_id=run.run_id,
        )

    def model_step(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], step: int) -> ModelReply:
        provider = get_model_provider()
        self.provider_name = provider.name
        self.step, self.results, self.parts = step, 0, []
        self.emitter.new_message()
        finish: Finish | None = None
        # The model is waited for without a database connection (the abort flag it is polled for is in the cache).
        background.release_database_connections()
        started = time.perf_counter()
        try:
            for item in provider.stream(
                chat_messages(messages), model=self.model, should_abort=self.probe, tools=tools or None
            ):
                if isinstance(item, Delta):
                    self.parts.append(item.text)
                    self.emitter.delta(item.text)
                elif isinstance(item, Finish):
                    finish = item
                self.probe()  # a fast stream must heartbeat too
        finally:
            # A failed or aborted call took the model's time as well.
            metrics.record_model_call(provider.name, time.perf_counter() - started)
        if finish is None:
            raise ModelProviderError("model provider ended without finishing the reply", kind="malformed")
        return ModelReply(
            text=self.text,
            tool_calls=tuple(finish.tool_calls),
            stop_reason=finish.stop_reason,
            usage=finish.usage,
            model=finish.model or self.model,
        )

    @property
    def text(self) -> str:
        """The current model step's text so far, joined when asked (at its end, or when the turn stops)."""
        return "".join(self.parts)

    def record_message(self, message: dict[str, Any], full_text: str | None) -> dict[str, Any]:
        if message.get("role") == "toolResult":
            self.results += 1
            key = f"s{self.step}.r{self.results}"
        else:
            self.emitter.flush()
            key = f"s{self.step}.a"
        stored = runs.run_record_message(
            run_id=self.run.run_id,
            body=message,
            message_key=key,
            full_text=full_text,
            total_bytes=int(message.get("details", {}).get("outputBytes") or 0),
            # This loop claimed the run (a compare-and-set no other runner won) and numbers its own steps.
            first_time=True,
        )
        if stored is None:
            raise RunLost()
        return stored

    def tool_started(self, call_id: str, name: str, arguments: dict[str, Any]) -> None:
        self.emitter.tool_started(call_id, name, arguments)
        background.release_database_connections()  # the tool is waited for without a database connection

    def tool_finished(self, call_id: str, name: str, message: dict[str, Any]) -> None:
        self.emitter.tool_finished(call_id, name, message)

    def approve_exec(self, call_id: str, request: ExecRequest) -> Approval:
        return self.gate.decide(call_id, request, should_stop=self.probe)

    def wait_for(self, work: Callable[[], ToolResult], cancel: threading.Event) -> ToolResult:
        return run_watched(work, cancel, self.probe)

    def should_abort(self) -> bool:
        return self.probe()


def execute_turn(run_id: str) -> str | None:
    """Run the turn if it is still queued and its session idle; returns its terminal status."""
    with log_context.bound(run_id=run_id):
        claim = runs.run_claim(run_id=run_id, executor=background.executor_label())
        if claim is None:
            return None
        with log_context.bound(session_key=claim.session.key):
            return _run_claimed_turn(run_id, claim)


def _run_claimed_turn(run_id: str, claim: runs.ClaimedTurn) -> str | None:
    run, session = claim.run, claim.session
    emitter = TurnEmitter(run, session)
    emitter.start(int(run.started_at.timestamp() * 1000))
    probe = _TurnProbe(run)
    model = session.model or default_model()
    hooks = GatewayTurnHooks(run, session, emitter, probe, model=model)
    outcome: TurnOutcome
    try:
        loop = AgentLoop(hooks, tool_runner(session_workspace_dir(session)), max_steps=max_steps(session.agent_id))
        result = loop.run(claim.history)
        outcome = TurnOutcome(
            status=RunStatus.OK,
            text=result.text,
            stop_reason=result.stop_reason,
            usage=result.usage,
            model_provider=hooks.provider_name,
            model=result.model or model,
        )
    except RunLost:
        if not runs.run_heartbeat(run_id=run_id):
            return None  # swept as dead meanwhile; its outcome is already recorded
        outcome = _error("the session was reset during the turn", "unknown", hooks, model)
    except (Aborted, LoopAborted):
        if probe.lost:
            return None  # swept as dead meanwhile; its outcome is already recorded
        outcome = TurnOutcome(
            status=RunStatus.ABORTED,
            text=hooks.text,
            stop_reason="aborted",
            model_provider=hooks.provider_name,
            model=model,
        )
    except StepLimitReached as limit:
        outcome = _error(str(limit), "step_limit", hooks, model)
    except ModelProviderError as error:
        outcome = _error(error.summary, error.kind, hooks, model)
    except Exception as error:
        # A bug or an unexpected failure must still end the turn, or it would stay "running".
        logger.exception("turn %s failed", run_id)
        outcome = _error(f"turn failed: {type(error).__name__}: {error}", "unknown", hooks, model)
    finally:
        hooks.gate.close()
    finished = runs.run_finish(run_id=run_id, outcome=outcome, emitter=emitter)
    return finished.status if finished is not None else None


def _error(message: str, kind: str, hooks: GatewayTurnHooks, model: str) -> TurnOutcome:
    return TurnOutcome(
        status=RunStatus.ERROR, error=message, error_kind=kind, model_provider=hooks.provider_name, model=model
    )
