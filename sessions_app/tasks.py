"""Celery tasks of sessions_app: thin wrappers; the services guard the state."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from . import turns
from .services import runs

# A running turn heartbeats every 5 s; silence this long means its worker died.
STALE_RUN_AFTER = timedelta(seconds=30)
# A queued turn of an idle session nobody started for this long lost its task.
STUCK_QUEUED_AFTER = timedelta(seconds=30)


# A turn is an agent loop (tools, approval waits): it may run far longer than the other tasks.
TURN_SOFT_TIME_LIMIT_S = settings.OPENCLAW_AGENT["TURN_TIMEOUT_S"]
TURN_TIME_LIMIT_S = TURN_SOFT_TIME_LIMIT_S + 60


# Late acknowledgement, and a task whose pool process died goes back to the queue (prefork): a turn whose worker
# stopped before the claim runs elsewhere, and a redelivered task of a turn already started or ended does nothing
# (the claim is a compare-and-set on the queued run).
@shared_task(
    name="sessions.run_turn",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    soft_time_limit=TURN_SOFT_TIME_LIMIT_S,
    time_limit=TURN_TIME_LIMIT_S,
)
def run_turn(run_id: str) -> str | None:
    return turns.execute_turn(run_id)


@shared_task(name="sessions.runs_sweep", acks_late=True, ignore_result=True)
def runs_sweep() -> dict:
    """Fail turns whose worker stopped heartbeating; dispatch queued turns whose task was lost."""
    now = timezone.now()
    failed = runs.runs_recover_dead_gateways()
    failed += runs.runs_recover(
        stale_before=now - STALE_RUN_AFTER,
        reason="run interrupted: its worker stopped responding (no heartbeat for 30 s)",
    )
    redispatched = runs.runs_redispatch_stuck(queued_before=now - STUCK_QUEUED_AFTER)
    return {"failed": failed, "redispatched": redispatched}
