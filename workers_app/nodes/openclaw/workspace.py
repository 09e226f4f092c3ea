"""A session's workspace on OpenClaw's node host (node-worker-dialect.md §1.4, §1.9, §3.4): synced and
reconciled with ``worker.workspace.exec.v1`` transfers, the bytes over this gateway's
``/__openclaw__/worker-transfer/v1/…`` routes (:mod:`.transfer_http`).

* sync (dispatch stage ``syncing``): the worktree's manifest v1 (:mod:`.manifest`) is kept as a
  ``WorkspaceManifest`` under its OpenClaw ref (its files in the project's form: what ``base_manifest_for``
  and the 3-way apply read), a download operation is opened, and the node is told to pull it; it fetches the
  manifest and each file, materializes them, captures them and answers the same ref and its ``workspaceDir``;
* reconcile (a move back): an upload operation is opened against the synced ref; the node POSTs its base and
  current manifests with the changed files, the route applies them to the worktree (3-way, as in the project's
  dialect) and answers the current ref, which the node echoes.

An operation is a transfer token (:mod:`.tokens`: purpose and environment) plus what it may serve or take,
kept in the shared cache for as long as the token lives: the environment's owner epoch, the session, the
manifest ref, and for a download the files by digest. A route serves an operation only while its environment
keeps that owner epoch and the session's placement is on it (a download: still syncing). What a route found
wrong (a file that changed since it was listed, an upload refused) is kept as the operation's outcome, so the
driver reports it instead of the node's generic transfer failure.

The workspace's ``generation`` on the node is the owner epoch the session holds there once attached: the
environment's epoch plus one at sync (the attach that follows takes it), which is the ``ownerEpoch`` a launch
names and OpenClaw's node requires of the launch's ``workspaceDir`` (``…/workspaces/<env>/<session>/<epoch>``,
at least 1); a reconcile names the generation of the directory it was synced to.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from django.core.cache import cache

from gateway.invoke import NodeCommandFailed
from gateway.selectors import now_ms
from openclaw_client.workspace import WorkspaceError, build_manifest
from sessions_app.models import Session

from ...models import TERMINAL_ENVIRONMENT_STATES, Placement, PlacementState, WorkerEnvironment, WorkspaceManifest
from ...providers import WorkerProviderError
from ...runtimes import WorkspaceSync
from ..worktree_changes import apply_workspace_changes
from . import manifest as oc_manifest
from .calls import call_openclaw, openclaw_failure
from .dialect import gateway_namespace, node_session_id
from .tokens import transfer_token_mint, transfer_token_revoke, transfer_token_take
from .upload import TransferInvalid, TransferTooLarge, read_upload

logger = logging.getLogger(__name__)

EXEC_COMMAND = "worker.workspace.exec.v1"
TRANSFER_ARGV = ["openclaw-internal-workspace-transfer"]
DOWNLOAD = "download"
UPLOAD = "upload"
# OpenClaw's transfer deadline (TRANSFER_TIMEOUT_MS), given to the node; the call waits a little longer.
TRANSFER_TIMEOUT_MS = 600_000
EXEC_WAIT_MS = TRANSFER_TIMEOUT_MS + 30_000
OPERATION_TTL_S = EXEC_WAIT_MS // 1000 + 30
MAX_DIR_CHARS = 4096  # OpenClaw's bound of an exec result's workspaceDir
READ_BYTES = 1 << 20
KEY_PREFIX = "workers:openclaw:transfer-operation:"

CHANGED_WHILE_SYNCING = "the session's workspace changed while syncing ({path}); retry the dispatch"


@dataclass(frozen=True)
class TransferOperation:
    direction: str
    environment_id: str
    session_pk: int
    owner_epoch: int
    manifest_ref: str  # a download's manifest, an upload's base

    @property
    def purpose(self) -> str:
        return f"openclaw-workspace-{self.direction}:{self.manifest_ref}"


@dataclass(frozen=True)
class Authorized:
    """An operation a route may serve now, with the worktree it reads or writes (None: the session has none)."""

    token: str
    operation: TransferOperation
    root: Path | None


def _key(token: str, *parts: str) -> str:
    return KEY_PREFIX + ":".join([hashlib.sha256(token.encode()).hexdigest(), *parts])


def _blob_key(token: str, digest: str) -> str:
    return _key(token, "blob", digest)


def _outcome_key(token: str) -> str:
    return _key(token, "outcome")


def _operation_open(operation: TransferOperation, *, single_use: bool, files: list[dict[str, Any]]) -> str:
    token = transfer_token_mint(
        operation.purpose, operation.environment_id, ttl_s=OPERATION_TTL_S, single_use=single_use
    )
    cache.set(_key(token), operation.__dict__, timeout=OPERATION_TTL_S)
    by_digest: dict[str, list[str]] = {}
    for entry in files:
        by_digest.setdefault(entry["sha256"], []).append(entry["path"])
    cache.set_many({_blob_key(token, digest): paths for digest, paths in by_digest.items()}, timeout=OPERATION_TTL_S)
    return token


def _operation_close(token: str, files: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Revoke the operation; its outcome, if a route recorded one."""
    outcome = cache.get(_outcome_key(token))
    transfer_token_revoke(token)
    cache.delete_many([_key(token), _outcome_key(token), *{_blob_key(token, entry["sha256"]) for entry in files}])
    return outcome if isinstance(outcome, dict) else None


