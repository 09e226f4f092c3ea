"""The worker runtime seam: what installs the worker program on a leased environment, syncs a session's
workspace to it and starts it (the dispatch stages after provisioning), and brings the workspace
back when the session leaves it.

The node host is the one runtime (:mod:`workers_app.nodes.runtime`), registered from the app's
``ready()`` for every provider whose leases are nodes. For a provider without a runtime a dispatch
provisions and checks the lease for real, then fails cleanly at bootstrap with a message saying
so, and the lease is released.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sessions_app.models import Session

from .models import Placement, WorkerEnvironment


@dataclass(frozen=True)
class BootstrapReceipt:
    bundle_hash: str  # 64 lowercase hex
    openclaw_version: str
    protocol_features: list[str]
    install_kind: str
    # The node the environment runs on, when bootstrapping made one (a static-ssh host's node host).
    node_device_id: str | None = None


@dataclass(frozen=True)
class WorkspaceSync:
    manifest_ref: str  # sha256:<64 hex>
    remote_workspace_dir: str


class WorkerRuntime(Protocol):
    def bootstrap(self, environment: WorkerEnvironment) -> BootstrapReceipt: ...

    def sync_workspace(
        self, session: Session, placement: Placement, environment: WorkerEnvironment
    ) -> WorkspaceSync: ...

    def start(self, session: Session, placement: Placement, environment: WorkerEnvironment) -> None: ...

    def reconcile_workspace(self, session: Session, placement: Placement, environment: WorkerEnvironment) -> int:
        """Apply the worker's workspace changes to the session's worktree (before a move back)."""
        ...


class RuntimeRegistry:
    def __init__(self) -> None:
        self._by_provider: dict[str, WorkerRuntime] = {}

    def register(self, provider_id: str, runtime: WorkerRuntime) -> None:
        self._by_provider[provider_id] = runtime

    def unregister(self, provider_id: str) -> None:
        self._by_provider.pop(provider_id, None)

    def for_provider(self, provider_id: str) -> WorkerRuntime | None:
        return self._by_provider.get(provider_id)


worker_runtimes = RuntimeRegistry()
