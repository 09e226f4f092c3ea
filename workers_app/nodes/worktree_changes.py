"""The session's worktree and the changes a worker made to its copy of it (both dialects): where a placed
session's workspace comes from, and the 3-way apply of what the node changed (:func:`apply_workspace_changes`).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from openclaw_client.workspace import build_manifest, validate_manifest
from sessions_app.models import Session

from ..providers import WorkerProviderError

logger = logging.getLogger(__name__)


def session_workspace_root(session: Session) -> Path | None:
    """The directory a placed session's workspace comes from: its managed worktree (None: no workspace)."""
    worktree = session.worktree or {}
    path = worktree.get("path")
    return Path(path) if path else None


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["sha256"] == b["sha256"] and a["mode"] == b["mode"]


def _inside(root: Path, relative: str) -> Path:
    """``root / relative``, refusing a path that passes through a symbolic link of the worktree (the node
    never saw those links: writing through one would write outside the worktree)."""
    current = root
    for part in relative.split("/")[:-1]:
        current = current / part
        if current.is_symlink():
            raise WorkerProviderError(
                f"worker node exported a path through a symbolic link of the worktree: {relative}"
            )
    target = root / relative
    return target


def apply_workspace_changes(
    root: Path, remote_manifest: list[dict[str, Any]], blobs: dict[str, bytes], *, base_manifest: list[dict[str, Any]]
) -> int:
    """Bring the node's changes since ``base_manifest`` (what was synced) into the worktree at ``root``;
    returns how many paths changed.

    Only what the node changed moves: a file it left as synced keeps the worktree's copy (changed here or
    not); a file it changed or added is written (its content from the node's blobs, or from the worktree
    when the node renamed or copied a file it already had); a file it deleted is deleted only if the
    worktree still holds it as synced. Where both sides changed a file the node's version wins (the
    session worked there) and the overwrite is logged. Everything is planned, its content and the shape of the
    paths it writes checked, before the first write; a path through a symbolic link of the worktree is refused.
    """
    validate_manifest(remote_manifest)
    local = build_manifest(root)
    local_by_path = {entry["path"]: entry for entry in local}
    base_by_path = {entry["path"]: entry for entry in base_manifest}
    remote_by_path = {entry["path"]: entry for entry in remote_manifest}
    local_by_digest = {entry["sha256"]: entry["path"] for entry in local}

    writes: list[tuple[dict[str, Any], bytes | None]] = []  # None: same content, new mode only
    for path, entry in remote_by_path.items():
        base, mine = base_by_path.get(path), local_by_path.get(path)
        if (base is not None and _same(base, entry)) or (mine is not None and _same(mine, entry)):
            continue
        if mine is not None and base is not None and not _same(mine, base):
            logger.warning("worktree %s: %s changed on both sides; the worker's version is kept", root, path)
        if mine is not None and mine["sha256"] == entry["sha256"]:
            writes.append((entry, None))
            continue
        data = blobs.get(entry["sha256"])
        if data is None and entry["sha256"] in local_by_digest:
            data = (root / local_by_digest[entry["sha256"]]).read_bytes()
        if data is None or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise WorkerProviderError("worker node exported a workspace without the content of a changed file")
        writes.append((entry, data))
    deletes = []
    for path, base in base_by_path.items():
        if path in remote_by_path:
            continue
        mine = local_by_path.get(path)
        if mine is not None and _same(mine, base):
            deletes.append(path)
        elif mine is not None:
            logger.warning("worktree %s: %s was deleted on the worker but changed here; kept", root, path)
    targets = {path: _inside(root, path) for path in [*deletes, *(entry["path"] for entry, _ in writes)]}
    _check_shapes(local_by_path, set(deletes), [entry["path"] for entry, data in writes if data is not None])

    for path in deletes:
        targets[path].unlink(missing_ok=True)
        _prune_empty_parents(root, targets[path].parent)
    for entry, data in writes:
        target = targets[entry["path"]]
        if data is None:
            target.chmod(entry["mode"])
            continue
        if target.is_dir() and not target.is_symlink():
            if any(target.iterdir()):
                raise WorkerProviderError(
                    f"worker node turned {entry['path']} into a file, but the worktree holds files under it"
                )
            target.rmdir()
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise WorkerProviderError(
                f"worker node put {entry['path']} under a path the worktree holds as a file"
            ) from None
        temporary = target.with_name(f".{target.name}.openclaw-sync")
        try:
            temporary.write_bytes(data)
            temporary.chmod(entry["mode"])
            temporary.replace(target)
        finally:
            temporary.unlink(missing_ok=True)
    return len(deletes) + len(writes)


def _check_shapes(local_by_path: dict[str, Any], deleted: set[str], written: list[str]) -> None:
    """Refuse, before the first write, a file the worktree cannot take where it stands: one that replaces a directory
    still holding files after the planned deletes, or one under a path the worktree keeps as a file."""
    kept = [path for path in local_by_path if path not in deleted]
    for path in written:
        if any(other.startswith(path + "/") for other in kept):
            raise WorkerProviderError(f"worker node turned {path} into a file, but the worktree holds files under it")
        parts = path.split("/")
        for depth in range(1, len(parts)):
            ancestor = "/".join(parts[:depth])
            if ancestor in local_by_path and ancestor not in deleted:
                raise WorkerProviderError(f"worker node put {path} under a path the worktree holds as a file")


def _prune_empty_parents(root: Path, directory: Path) -> None:
    """Remove directories a deletion left empty, up to (not including) the root."""
    while directory != root and directory.is_dir() and not directory.is_symlink() and not any(directory.iterdir()):
        directory.rmdir()
        directory = directory.parent