def _record_outcome(token: str, outcome: dict[str, Any]) -> None:
    cache.set(_outcome_key(token), outcome, timeout=OPERATION_TTL_S)


def authorize(token: str, environment_id: str, direction: str, manifest_hex: str | None = None) -> Authorized | None:
    """The operation ``token`` opened on ``environment_id`` for ``direction`` (and this manifest, when the route
    names one), if it is still current; None otherwise (the route's opaque 404). A single-use token is
    consumed here, once everything else holds."""
    record = cache.get(_key(token))
    if not isinstance(record, dict) or record.get("environment_id") != environment_id:
        return None
    try:
        operation = TransferOperation(**record)
    except TypeError:
        return None
    if operation.direction != direction:
        return None
    if manifest_hex is not None and oc_manifest.ref_hex(operation.manifest_ref) != manifest_hex:
        return None
    environment = WorkerEnvironment.objects.filter(pk=environment_id).first()
    if environment is None or environment.state in TERMINAL_ENVIRONMENT_STATES:
        return None
    if environment.owner_epoch != operation.owner_epoch:
        return None  # the environment changed hands since the operation was opened
    placement = Placement.objects.select_related("session").filter(pk=operation.session_pk).first()
    if placement is None or placement.environment_id != environment_id:
        return None
    if direction == DOWNLOAD and placement.state != PlacementState.SYNCING:
        return None
    if not transfer_token_take(token, operation.purpose, environment_id):
        return None
    worktree = (placement.session.worktree or {}).get("path")
    return Authorized(token=token, operation=operation, root=Path(worktree) if worktree else None)


# --- what the routes serve and take -----------------------------------------------------------------


def served_manifest(authorized: Authorized) -> bytes | None:
    """The download's manifest bytes (made again from the stored files: the serializer is deterministic)."""
    ref = authorized.operation.manifest_ref
    files = WorkspaceManifest.objects.filter(ref=ref).values_list("manifest", flat=True).first()
    if files is None:
        return None
    raw = oc_manifest.serialize(files)
    if oc_manifest.manifest_ref(raw) != ref:
        logger.error("workspace manifest %s no longer serializes to its ref; not served", ref)
        return None
    return raw


def _open_in_worktree(root: Path, relative: str) -> BinaryIO:
    """``root/relative`` opened for reading, never through a symbolic link, only if it is a regular file."""
    parts = PurePosixPath(relative).parts
    directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
            os.close(directory)
            directory = inner
        descriptor = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=directory)
    finally:
        os.close(directory)
    handle = os.fdopen(descriptor, "rb")
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        raise OSError("not a regular file")
    return handle


def _digest_of(handle: BinaryIO) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := handle.read(READ_BYTES):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


@dataclass(frozen=True)
class Blob:
    handle: BinaryIO  # rewound
    size: int
    path: str


