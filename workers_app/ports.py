"""What workers_app provides through the ports of the apps below it, once, from ``WorkersConfig.ready()``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sessions_app.models import Session
from sessions_app.ports import SessionAction, TurnRunner

from .guards import placement_barrier
from .models import PlacementState
from .nodes.openclaw.dialect import node_speaks_openclaw
from .nodes.openclaw.retention import openclaw_node_forget
from .runners import select_worker_runner
from .selectors import node_worker_fields, placement_fields, placement_for
from .services.environments import environment_follow_session
from .services.recovery import workers_node_removed


class WorkersPlacements:
    """The sessions' placement port (``sessions_app.ports.Placements``)."""

    def runner_for(self, session: Session) -> TurnRunner | None:
        # A session whose placement is active on a node runs its turns there.
        return select_worker_runner(session)

    def session_fields(self, sessions: Sequence[Session]) -> dict[str, dict[str, Any]]:
        return placement_fields(sessions)

    def check_action(self, session: Session, action: SessionAction) -> None:
        # The dispatch barrier: nothing that would race a placement on its way to a worker or back.
        placement_barrier(session, action)

    def session_renewed(self, session: Session, previous_session_id: str) -> None:
        # An active placement keeps its worker across a reset: the environment's attachment follows the new id
        # (recovery checks that the environment is attached to exactly the session's current id).
        placement = placement_for(session)
        if placement is not None and placement.environment_id and placement.state == PlacementState.ACTIVE:
            environment_follow_session(
                environment_id=placement.environment_id,
                previous_session_id=previous_session_id,
                session_id=session.session_id,
            )


class WorkersOnNodes:
    """The node catalog's worker port (``devices_app.ports.NodeWorkers``)."""

    def node_fields(self, node_ids: set[str], live: dict[str, Any]) -> dict[str, dict]:
        # sessionHost, workerSlots, issues and workerBundle of each node's current declaration.
        return node_worker_fields(node_ids, live)

    def node_leaving(self, node_id: str) -> None:
        # OpenClaw's node host deletes a gateway's files only when told (the project's cleans itself once refused).
        if node_speaks_openclaw(node_id):
            openclaw_node_forget(node_id)

    def node_removed(self, node_id: str) -> None:
        # The node's environments lose their provider's recognition now and their placements fail.
        workers_node_removed(node_id)
