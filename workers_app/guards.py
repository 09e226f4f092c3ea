"""What a session may do while it has a worker placement (the dispatch barrier), for sessions_app's guards.

While a placement is on its way to a worker or back (requested … starting, draining, reconciling),
local admission is closed: no new turn, no reset, no delete, no fork — they would race the move.
A failed placement is a terminal sink for turns until an operator recovers it (workers.md §1.2).
"""

from __future__ import annotations

from gateway.exceptions import Busy
from sessions_app.models import Session
from sessions_app.ports import SessionAction

from .models import DISPATCH_BARRIER_STATES, PlacementState
from .selectors import placement_for

ACTION_WORDS = {
    SessionAction.SEND: "start a turn",
    SessionAction.RESET: "reset",
    SessionAction.DELETE: "be deleted",
    SessionAction.FORK: "be forked",
}


def placement_barrier(session: Session, action: SessionAction) -> None:
    """Refuse ``action`` while the session's placement is moving; turns also while it is failed."""
    placement = placement_for(session)
    if placement is None:
        return
    if placement.state in DISPATCH_BARRIER_STATES:
        raise Busy(
            f"Session {session.key} cannot {ACTION_WORDS[action]} while its worker placement is {placement.state}; "
            "retry when the move is done.",
            details={"code": "PLACEMENT_BARRIER", "placementState": placement.state},
            retryable=True,
        )
    if placement.state == PlacementState.FAILED and action == SessionAction.SEND:
        raise Busy(
            f"Session {session.key} worker placement failed: {placement.terminal_reason or placement.recovery_error}",
            details={"code": "PLACEMENT_FAILED", "placementState": placement.state},
        )
