"""What sessions ask of the app that places them on workers: one port, provided once at start.

A session's turns run on the gateway unless the session is placed on a worker; what a placement is,
how a placed turn runs and what a session may do while its placement moves belong to ``workers_app``,
which imports this app and so cannot be imported by it. ``WorkersConfig.ready()`` provides the
:class:`Placements` port; a grep for ``provide_placements`` answers "who fills this?". Without it
(no workers app) every session is local: its turns run on the gateway and nothing is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Protocol

from .models import Session


class SessionAction(StrEnum):
    SEND = "send"  # chat.send, sessions.create with a message: a new turn is admitted
    RESET = "reset"
    DELETE = "delete"
    FORK = "fork"  # the session is the source of a fork


class TurnRunner(Protocol):
    """Executes the turns of the sessions it is chosen for."""

    name: str

    def dispatch(self, run_id: str) -> None:
        """Start (or queue) the turn ``run_id``; called after the run's row committed.

        The runner claims the run through ``services.runs.run_claim`` and records its outcome with
        ``run_finish``, whose guards make a duplicate dispatch harmless.
        """


class Placements(Protocol):
    def runner_for(self, session: Session) -> TurnRunner | None:
        """The runner of a placed session's turns; None: the gateway runs it (``sessions.run_turn``)."""

    def session_fields(self, sessions: Sequence[Session]) -> dict[str, dict[str, Any]]:
        """Extra fields of these sessions' rows (the ``placement`` projection), by session key, read for the
        whole page at once; sessions without any may be absent. May not override a row field."""

    def check_action(self, session: Session, action: SessionAction) -> None:
        """Refuse ``action`` by raising a ``GatewayError`` (the dispatch barrier): called inside the service's
        transaction with the session row locked, before anything is written."""

    def session_renewed(self, session: Session, previous_session_id: str) -> None:
        """The session started a new transcript generation (``sessions.reset``: a new ``sessionId``); whatever
        the placement holds under the previous id follows it. Called inside the reset's transaction with the
        session row locked, after ``check_action`` allowed the reset."""


class _Unplaced:
    def runner_for(self, session: Session) -> TurnRunner | None:
        return None

    def session_fields(self, sessions: Sequence[Session]) -> dict[str, dict[str, Any]]:
        return {}

    def check_action(self, session: Session, action: SessionAction) -> None:
        return None

    def session_renewed(self, session: Session, previous_session_id: str) -> None:
        return None


_UNPLACED = _Unplaced()
_placements: Placements = _UNPLACED


def provide_placements(port: Placements) -> None:
    global _placements
    if _placements is not _UNPLACED and _placements is not port:
        raise RuntimeError("the sessions' placement port is provided once")
    _placements = port


def placements() -> Placements:
    return _placements
