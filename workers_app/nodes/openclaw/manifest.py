"""OpenClaw's workspace manifest v1 (node-worker-dialect.md §1.4, §3.4): the bytes this gateway serves for a
session's worktree, and the manifests an OpenClaw node uploads.

``{"version":1,"baseCommit":null,"entries":[…]}``: one entry per directory (``{path,type,mode}``, mode 0o700)
and file (``{path,type,mode,size,sha256}``, mode 0o644 or 0o755), keys in that order, sorted by path as
JavaScript compares strings (UTF-16 code units), compact JSON with non-ASCII characters as themselves and no
trailing newline. Its ref is ``sha256:`` + the digest of those raw bytes. The node materializes the manifest,
captures what it wrote with its own script and requires the same ref, so these bytes must be exactly what that
script produces: ``tests/workers_app/test_openclaw_manifest.py`` runs OpenClaw's script on a fixture tree.

What the project carries, and so what is synced, is the worktree's regular files (its internal model,
:mod:`openclaw_client.workspace`); OpenClaw's manifest can also hold symlinks and empty directories, which
are not workspace content here (docs/node-worker-protocol.md, "OpenClaw's workspace transfers"):

* directories are listed only as the parents of the files (an empty directory stays on the gateway);
* symlinks, sockets and devices are left out (as in the project's dialect); a symlink the node uploads is
  validated and then ignored;
* paths OpenClaw derives or refuses are left out: its derived paths (``node_modules``, ``__pycache__``,
  ``*.pyc``, …; the node never captures them) and names with a backslash (its manifest refuses them);
* there is no Git base (``baseCommit`` is always null, no pack): every file travels as a blob.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from openclaw_client.workspace import EXCLUDED_ROOT_ENTRY, Manifest, ManifestEntry, file_mode, path_problem

REF_PREFIX = "sha256:"
DIRECTORY_MODE = 0o700
SYMLINK_MODE = 0o777
# OpenClaw's bounds (workspace-inventory-limits, workspace-manifest): what a manifest may hold and weigh.
MAX_ENTRIES = 250_000
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_PATH_BYTES = 64 * 1024 * 1024
MAX_ELIGIBLE_BYTES = 4 * 1024 * 1024 * 1024
# What one reconcile upload may carry (MAX_RECONCILIATION_*).
MAX_RECONCILIATION_RECORDS = 2 * MAX_ENTRIES
MAX_RECONCILIATION_FILE_BYTES = 64 * 1024 * 1024
MAX_RECONCILIATION_TOTAL_BYTES = 768 * 1024 * 1024
MAX_SAFE_INTEGER = 2**53 - 1

# Paths OpenClaw treats as derived (isDerivedWorkspacePath): never captured by the node, so never served.
DERIVED_DIRECTORY_NAMES = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules"})
DERIVED_FILE_NAMES = frozenset({".DS_Store"})
DERIVED_FILE_SUFFIXES = (".pyc", ".pyo")
UUID_V4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
ATTACHMENT_DIRECTORY = re.compile(r"openclaw-inbound-" + UUID_V4)
SANDBOX_SKILLS = ".openclaw/sandbox-skills"
# A staged task input keeps even derived-looking names, once its directory holds OpenClaw's exact marker.
STAGED_INPUT_PREFIX = "media/inbound/openclaw-staged-"
STAGED_INPUT_IDENTITY = re.compile(r"[a-f0-9]{64}|" + UUID_V4)
STAGED_INPUT_MARKER = b"# Raw task inputs remain private; copy outputs into the project to publish.\n*\n"
STAGED_INPUT_MARKER_SHA256 = hashlib.sha256(STAGED_INPUT_MARKER).hexdigest()
_HEX_DIGEST = re.compile(r"[a-f0-9]{64}")


class ManifestInvalid(Exception):
    """An uploaded manifest that is not OpenClaw's manifest v1 as this gateway accepts it (the message names
    no host path)."""


class ManifestTooLarge(ManifestInvalid):
    """A manifest, or what it says travels, past OpenClaw's bounds."""


# --- paths ------------------------------------------------------------------------------------------


def _staged_directory(path: str) -> str | None:
    if not path.startswith(STAGED_INPUT_PREFIX):
        return None
    identity = path[len(STAGED_INPUT_PREFIX) :].split("/")[0]
    return STAGED_INPUT_PREFIX + identity if STAGED_INPUT_IDENTITY.fullmatch(identity) else None


def staged_directories(entries: Iterable[dict[str, Any]]) -> frozenset[str]:
    """The staged input directories whose marker file is among ``entries``, byte for byte."""
    found = set()
    for entry in entries:
        directory = _staged_directory(entry["path"])
        if (
            directory is not None
            and entry["path"] == f"{directory}/.gitignore"
            and entry.get("type", "file") == "file"
            and entry["size"] == len(STAGED_INPUT_MARKER)
            and entry["sha256"] == STAGED_INPUT_MARKER_SHA256
        ):
            found.add(directory)
    return frozenset(found)


