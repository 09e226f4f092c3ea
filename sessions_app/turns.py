"""Executing one chat turn: claim it, stream from the model provider, record the outcome.

Runs in a Celery worker (production) or a worker thread of the gateway (embedded), never in a
consumer's receive loop. The turn is a guarded state machine in the database (queued → running
→ ok | error | aborted), so a duplicate task, a sweep or an abort racing with it change nothing
that is not theirs.
"""

from __future__ import annotations

import logging
import time

from gateway import background

from .events import TurnEmitter
from .model_providers import default_model, get_model_provider
from .model_providers.base import Aborted, ChatMessage, Delta, Finish, ModelProviderError
from .models import RunStatus
from .services import runs
from .services.runs import TurnOutcome

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 5.0
ABORT_POLL_INTERVAL_S = 0.1


class _TurnProbe:
    """``should_abort`` for the provider, which calls it between chunks and every 100 ms while it
    waits: reads the abort flag (at most every 100 ms) and heartbeats the run (every 5 s), so a
    model that is slow to answer is not mistaken for a dead worker.
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
        if not self.aborted and (self.checked_at is None or now - self.checked_at >= ABORT_POLL_INTERVAL_S):
            self.checked_at = now
            self.aborted = runs.abort_requested(self.run)
        return self.aborted or self.lost


def execute_turn(run_id: str) -> str | None:
    """Run the turn if it is still queued and its session idle; returns its terminal status."""
    claim = runs.run_claim(run_id=run_id, executor=background.executor_label())
    if claim is None:
        return None
    run, session = claim.run, claim.session
    emitter = TurnEmitter(run, session)
    emitter.start(int(run.started_at.timestamp() * 1000))
    should_abort = _TurnProbe(run)
    parts: list[str] = []
    outcome: TurnOutcome
    provider_name, model = "", session.model
    try:
        provider = get_model_provider()
        provider_name = provider.name
        model = session.model or default_model()
        messages = [ChatMessage(role=role, content=text) for role, text in claim.history]
        finish: Finish | None = None
        for item in provider.stream(messages, model=model, should_abort=should_abort):
            if isinstance(item, Delta):
                parts.append(item.text)
                emitter.delta(item.text, "".join(parts))
            elif isinstance(item, Finish):
                finish = item
            should_abort()  # a fast stream must heartbeat too
        if finish is None:
            raise ModelProviderError("model provider ended without finishing the reply", kind="malformed")
        outcome = TurnOutcome(
            status=RunStatus.OK,
            text="".join(parts),
            stop_reason=finish.stop_reason,
            usage=finish.usage,
            model_provider=provider_name,
            model=finish.model or model,
        )
    except Aborted:
        if should_abort.lost:
            return None  # swept as dead meanwhile; its outcome is already recorded
        outcome = TurnOutcome(
            status=RunStatus.ABORTED,
            text="".join(parts),
            stop_reason="aborted",
            model_provider=provider_name,
            model=model,
        )
    except ModelProviderError as error:
        outcome = TurnOutcome(
            status=RunStatus.ERROR,
            error=error.summary,
            error_kind=error.kind,
            model_provider=provider_name,
            model=model,
        )
    except Exception as error:
        # A bug or an unexpected failure must still end the turn, or it would stay "running".
        logger.exception("turn %s failed", run_id)
        outcome = TurnOutcome(
            status=RunStatus.ERROR,
            error=f"turn failed: {type(error).__name__}: {error}",
            error_kind="unknown",
            model_provider=provider_name,
            model=model,
        )
    finished = runs.run_finish(run_id=run_id, outcome=outcome, emitter=emitter)
    return finished.status if finished is not None else None
