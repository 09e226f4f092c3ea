"""Celery tasks of workers_app: thin wrappers; the services guard on state first, so a duplicate or
redelivered task (late acknowledgement) does nothing or resumes what is half-done."""

from __future__ import annotations

from celery import shared_task

from sessions_app.tasks import TURN_SOFT_TIME_LIMIT_S, TURN_TIME_LIMIT_S

from .nodes import retention
from .services import dispatch, recovery, worker_turns


@shared_task(name="workers.dispatch_advance", acks_late=True, ignore_result=True)
def dispatch_advance(session_pk: int, generation: int) -> str:
    return dispatch.dispatch_advance(session_pk=session_pk, generation=generation)


@shared_task(name="workers.recovery_sweep", acks_late=True, ignore_result=True)
def recovery_sweep() -> dict:
    return recovery.workers_recovery_sweep().as_dict()


@shared_task(name="workers.node_retain", acks_late=True, ignore_result=True)
def node_retain(node_id: str, conn_id: str) -> str | None:
    return retention.node_retain(node_id=node_id, conn_id=conn_id)


# As sessions.run_turn: claimed by compare-and-set, so a task given back by a dead pool process runs its turn once.
@shared_task(
    name="workers.run_worker_turn",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    soft_time_limit=TURN_SOFT_TIME_LIMIT_S,
    time_limit=TURN_TIME_LIMIT_S,
)
def run_worker_turn(run_id: str) -> str | None:
    return worker_turns.execute_worker_turn(run_id)