def open_blob(authorized: Authorized, digest: str) -> Blob | None:
    """A file of the download with content ``digest``, as it still is in the worktree. None when the download's
    manifest has no such file (the route's opaque 404), or when none of its files holds it any more (then the
    operation's outcome says which changed, and the sync fails with that)."""
    paths = cache.get(_blob_key(authorized.token, digest))
    if not isinstance(paths, list) or not paths:
        return None
    for relative in paths if authorized.root is not None else []:
        try:
            handle = _open_in_worktree(authorized.root, relative)
        except OSError:
            continue
        try:
            found, size = _digest_of(handle)
        except BaseException:
            handle.close()
            raise
        if found == digest:
            handle.seek(0)
            return Blob(handle, size, relative)
        handle.close()
    _record_outcome(authorized.token, {"error": CHANGED_WHILE_SYNCING.format(path=paths[0])})
    return None


def blob_chunks(blob: Blob, digest: str, authorized: Authorized) -> Iterator[bytes]:
    """The file's bytes as served; the digest is checked again as they go (a change mid-read is recorded)."""
    check, sent = hashlib.sha256(), 0
    with blob.handle:
        while sent < blob.size and (chunk := blob.handle.read(min(READ_BYTES, blob.size - sent))):
            check.update(chunk)
            sent += len(chunk)
            yield chunk
    if sent != blob.size or check.hexdigest() != digest:
        _record_outcome(authorized.token, {"error": CHANGED_WHILE_SYNCING.format(path=blob.path)})


def receive_reconcile(
    authorized: Authorized, read_chunk: Callable[[], bytes], *, content_type: str | None, content_length: int | None
) -> dict:
    """Read a node's reconcile upload, verify all of it, then apply it to the worktree; the answer the node
    expects (``{manifestRef}`` of its current manifest). Raises :class:`TransferInvalid` or
    :class:`TransferTooLarge`; nothing is written to the worktree unless the whole upload verified."""
    root = authorized.root
    try:
        if root is None or not root.is_dir():
            raise TransferInvalid("staging", "the session has no worktree to take the worker's changes")
        with tempfile.TemporaryDirectory(prefix="openclaw-reconcile-") as staging:
            upload = read_upload(
                read_chunk,
                content_type=content_type,
                content_length=content_length,
                base_ref=authorized.operation.manifest_ref,
                staging=Path(staging),
            )
            try:
                changed = apply_workspace_changes(
                    root, upload.current.files(), upload.blobs(), base_manifest=upload.base.files()
                )
            except WorkspaceError as error:
                message = f"worker node uploaded a workspace this gateway refuses: {error}"
                raise TransferInvalid("staging", message) from None
            except WorkerProviderError as error:
                raise TransferInvalid("staging", error.message) from None
            except OSError as error:
                message = f"the session's worktree could not take the worker's changes: {error.strerror}"
                raise TransferInvalid("staging", message) from None
    except (TransferInvalid, TransferTooLarge) as refused:
        _record_outcome(authorized.token, {"error": f"the worker node's upload was refused: {refused}"})
        raise
    _record_outcome(authorized.token, {"manifestRef": upload.current.ref, "changed": changed})
    return {"manifestRef": upload.current.ref}


# --- the drivers (dispatch and move threads) --------------------------------------------------------


def _exec_params(session_id: str, environment: WorkerEnvironment, generation: int, transfer: dict) -> dict:
    return {
        "gatewayNamespace": gateway_namespace(),
        "environmentId": environment.pk,
        "sessionId": session_id,
        "generation": generation,
        "argv": TRANSFER_ARGV,
        "timeoutMs": TRANSFER_TIMEOUT_MS,
        "transfer": transfer,
    }


def _run_transfer(
    node_id: str, params: dict, token: str, files: list[dict[str, Any]], what: str
) -> tuple[Any, dict[str, Any] | None]:
    """The exec's result and the operation's outcome, the operation closed whatever happens; a failure the
    routes recorded is reported rather than the node's generic transfer failure."""
    try:
        result = call_openclaw(node_id, EXEC_COMMAND, params, timeout_ms=EXEC_WAIT_MS)
    except NodeCommandFailed as failure:
        outcome = _operation_close(token, files)
        if outcome and outcome.get("error"):
            raise WorkerProviderError(f"{what}: {outcome['error']}") from None
        raise openclaw_failure(node_id, failure, what) from None
    except BaseException:
        _operation_close(token, files)
        raise
    return result, _operation_close(token, files)


