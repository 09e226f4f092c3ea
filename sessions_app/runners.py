"""The gateway's own turn runner: the default of :data:`sessions_app.extensions.turn_runners`.

A turn runs as the ``sessions.run_turn`` task: in a Celery worker in production, in a worker
thread of the gateway when embedded (``gateway.background``).
"""

from __future__ import annotations

from gateway import background

from .tasks import run_turn


class GatewayTurnRunner:
    name = "gateway"

    def dispatch(self, run_id: str) -> None:
        background.dispatch_now(run_turn, run_id)
