"""Events of workers_app, published after commit: a placement change is a ``sessions.changed`` with
``reason: "placement"`` and the placement's public projection, so clients watch dispatch stages,
moves and recovery as they happen."""

from __future__ import annotations

from sessions_app.events import publish_session_changed_payload_on_commit
from sessions_app.models import Session

from .models import Placement, WorkerEnvironment
from .selectors import placement_projection


def placement_changed_on_commit(
    session: Session, placement: Placement, environment: WorkerEnvironment | None = None
) -> None:
    if environment is None and placement.environment_id:
        environment = WorkerEnvironment.objects.filter(pk=placement.environment_id).first()
    publish_session_changed_payload_on_commit(
        session, reason="placement", extra={"placement": placement_projection(placement, environment)}
    )