def is_derived(path: str, staged: frozenset[str]) -> bool:
    """OpenClaw's ``isDerivedWorkspacePath``: whether the node leaves ``path`` out of what it captures."""
    if path == SANDBOX_SKILLS or path.startswith(SANDBOX_SKILLS + "/"):
        return True
    if _staged_directory(path) in staged:
        return False
    return any(
        segment in DERIVED_DIRECTORY_NAMES
        or segment in DERIVED_FILE_NAMES
        or segment.endswith(DERIVED_FILE_SUFFIXES)
        or ATTACHMENT_DIRECTORY.fullmatch(segment) is not None
        for segment in path.split("/")
    )


def javascript_order(path: str) -> bytes:
    """The sort key under which Python orders strings as JavaScript's ``<`` does (by UTF-16 code units)."""
    return path.encode("utf-16-be", "surrogatepass")


# --- serving a worktree -----------------------------------------------------------------------------


def transferable_files(files: Manifest) -> Manifest:
    """The worktree's files (the project's manifest of it) that an OpenClaw node can hold and will capture."""
    staged = staged_directories(files)
    return [entry for entry in files if "\\" not in entry["path"] and not is_derived(entry["path"], staged)]


def serialize(files: Manifest) -> bytes:
    """The manifest v1 bytes of ``files`` (already :func:`transferable_files`): every parent directory, then
    the files, sorted as the node's script sorts them."""
    directories = set()
    for entry in files:
        segments = entry["path"].split("/")
        directories.update("/".join(segments[:depth]) for depth in range(1, len(segments)))
    entries: list[dict[str, Any]] = [{"path": p, "type": "directory", "mode": DIRECTORY_MODE} for p in directories]
    entries += [
        {"path": f["path"], "type": "file", "mode": file_mode(f["mode"]), "size": f["size"], "sha256": f["sha256"]}
        for f in files
    ]
    if len(entries) > MAX_ENTRIES:
        raise ManifestTooLarge(f"the workspace has more than {MAX_ENTRIES} entries")
    entries.sort(key=lambda entry: javascript_order(entry["path"]))
    raw = json.dumps(
        {"version": 1, "baseCommit": None, "entries": entries}, ensure_ascii=False, separators=(",", ":")
    ).encode("utf-8")
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestTooLarge("the workspace's manifest is larger than 64 MiB")
    return raw


def manifest_ref(raw: bytes) -> str:
    return REF_PREFIX + hashlib.sha256(raw).hexdigest()


def ref_hex(ref: str) -> str | None:
    """The 64 hex digits of a ``sha256:`` ref, or None when ``ref`` is not one."""
    if isinstance(ref, str) and ref.startswith(REF_PREFIX) and _HEX_DIGEST.fullmatch(ref[len(REF_PREFIX) :]):
        return ref[len(REF_PREFIX) :]
    return None


# --- reading what a node uploads --------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedManifest:
    ref: str
    # Files and symlinks, OpenClaw's derived paths left out, in the manifest's order; modes canonical.
    entries: list[dict[str, Any]]
    directories: frozenset[str]

    def files(self) -> Manifest:
        """The project's manifest of the same workspace: its regular files, sorted as Python sorts."""
        files: Manifest = [
            ManifestEntry(path=e["path"], sha256=e["sha256"], size=e["size"], mode=e["mode"])
            for e in self.entries
            if e["type"] == "file"
        ]
        files.sort(key=lambda entry: entry["path"])
        return files


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _path_of(value: Any) -> str:
    problem = path_problem(value)
    if problem is not None:
        raise ManifestInvalid(f"manifest entry path refused: {problem}")
    if "\\" in value:
        raise ManifestInvalid("manifest entry path refused: it has a backslash")
    if value.split("/", 1)[0] == EXCLUDED_ROOT_ENTRY:
        raise ManifestInvalid("manifest entry path refused: it is inside the top-level .git entry")
    return value


def _safe_integer(value: Any, *, maximum: int) -> bool:
    return type(value) is int and 0 <= value <= maximum


