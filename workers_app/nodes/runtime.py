"""The node host as the worker runtime (docs/node-worker-protocol.md): every environment whose lease is
a node — a paired ``device``, a ``local`` node host, a ``static-ssh`` host enrolled as a node — is
brought up, synced, reconciled and stopped the same way, through the node's private commands.

* bootstrap — the node installs this gateway's worker bundle, unless it reported it installed;
* sync — the session's worktree goes over as a content-addressed manifest, and only the blobs the
  node lacks are sent, in bounded batches;
* start — the node confirms the workspace is in place on the connection that will run the turns;
* reconcile — on the way back, the node's changes to the workspace are applied to the worktree;
* stop — the node deletes the environment's workspace (the device provider's teardown).

OpenClaw's own node host speaks its own dialect of these commands (node-worker-dialect.md); for a node whose
live connection speaks it, bootstrap, start and stop are :mod:`workers_app.nodes.openclaw.provisioning`'s.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.selectors import now_ms
from openclaw_client.workspace import MAX_TOTAL_BYTES, WorkspaceError, build_manifest, manifest_ref
from sessions_app.models import Session

from ..bundle import current_bundle
from ..models import Placement, WorkerEnvironment, WorkspaceManifest
from ..providers import WorkerProviderError
from ..runtimes import BootstrapReceipt, WorkspaceSync
from . import hosts as node_hosts
from .calls import NodeCommandFailed, call_node, not_connected
from .openclaw import workspace as openclaw_workspace
from .openclaw.dialect import node_speaks_openclaw
from .openclaw.provisioning import openclaw_bootstrap, openclaw_stop
from .ssh import ensure_ssh_node
from .worktree_changes import apply_workspace_changes, session_workspace_root

WORKER_SUPERVISOR_FEATURE = "node-worker-supervisor-v6"
INSTALL_TIMEOUT_MS = 600_000
BUNDLE_PREWARM_VERSION = 1
SYNC_TIMEOUT_MS = 120_000
# Raw bytes of blob content per prepare call (base64 makes the frame a third larger).
SYNC_BATCH_BYTES = 4 * 1024 * 1024
# A node that still lacks content after it was all sent is asked again, this many times in all.
SYNC_ROUNDS = 3
# The pages of a workspace export a node may answer with: a 1 GiB workspace in 4 MiB pages, and some to spare.
EXPORT_MAX_PAGES = 1024


def node_of(environment: WorkerEnvironment) -> str:
    if not environment.node_device_id:
        raise WorkerProviderError(f"worker environment {environment.pk} has no node to run on")
    return environment.node_device_id


def node_failure(node_id: str, failure: NodeCommandFailed, what: str) -> WorkerProviderError:
    """A node command's failure as the dispatch (or teardown) reports it."""
    if failure.code == "NOT_CONNECTED":
        return WorkerProviderError(not_connected(node_id))
    return WorkerProviderError(f"{what}: {failure.message}")


