"""The turn runner of placed sessions: a turn of a session whose placement is ``active`` on a node runs
there (:mod:`workers_app.services.worker_turns`), in a task like the gateway's own turns."""

from __future__ import annotations

from gateway import background
from sessions_app.models import Session
from sessions_app.ports import TurnRunner

from .services.worker_turns import placed_node
from .tasks import run_worker_turn


class WorkerTurnRunner:
    name = "worker"

    def dispatch(self, run_id: str) -> None:
        background.dispatch_now(run_worker_turn, run_id)


worker_turn_runner = WorkerTurnRunner()


def select_worker_runner(session: Session) -> TurnRunner | None:
    """Claims the sessions placed on a node; the others are left to the gateway's runner."""
    return worker_turn_runner if placed_node(session.pk) is not None else None