def _entry(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ManifestInvalid("manifest entry is not an object")
    path = _path_of(value.get("path"))
    if not _safe_integer(value.get("mode"), maximum=0o777):
        raise ManifestInvalid("manifest entry has an invalid mode")
    kind = value.get("type")
    if kind == "directory":
        return {"path": path, "type": "directory"}
    if kind == "file":
        size, digest = value.get("size"), value.get("sha256")
        if not _safe_integer(size, maximum=MAX_SAFE_INTEGER) or not isinstance(digest, str):
            raise ManifestInvalid("manifest file entry has invalid metadata")
        if not _HEX_DIGEST.fullmatch(digest):
            raise ManifestInvalid("manifest file entry has invalid metadata")
        return {"path": path, "type": "file", "mode": file_mode(value["mode"]), "size": size, "sha256": digest}
    if kind == "symlink":
        target = value.get("target")
        if not isinstance(target, str) or not target or "\\" in target or "\x00" in target:
            raise ManifestInvalid("manifest symlink entry has an unsafe target")
        if target.startswith("/") or re.match(r"[A-Za-z]:", target):
            raise ManifestInvalid("manifest symlink entry has an unsafe target")
        resolved = posixpath.normpath(posixpath.join("/workspace", posixpath.dirname(path), target))
        if resolved != "/workspace" and not resolved.startswith("/workspace/"):
            raise ManifestInvalid("manifest symlink escapes the workspace")
        return {"path": path, "type": "symlink", "mode": SYMLINK_MODE, "target": target}
    raise ManifestInvalid("manifest entry has an unsupported type")


def parse(raw: bytes, *, expected_ref: str | None = None) -> ParsedManifest:
    """An uploaded manifest, checked as OpenClaw's ``parseWorkerWorkspaceManifest`` checks it (and stricter on
    paths: no backslash, no empty/``.``/``..`` segment, nothing under the top-level ``.git``); raises
    :class:`ManifestInvalid` (:class:`ManifestTooLarge` past the bounds)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestTooLarge("manifest is larger than 64 MiB")
    ref = manifest_ref(raw)
    if expected_ref is not None and ref != expected_ref:
        raise ManifestInvalid("manifest digest does not match its reference")
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ManifestInvalid("manifest is not JSON") from None
    if not isinstance(value, dict) or value.get("version") != 1 or type(value.get("version")) is not int:
        raise ManifestInvalid("manifest has an unsupported shape")
    if value.get("baseCommit") is not None or not isinstance(value.get("entries"), list):
        raise ManifestInvalid("manifest has an unsupported shape (this gateway sends no Git base)")
    if len(value["entries"]) > MAX_ENTRIES:
        raise ManifestTooLarge(f"manifest has more than {MAX_ENTRIES} entries")
    entries = [_entry(item) for item in value["entries"]]
    kinds: dict[str, str] = {}
    previous: bytes | None = None
    path_bytes = eligible_bytes = 0
    for entry in entries:
        path = entry["path"]
        key = javascript_order(path)
        if previous is not None and key <= previous:
            raise ManifestInvalid("manifest paths are not unique and sorted")
        previous = key
        segments = path.split("/")
        if any(kinds.get("/".join(segments[:depth])) != "directory" for depth in range(1, len(segments))):
            raise ManifestInvalid("manifest entry has a parent that is not a directory entry")
        kinds[path] = entry["type"]
        path_bytes += len(path.encode("utf-8"))
        eligible_bytes += entry.get("size", 0) + len(entry.get("target", "").encode("utf-8"))
        if path_bytes > MAX_PATH_BYTES or eligible_bytes > MAX_ELIGIBLE_BYTES:
            raise ManifestTooLarge("manifest is past OpenClaw's byte limits")
    staged = staged_directories(entry for entry in entries if entry["type"] == "file")
    kept = [entry for entry in entries if not is_derived(entry["path"], staged)]
    return ParsedManifest(
        ref=ref,
        entries=[entry for entry in kept if entry["type"] != "directory"],
        directories=frozenset(entry["path"] for entry in kept if entry["type"] == "directory"),
    )


def _same_entry(before: dict[str, Any] | None, after: dict[str, Any]) -> bool:
    if before is None or before["type"] != after["type"]:
        return False
    if after["type"] == "file":
        return all(before[key] == after[key] for key in ("mode", "size", "sha256"))
    return before["target"] == after["target"]


def changed_files(base: ParsedManifest, current: ParsedManifest) -> list[dict[str, Any]]:
    """The files whose bytes an upload carries, in order: every file of ``current`` that is not the same
    entry in ``base`` (OpenClaw's ``workerWorkspaceTransferPaths``, files only: a symlink travels in the
    manifest). Raises :class:`ManifestTooLarge` past what one reconcile may carry."""
    before: dict[str, dict[str, Any]] = {e["path"]: e for e in base.entries}
    before.update((path, {"path": path, "type": "directory"}) for path in base.directories)
    records = sum(1 for path in current.directories if path not in base.directories)
    changed = []
    for entry in current.entries:
        previous = before.pop(entry["path"], None)
        if not _same_entry(previous, entry):
            records += 2 if previous is not None else 1
            if entry["type"] == "file":
                changed.append(entry)
    for path in current.directories:
        before.pop(path, None)
    records += len(before)
    if records > MAX_RECONCILIATION_RECORDS:
        raise ManifestTooLarge(f"the reconcile changes more than {MAX_RECONCILIATION_RECORDS} entries")
    total = 0
    for entry in changed:
        if entry["size"] > MAX_RECONCILIATION_FILE_BYTES:
            raise ManifestTooLarge("a changed file is larger than 64 MiB")
        total += entry["size"]
    if total > MAX_RECONCILIATION_TOTAL_BYTES:
        raise ManifestTooLarge("the changed files weigh more than 768 MiB")
    return changed