class NodeWorkerRuntime:
    """The :class:`~workers_app.runtimes.WorkerRuntime` of node-leased environments."""

    def bootstrap(self, environment: WorkerEnvironment) -> BootstrapReceipt:
        node_id = node_of(environment)
        if node_speaks_openclaw(node_id):
            return openclaw_bootstrap(node_id)
        bundle = current_bundle()
        if node_hosts.node_bundle_installed(node_id, bundle.sha256):
            return BootstrapReceipt(
                bundle.sha256, bundle.version, [WORKER_SUPERVISOR_FEATURE], "existing", node_device_id=node_id
            )
        params: dict[str, Any] = {
            "bundleHash": bundle.sha256,
            "openclawVersion": bundle.version,
            "downloadPath": f"/api/workers/bundle/{bundle.sha256}",
            "sizeBytes": bundle.size,
            "idempotencyKey": f"default:{bundle.sha256}",
        }
        if node_hosts.node_offers(node_id, "bundlePrewarm"):
            # A worker child started with the install: the session's first turn finds it warm.
            params["bundlePrewarm"] = BUNDLE_PREWARM_VERSION
        try:
            receipt = call_node(node_id, "worker.bundle.install.v1", params, timeout_ms=INSTALL_TIMEOUT_MS)
        except NodeCommandFailed as failure:
            raise node_failure(node_id, failure, "Device worker bundle installation failed") from None
        if (
            not isinstance(receipt, dict)
            or receipt.get("bundleHash") != bundle.sha256
            or receipt.get("openclawVersion") != bundle.version
        ):
            raise WorkerProviderError("Device worker bundle installer returned a mismatched build receipt")
        node_hosts.node_bundle_record(node_id=node_id, bundle_hash=bundle.sha256, status="installed")
        features = receipt.get("protocolFeatures")
        return BootstrapReceipt(
            bundle.sha256,
            bundle.version,
            [str(feature) for feature in features] if isinstance(features, list) else [WORKER_SUPERVISOR_FEATURE],
            str(receipt.get("installKind") or "installed")[:16],
            node_device_id=node_id,
        )

    def sync_workspace(self, session: Session, placement: Placement, environment: WorkerEnvironment) -> WorkspaceSync:
        node_id = node_of(environment)
        root = session_workspace_root(session)
        if node_speaks_openclaw(node_id):
            return openclaw_workspace.sync_workspace(node_id, root, session, environment)
        try:
            manifest = build_manifest(root) if root is not None and root.is_dir() else []
        except WorkspaceError as error:
            raise WorkerProviderError(f"session workspace cannot be synced: {error}") from None
        ref = manifest_ref(manifest)
        params = {
            "environmentId": environment.pk,
            "leaseId": environment.lease_id,
            "sessionId": session.session_id,
            "manifestRef": ref,
            "manifest": manifest,
        }
        by_digest = {entry["sha256"]: entry["path"] for entry in manifest}
        answer = self._prepare(node_id, params)
        for _round in range(SYNC_ROUNDS):
            if answer.get("status") != "missing":
                break
            missing = answer.get("missing")
            if not isinstance(missing, list) or not missing or any(digest not in by_digest for digest in missing):
                raise WorkerProviderError("worker node asked for content outside the workspace manifest")
            for batch in _blob_batches(root, by_digest, missing):
                answer = self._prepare(node_id, {**params, "blobs": batch})
        if answer.get("status") != "ready":
            raise WorkerProviderError("worker node did not confirm the synced workspace")
        WorkspaceManifest.objects.get_or_create(ref=ref, defaults={"manifest": manifest, "created_at_ms": now_ms()})
        return WorkspaceSync(manifest_ref=ref, remote_workspace_dir=str(answer.get("remoteWorkspaceDir") or ""))

    def _prepare(self, node_id: str, params: dict[str, Any]) -> dict[str, Any]:
        try:
            answer = call_node(node_id, "worker.workspace.prepare.v1", params, timeout_ms=SYNC_TIMEOUT_MS)
        except NodeCommandFailed as failure:
            raise node_failure(node_id, failure, "Worker workspace sync failed") from None
        if not isinstance(answer, dict):
            raise WorkerProviderError("worker node answered the workspace sync with an invalid status")
        return answer

    def start(self, session: Session, placement: Placement, environment: WorkerEnvironment) -> None:
        node_id = node_of(environment)
        if node_speaks_openclaw(node_id):
            return  # OpenClaw's node starts a worker per turn: activation asks nothing of it
        try:
            status = call_node(node_id, "worker.status.v1", {})
        except NodeCommandFailed as failure:
            raise node_failure(node_id, failure, "Worker start failed") from None
        environments = status.get("environments") if isinstance(status, dict) else None
        if not isinstance(environments, list) or environment.pk not in environments:
            raise WorkerProviderError("Worker start failed: the node does not hold the synced workspace")

    def reconcile_workspace(self, session: Session, placement: Placement, environment: WorkerEnvironment) -> int:
        """Apply the node's changes to the session's worktree; returns how many paths changed."""
        node_id = node_of(environment)
        root = session_workspace_root(session)
        if node_speaks_openclaw(node_id):
            return openclaw_workspace.reconcile_workspace(node_id, root, session, placement, environment)
        base_ref = placement.workspace_base_manifest_ref
        if root is None or not base_ref:
            return 0
        cursor: str | None = None
        manifest: list[dict[str, Any]] | None = None
        blobs: dict[str, bytes] = {}
        received = 0
        for _page in range(EXPORT_MAX_PAGES):
            params: dict[str, Any] = {"environmentId": environment.pk, "baseManifestRef": base_ref}
            if cursor:
                params["cursor"] = cursor
            try:
                answer = call_node(node_id, "worker.workspace.export.v1", params, timeout_ms=SYNC_TIMEOUT_MS)
            except NodeCommandFailed as failure:
                raise node_failure(node_id, failure, "Worker workspace reconcile failed") from None
            if not isinstance(answer, dict) or not isinstance(answer.get("manifest"), list):
                raise WorkerProviderError("worker node answered the workspace export with an invalid manifest")
            manifest = answer["manifest"]
            try:
                for digest, encoded in (answer.get("blobs") or {}).items():
                    blobs[digest] = base64.b64decode(encoded, validate=True)
                    received += len(blobs[digest])
            except (ValueError, AttributeError, TypeError):
                raise WorkerProviderError("worker node exported undecodable workspace content") from None
            if received > MAX_TOTAL_BYTES:
                raise WorkerProviderError(f"worker node exported more than {MAX_TOTAL_BYTES} bytes of content")
            if not answer.get("hasMore"):
                break
            next_cursor = answer.get("cursor")
            if not isinstance(next_cursor, str) or not next_cursor or next_cursor == cursor:
                raise WorkerProviderError("worker node's workspace export has more pages but no new cursor")
            cursor = next_cursor
        else:
            raise WorkerProviderError(f"worker node's workspace export did not end within {EXPORT_MAX_PAGES} pages")
        try:
            return apply_workspace_changes(root, manifest or [], blobs, base_manifest=base_manifest_for(root, base_ref))
        except WorkspaceError as error:
            raise WorkerProviderError(f"worker node exported an invalid workspace: {error}") from None
        except OSError as error:
            raise WorkerProviderError(
                f"the session's worktree could not take the worker's changes: {error.strerror}"
            ) from None

    def stop(self, node_id: str, *, lease_id: str) -> None:
        """Delete the lease's workspace on the node (raises NodeCommandFailed when it cannot be proven); on
        OpenClaw's node, stop its workers (its files go with the next retain snapshot)."""
        if node_speaks_openclaw(node_id):
            environment = WorkerEnvironment.objects.filter(lease_id=lease_id, node_device_id=node_id).first()
            if environment is not None:
                openclaw_stop(node_id, environment)
            return
        call_node(node_id, "worker.environment.stop.v1", {"leaseId": lease_id})