def _transferred_dir(result: Any, ref: str, what: str) -> str:
    """The ``workspaceDir`` of a transfer's exec result that names ``ref``; raises otherwise."""
    if (
        not isinstance(result, dict)
        or result.get("termination") != "exit"
        or result.get("code") != 0
        or not isinstance(result.get("stdout"), str)
        or result["stdout"].strip() != ref
    ):
        raise WorkerProviderError(f"{what}: the node did not confirm workspace {ref}")
    workspace_dir = result.get("workspaceDir")
    if not isinstance(workspace_dir, str) or not workspace_dir.startswith("/") or len(workspace_dir) > MAX_DIR_CHARS:
        raise WorkerProviderError(f"{what}: the node answered an invalid workspace directory")
    return workspace_dir


def sync_workspace(node_id: str, root: Path | None, session: Session, environment: WorkerEnvironment) -> WorkspaceSync:
    """Bring the session's worktree (or an empty workspace) onto the node; the synced ref and the node's
    ``workspaceDir`` for it."""
    what = "Worker workspace sync failed"
    try:
        files = oc_manifest.transferable_files(build_manifest(root)) if root is not None and root.is_dir() else []
        raw = oc_manifest.serialize(files)
    except (WorkspaceError, oc_manifest.ManifestTooLarge) as error:
        raise WorkerProviderError(f"session workspace cannot be synced: {error}") from None
    ref = oc_manifest.manifest_ref(raw)
    # Stored before the node asks (the manifest route serves it), and fresh: the prune spares it while it syncs.
    WorkspaceManifest.objects.update_or_create(ref=ref, defaults={"manifest": files, "created_at_ms": now_ms()})
    operation = TransferOperation(DOWNLOAD, environment.pk, session.pk, environment.owner_epoch, ref)
    token = _operation_open(operation, single_use=False, files=files)
    generation = environment.owner_epoch + 1  # the epoch the attach after this sync gives the session
    transfer = {"direction": DOWNLOAD, "token": token, "manifestRef": ref}
    # Synced under the session's id now; the attach that follows records it as the environment's
    # ``workspace_session_id``, which every later command names (a reset does not change it).
    params = _exec_params(session.session_id, environment, generation, transfer)
    result, _outcome = _run_transfer(node_id, params, token, files, what)
    return WorkspaceSync(manifest_ref=ref, remote_workspace_dir=_transferred_dir(result, ref, what))


def synced_generation(placement: Placement) -> int | None:
    """The generation of the node's directory the placement's workspace was synced to (its last component)."""
    tail = PurePosixPath(placement.remote_workspace_dir or "").name
    if tail.isascii() and tail.isdigit() and len(tail) <= 15:
        return int(tail)
    return placement.active_owner_epoch


def _synced_under(placement: Placement, session_id: str) -> bool:
    """Whether the node's directory of the placement is the one of ``session_id`` (``…/<sha256[:32]>/<gen>``)."""
    parts = PurePosixPath(placement.remote_workspace_dir or "").parts
    return len(parts) < 2 or parts[-2] == hashlib.sha256(session_id.encode()).hexdigest()[:32]


def reconcile_workspace(
    node_id: str, root: Path | None, session: Session, placement: Placement, environment: WorkerEnvironment
) -> int:
    """Apply the node's changes since the synced manifest to the worktree; how many paths changed. The node is
    asked for the workspace by the session id it was synced under (the session's id before any reset)."""
    what = "Worker workspace reconcile failed"
    base_ref = placement.workspace_base_manifest_ref
    generation = synced_generation(placement)
    if root is None or not base_ref or generation is None:
        return 0
    session_id = node_session_id(environment)
    if session_id is None or not _synced_under(placement, session_id):
        # OpenClaw's node keeps the workspace under a digest of the session id it was synced with.
        raise WorkerProviderError(f"{what}: the node's workspace is not the one this session was synced to")
    operation = TransferOperation(UPLOAD, environment.pk, session.pk, environment.owner_epoch, base_ref)
    token = _operation_open(operation, single_use=True, files=[])
    transfer = {"direction": UPLOAD, "token": token, "baseManifestRef": base_ref, "referenceManifestRef": base_ref}
    params = _exec_params(session_id, environment, generation, transfer)
    result, outcome = _run_transfer(node_id, params, token, [], what)
    if not outcome or "manifestRef" not in outcome:
        raise WorkerProviderError(f"{what}: the node finished without uploading its workspace")
    _transferred_dir(result, outcome["manifestRef"], what)
    return int(outcome.get("changed", 0))
