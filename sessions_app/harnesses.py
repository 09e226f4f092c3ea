"""The interface of external agent runtimes that own native threads, and their registry.

A harness forks native threads, reads their history, archives them, keeps a native binding per
session, and takes part in deleting the sessions it owns. Harness apps register themselves (the
bundled one: ``native_harness``); sessions_app never imports them.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class DeletionTarget:
    agent_id: str
    session_key: str
    session_id: str
    lifecycle_revision: str
    agent_harness_id: str
    # The initialization handle, only when the deletion is that initialization's own rollback.
    initialization: Any | None = None
    # "delete": an operator deletes a ready session; "rollback": an owner-specific rollback, which
    # a supervision-owned binding refuses unless it is the owning initialization's own.
    purpose: str = "delete"


class DeletionParticipation(Protocol):
    def after_commit(self) -> None:
        """The host's row deletion committed: remove what the harness keeps for the session."""

    def abandon(self) -> None:
        """The host did not delete (row changed or the delete failed): release what was prepared."""


class AgentHarness(Protocol):
    id: str
    upstream_kind: str

    def prepare_deletion(self, target: DeletionTarget) -> DeletionParticipation:
        """Check the harness allows deleting the session; raise to refuse (nothing changes)."""

    def fork_session(self, request: ForkRequest) -> ForkResult: ...


@dataclass(frozen=True)
class ForkRequest:
    target_key: str
    agent_id: str
    source: dict[str, Any]  # {agentId, sessionId, sessionKey, entryId, nativeTurnId}
    upstream: dict[str, Any]  # the source's upstream link
    assert_current: Any  # the fork's current-guard (raises when the source changed)


@dataclass(frozen=True)
class ForkResult:
    status: str  # created | failed
    key: str | None = None
    editor_text: str | None = None
    code: str | None = None
    message: str | None = None
    # The exception behind a failed fork (e.g. the incomplete guarded rollback), kept as the cause of
    # the error the gateway method raises.
    cause: BaseException | None = None


@dataclass
class HarnessRegistry:
    harnesses: dict[str, AgentHarness] = field(default_factory=dict)
    # Registration generations: an initialization captured the owner it started with and must
    # notice when that registration was retired and replaced meanwhile.
    generations: dict[str, int] = field(default_factory=dict)
    _counter: itertools.count = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def register(self, harness: AgentHarness) -> None:
        with self._lock:
            self.harnesses[harness.id] = harness
            self.generations[harness.id] = next(self._counter)

    def get(self, harness_id: str) -> AgentHarness | None:
        return self.harnesses.get(harness_id)

    def generation(self, harness_id: str) -> int | None:
        return self.generations.get(harness_id)

    def for_upstream_kind(self, kind: str) -> list[AgentHarness]:
        return [h for h in self.harnesses.values() if h.upstream_kind == kind]


registry = HarnessRegistry()