def _blob_batches(root: Path | None, by_digest: dict[str, str], wanted: list[str]) -> Iterator[dict[str, str]]:
    """The wanted blobs, base64, in batches of at most :data:`SYNC_BATCH_BYTES` (one larger blob goes alone)."""
    batch: dict[str, str] = {}
    size = 0
    for digest in wanted:
        try:
            data = (root / by_digest[digest]).read_bytes() if root is not None else b""
        except OSError:
            data = b""  # deleted or replaced since the manifest was made
        if hashlib.sha256(data).hexdigest() != digest:
            raise WorkerProviderError("session workspace changed while syncing; retry the dispatch")
        if batch and size + len(data) > SYNC_BATCH_BYTES:
            yield batch
            batch, size = {}, 0
        batch[digest] = base64.b64encode(data).decode("ascii")
        size += len(data)
    if batch:
        yield batch


def base_manifest_for(root: Path, base_ref: str) -> list[dict[str, Any]]:
    """The manifest synced as ``base_ref``; for a placement synced before manifests were kept, the
    worktree itself if it is still that base, else none (nothing is deleted then)."""
    stored = WorkspaceManifest.objects.filter(ref=base_ref).values_list("manifest", flat=True).first()
    if stored is not None:
        return stored
    local = build_manifest(root)
    return local if manifest_ref(local) == base_ref else []


class SshNodeWorkerRuntime(NodeWorkerRuntime):
    """static-ssh leases: the host's node host is installed and enrolled first (:mod:`workers_app.nodes.ssh`),
    then the environment is brought up on that node like any other."""

    def bootstrap(self, environment: WorkerEnvironment) -> BootstrapReceipt:
        if not environment.node_device_id:
            environment.node_device_id = ensure_ssh_node(environment)  # recorded with the receipt
        return super().bootstrap(environment)


node_runtime = NodeWorkerRuntime()
ssh_node_runtime = SshNodeWorkerRuntime()
