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


_RELATED_LOADED = "_session_projections_related_loaded"


class SessionProjections:
    def __init__(self) -> None:
        self._contributors: dict[str, ProjectionContributor] = {}
        self._related: dict[str, tuple[str, ...]] = {}
        # Per contributor: relation -> the columns of it the contributor reads (relations it declared them for).
        self._columns: dict[str, dict[str, frozenset[str]]] = {}
        # (related, unread columns), worked out again after each change of the contributors.
        self._shape: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._lock = threading.Lock()

    def register(
        self,
        name: str,
        contributor: ProjectionContributor,
        *,
        related: Sequence[str] = (),
        columns: Sequence[str] = (),
    ) -> None:
        """``related``: one-to-one relations of Session the contributor reads, which the session reads
        of ``sessions.list`` / ``sessions.describe`` load in their own query (``select_related``); the
        contributor still gets sessions without them from other callers and must read those itself.

        ``columns``: ``relation__field`` paths, every column of a ``related`` relation the contributor reads.
        A ``sessions.list`` page and ``sessions.describe`` then read only those of that relation (every column
        of it otherwise); a column left out loads on access, one query per row."""
        declared = _declared_columns(related, columns)
        with self._lock:
            if name in self._contributors:
                raise RuntimeError(f"session projection registered twice: {name}")
            self._contributors[name] = contributor
            self._related[name] = tuple(related)
            self._columns[name] = declared
            self._shape = None

    def unregister(self, name: str) -> None:
        with self._lock:
            self._contributors.pop(name, None)
            self._related.pop(name, None)
            self._columns.pop(name, None)
            self._shape = None

    def related(self) -> tuple[str, ...]:
        """Every contributor's ``related`` relations, sorted (a stable key for a compiled query)."""
        return self._query_shape()[0]

    def unread_columns(self) -> tuple[str, ...]:
        """``relation__field`` paths of the related columns no contributor reads, sorted: those of relations
        whose every contributor declared its ``columns``."""
        return self._query_shape()[1]

    def _query_shape(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        shape = self._shape
        if shape is not None:
            return shape
        with self._lock:
            related = tuple(sorted({relation for relations in self._related.values() for relation in relations}))
            wanted: dict[str, set[str]] = {}
            whole: set[str] = set()
            for name, relations in self._related.items():
                for relation in relations:
                    if relation in self._columns[name]:
                        wanted.setdefault(relation, set()).update(self._columns[name][relation])
                    else:
                        whole.add(relation)
            unread = []
            for relation, fields in wanted.items():
                if relation in whole:
                    continue
                target = Session._meta.get_field(relation).related_model._meta
                unread += [
                    f"{relation}__{field.name}"
                    for field in target.concrete_fields
                    if not field.primary_key and field.name not in fields
                ]
            self._shape = shape = (related, tuple(sorted(unread)))
            return shape

    def mark_related_loaded(self, sessions: Sequence[Session], related: tuple[str, ...]) -> None:
        """These sessions were read with ``related`` in the same query (by the sessions selectors)."""
        for session in sessions:
            setattr(session, _RELATED_LOADED, related)

    @staticmethod
    def related_loaded(session: Session, relation: str) -> bool:
        """Whether ``relation`` of this session came from the query that read it, so a contributor may
        use it as is. A relation cached any other way (an object created or changed in memory since)
        may be stale: the contributor reads it again."""
        if relation not in getattr(session, _RELATED_LOADED, ()):
            return False
        return getattr(Session, relation).related.is_cached(session)

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
    def contributing(
        self,
        name: str,
        contributor: ProjectionContributor,
        *,
        related: Sequence[str] = (),
        columns: Sequence[str] = (),
    ) -> Iterator[None]:
        self.register(name, contributor, related=related, columns=columns)
        try:
            yield
        finally:
            self.unregister(name)


def _declared_columns(related: Sequence[str], columns: Sequence[str]) -> dict[str, frozenset[str]]:
    """``columns`` by relation; a path that names no column of a ``related`` relation is refused."""
    declared: dict[str, set[str]] = {}
    for path in columns:
        relation, _, field = path.partition("__")
        if relation not in related:
            raise ValueError(f"session projection column {path!r} is not of a related relation")
        target = Session._meta.get_field(relation).related_model._meta
        if field not in {f.name for f in target.concrete_fields}:
            raise ValueError(f"session projection column {path!r} names no column")
        declared.setdefault(relation, set()).add(field)
    return {relation: frozenset(fields) for relation, fields in declared.items()}


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
