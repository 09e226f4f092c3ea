"""Seams through which other apps extend sessions without sessions_app importing them.

Each is a small registry that an app fills from its ``AppConfig.ready()`` (as ``native_harness``
registers its agent harness in :mod:`sessions_app.harnesses`); ``workers_app`` fills these:

* :data:`turn_runners` — which runner executes a session's turn. The gateway's own runner
  (``sessions_app.runners``) is the default; a selector may claim a session (say, one placed on a
  worker) and return another runner.
* :data:`session_projections` — extra fields of a session's row in ``sessions.describe`` /
  ``sessions.list``, the JSON API and the operator views (say, the ``placement`` projection). A
  contributor gets a batch of sessions, so a page of rows costs one query per contributor.
* :data:`action_guards` — checks that may refuse an action on a session (say, a turn while the
  session's placement is mid-dispatch). A guard runs inside the service's transaction, after the
  session row is locked, and refuses by raising a ``GatewayError``: nothing is written then.

Registries are process-global and filled once at start; tests add and remove their own entries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Any, Protocol

from .models import Session


class TurnRunner(Protocol):
    """Executes the turns of the sessions it is chosen for."""

    name: str

    def dispatch(self, run_id: str) -> None:
        """Start (or queue) the turn ``run_id``; called after the run's row committed.

        The runner claims the run through ``services.runs.run_claim`` and records its outcome with
        ``run_finish``, whose guards make a duplicate dispatch harmless.
        """


RunnerSelector = Callable[[Session], TurnRunner | None]


class TurnRunners:
    def __init__(self) -> None:
        self._default: TurnRunner | None = None
        self._selectors: list[RunnerSelector] = []
        self._lock = threading.Lock()

    def set_default(self, runner: TurnRunner) -> None:
        self._default = runner

    def add_selector(self, selector: RunnerSelector) -> None:
        """``selector(session)`` returns the runner for that session, or None to leave it to others."""
        with self._lock:
            self._selectors.append(selector)

    def remove_selector(self, selector: RunnerSelector) -> None:
        with self._lock:
            self._selectors.remove(selector)

    def for_session(self, session: Session) -> TurnRunner:
        for selector in list(self._selectors):
            runner = selector(session)
            if runner is not None:
                return runner
        if self._default is None:
            raise RuntimeError("no turn runner registered (sessions_app is not ready)")
        return self._default

    @contextmanager
    def selecting(self, selector: RunnerSelector) -> Iterator[None]:
        self.add_selector(selector)
        try:
            yield
        finally:
            self.remove_selector(selector)


# contributor(sessions) -> {session key: {field: value}}; sessions without extra fields may be absent.
ProjectionContributor = Callable[[Sequence[Session]], dict[str, dict[str, Any]]]


class SessionProjections:
    def __init__(self) -> None:
        self._contributors: dict[str, ProjectionContributor] = {}
        self._lock = threading.Lock()

    def register(self, name: str, contributor: ProjectionContributor) -> None:
        with self._lock:
            if name in self._contributors:
                raise RuntimeError(f"session projection registered twice: {name}")
            self._contributors[name] = contributor

    def unregister(self, name: str) -> None:
        with self._lock:
            self._contributors.pop(name, None)

    def extra_fields(self, sessions: Sequence[Session]) -> dict[str, dict[str, Any]]:
        """Every contributor's fields per session key, merged; a field claimed twice is a bug."""
        merged: dict[str, dict[str, Any]] = {}
        if not sessions:
            return merged
        for name, contributor in list(self._contributors.items()):
            for key, fields in contributor(sessions).items():
                row = merged.setdefault(key, {})
                clash = row.keys() & fields.keys()
                if clash:
                    raise RuntimeError(f"session projection {name} repeats fields {sorted(clash)}")
                row.update(fields)
        return merged

    @contextmanager
    def contributing(self, name: str, contributor: ProjectionContributor) -> Iterator[None]:
        self.register(name, contributor)
        try:
            yield
        finally:
            self.unregister(name)


class SessionAction(StrEnum):
    SEND = "send"  # chat.send, sessions.create with a message: a new turn is admitted
    RESET = "reset"
    DELETE = "delete"
    FORK = "fork"  # the session is the source of a fork


ActionGuard = Callable[[Session, SessionAction], None]


class ActionGuards:
    def __init__(self) -> None:
        self._guards: list[ActionGuard] = []
        self._lock = threading.Lock()

    def register(self, guard: ActionGuard) -> None:
        with self._lock:
            self._guards.append(guard)

    def unregister(self, guard: ActionGuard) -> None:
        with self._lock:
            self._guards.remove(guard)

    def check(self, session: Session, action: SessionAction) -> None:
        """Raise the first refusal; called with the session row locked, before anything is written."""
        for guard in list(self._guards):
            guard(session, action)

    @contextmanager
    def guarding(self, guard: ActionGuard) -> Iterator[None]:
        self.register(guard)
        try:
            yield
        finally:
            self.unregister(guard)


turn_runners = TurnRunners()
session_projections = SessionProjections()
action_guards = ActionGuards()
