"""Workspaces as content-addressed manifests: the one implementation both the gateway and its node hosts use.

A workspace is the list of its regular files ``[{path, sha256, size, mode}]`` sorted by ``path``
(docs/node-worker-protocol.md, "Paths and content addressing"). Its **ref** is ``sha256:`` plus the
digest of the manifest's canonical JSON, so the gateway and a node agree on "the same workspace"
without comparing files. Content travels separately, as blobs named by their sha256 and kept in a
:class:`BlobStore`; :func:`materialize` turns a manifest plus blobs into a directory, and
:func:`snapshot` turns a directory back into a manifest whose content is in the store.

Stdlib only: this module ships in the worker bundle.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypedDict

MAX_FILES = 50_000
MAX_TOTAL_BYTES = 1 << 30  # 1 GiB of file content
MAX_PATH_BYTES = 4096
EXECUTABLE_MODE = 0o755
REGULAR_MODE = 0o644
FILE_MODES = frozenset({EXECUTABLE_MODE, REGULAR_MODE})
REF_PREFIX = "sha256:"
EXCLUDED_ROOT_ENTRY = ".git"
_CHUNK = 1 << 20
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_ENTRY_KEYS = frozenset({"path", "sha256", "size", "mode"})


class ManifestEntry(TypedDict):
    path: str
    sha256: str
    size: int
    mode: int


Manifest = list[ManifestEntry]


class WorkspaceError(Exception):
    """A workspace that cannot be described, stored or written; the message names no host path."""


class InvalidManifest(WorkspaceError):
    """A manifest that breaks the contract's rules (shape, paths, order, limits)."""


class BlobMismatch(WorkspaceError):
    """Content whose sha256 is not the digest it was stored or read under."""


class BlobMissing(WorkspaceError):
    """Content the store does not hold."""


# --- paths and digests ----------------------------------------------------------------------------


def is_hex_digest(value: object) -> bool:
    """A lowercase hex sha256 (64 characters): the only blob name the store accepts."""
    return isinstance(value, str) and _HEX_DIGEST.fullmatch(value) is not None


def path_problem(path: object) -> str | None:
    """Why ``path`` is not a safe relative POSIX path, or None when it is one.

    Safe: a non-empty string of at most 4,096 UTF-8 bytes, no NUL, no leading ``/``, no empty,
    ``.`` or ``..`` segment. Used for workspace files and for worker bundle members alike, so
    nothing a peer names can be written outside the directory it is meant for.
    """
    if not isinstance(path, str) or not path:
        return "path must be a non-empty string"
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        return "path is not valid UTF-8"
    if len(encoded) > MAX_PATH_BYTES:
        return f"path is longer than {MAX_PATH_BYTES} bytes"
    if "\x00" in path:
        return "path contains NUL"
    if path.startswith("/"):
        return "path is absolute"
    if any(segment in ("", ".", "..") for segment in path.split("/")):
        return "path has an empty, '.' or '..' segment"
    return None


def file_mode(st_mode: int) -> int:
    """The manifest mode of a file: 0o755 when any execute bit is set, else 0o644."""
    return EXECUTABLE_MODE if st_mode & 0o111 else REGULAR_MODE


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hash_stream(source: BinaryIO, sink: BinaryIO | None = None) -> tuple[str, int]:
    """(sha256 hex, size) of what ``source`` yields, copying it to ``sink`` on the way when given."""
    digest = hashlib.sha256()
    size = 0
    while chunk := source.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
        if sink is not None:
            sink.write(chunk)
    return digest.hexdigest(), size


# --- manifests ------------------------------------------------------------------------------------


def _regular_files(root: Path) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """(relative path, entry) of every regular file under ``root``, not following symlinks.

    Iterative, so a deep tree (the path limit allows 2,000 levels) cannot exhaust the recursion limit.
    """
    pending = [""]
    while pending:
        relative = pending.pop()
        with os.scandir(root / relative if relative else root) as entries:
            for entry in entries:
                if not relative and entry.name == EXCLUDED_ROOT_ENTRY:
                    continue
                name = f"{relative}/{entry.name}" if relative else entry.name
                if entry.is_dir(follow_symlinks=False):
                    pending.append(name)
                elif entry.is_file(follow_symlinks=False):
                    yield name, entry


def build_manifest(root: Path) -> Manifest:
    """The manifest of the directory ``root``: its regular files, hashed, sorted by path.

    Symlinks (to files or directories), sockets, devices and the top-level ``.git`` entry are
    left out: they are not workspace content. Raises :class:`WorkspaceError` past the contract's
    limits (files, total size, path length) or for a name that is not valid UTF-8.
    """
    manifest: Manifest = []
    total = 0
    for path, entry in _regular_files(Path(root)):
        problem = path_problem(path)
        if problem is not None:
            raise WorkspaceError(f"workspace file cannot be described: {problem}")
        if len(manifest) >= MAX_FILES:
            raise WorkspaceError(f"workspace has more than {MAX_FILES} files")
        with open(entry.path, "rb") as handle:
            digest, size = _hash_stream(handle)
        total += size
        if total > MAX_TOTAL_BYTES:
            raise WorkspaceError(f"workspace is larger than {MAX_TOTAL_BYTES} bytes")
        mode = file_mode(entry.stat(follow_symlinks=False).st_mode)
        manifest.append({"path": path, "sha256": digest, "size": size, "mode": mode})
    manifest.sort(key=lambda item: item["path"])
    return manifest


def canonical_json(manifest: Manifest) -> bytes:
    """The bytes a ref is the digest of (the contract's exact ``json.dumps`` arguments)."""
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode("utf-8")


def manifest_ref(manifest: Manifest) -> str:
    """``sha256:<hex>`` of the manifest's canonical JSON."""
    return REF_PREFIX + sha256_hex(canonical_json(manifest))


def is_manifest_ref(value: object) -> bool:
    return isinstance(value, str) and value.startswith(REF_PREFIX) and is_hex_digest(value[len(REF_PREFIX) :])


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        return "entry must be an object with exactly path, sha256, size and mode"
    problem = path_problem(entry["path"])
    if problem is not None:
        return problem
    if entry["path"].split("/", 1)[0] == EXCLUDED_ROOT_ENTRY:
        return "path is inside the top-level .git entry"
    if not is_hex_digest(entry["sha256"]):
        return "sha256 must be 64 lowercase hex digits"
    size = entry["size"]
    if type(size) is not int or size < 0:
        return "size must be a non-negative integer"
    if type(entry["mode"]) is not int or entry["mode"] not in FILE_MODES:
        return "mode must be 0o644 (420) or 0o755 (493)"
    return None


def validate_manifest(manifest: Any) -> Manifest:
    """``manifest`` itself once it is a valid manifest; raises :class:`InvalidManifest` otherwise.

    Strict: exact entry keys and types, safe paths, strictly increasing (so unique) paths, no file
    that would have to be a directory for another path, and the contract's limits.
    """
    if not isinstance(manifest, list):
        raise InvalidManifest("manifest must be a list")
    if len(manifest) > MAX_FILES:
        raise InvalidManifest(f"manifest has more than {MAX_FILES} files")
    total = 0
    previous: str | None = None
    for index, entry in enumerate(manifest):
        problem = _entry_problem(entry)
        if problem is not None:
            raise InvalidManifest(f"manifest entry {index}: {problem}")
        if previous is not None and entry["path"] <= previous:
            raise InvalidManifest(f"manifest entry {index}: paths must be sorted and unique")
        previous = entry["path"]
        total += entry["size"]
    if total > MAX_TOTAL_BYTES:
        raise InvalidManifest(f"manifest content is larger than {MAX_TOTAL_BYTES} bytes")
    _check_no_file_is_a_parent(manifest)
    return manifest


def _check_no_file_is_a_parent(manifest: Manifest) -> None:
    files = {entry["path"] for entry in manifest}
    for entry in manifest:
        segments = entry["path"].split("/")
        for depth in range(1, len(segments)):
            if "/".join(segments[:depth]) in files:
                raise InvalidManifest(f"manifest path {entry['path']!r} is inside a file")


def digests(manifest: Iterable[ManifestEntry]) -> list[str]:
    """The distinct content digests of a manifest, sorted."""
    return sorted({entry["sha256"] for entry in manifest})


# --- content-addressed blobs ----------------------------------------------------------------------


class BlobStore:
    """Files named by the sha256 of their content under ``root`` (``<root>/<2 hex>/<64 hex>``).

    Every write checks the digest, so a stored blob is always the content its name says; writes go
    through a temporary file and a rename, so a reader never sees half a blob.
    """

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        if not is_hex_digest(digest):
            raise BlobMismatch("blob name is not a sha256 hex digest")
        return self.root / digest[:2] / digest

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def missing(self, wanted: Iterable[str]) -> list[str]:
        """The digests of ``wanted`` the store lacks, sorted and unique."""
        return sorted({digest for digest in wanted if not self.has(digest)})

    def put(self, digest: str, data: bytes) -> None:
        """Store ``data`` as ``digest``; raises :class:`BlobMismatch` when it is other content."""
        target = self.path(digest)
        if sha256_hex(data) != digest:
            raise BlobMismatch(f"blob content does not match its sha256 {digest}")
        if target.is_file():
            return
        with self._temporary(target.parent) as (handle, temporary):
            handle.write(data)
            handle.close()
            os.replace(temporary, target)

    def put_file(self, source: Path) -> tuple[str, int]:
        """Copy the file ``source`` into the store; returns the (sha256, size) of what was copied.

        The digest is computed from the bytes copied, so a file that changes meanwhile is stored
        as the content that was actually read, under that content's name.
        """
        with self._temporary(self.root) as (handle, temporary), open(source, "rb") as reader:
            digest, size = _hash_stream(reader, handle)
            handle.close()
            target = self.path(digest)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(temporary, target)
        return digest, size

    def open(self, digest: str) -> BinaryIO:
        try:
            return open(self.path(digest), "rb")
        except FileNotFoundError:
            raise BlobMissing(f"blob {digest} is not stored") from None

    def read(self, digest: str) -> bytes:
        """The blob's content, checked against its name (a damaged blob raises :class:`BlobMismatch`)."""
        with self.open(digest) as handle:
            data = handle.read()
        if sha256_hex(data) != digest:
            raise BlobMismatch(f"stored blob {digest} is damaged")
        return data

    def delete(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(digest).unlink()

    def stored(self) -> Iterator[Path]:
        """The files of the store (for garbage collection)."""
        if not self.root.is_dir():
            return
        for shard in self.root.iterdir():
            if shard.is_dir() and len(shard.name) == 2:
                yield from (blob for blob in shard.iterdir() if is_hex_digest(blob.name))

    @contextlib.contextmanager
    def _temporary(self, directory: Path) -> Iterator[tuple[BinaryIO, str]]:
        directory.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=".blob-")
        handle = os.fdopen(descriptor, "wb")
        try:
            yield handle, temporary
        finally:
            handle.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)


# --- directories ----------------------------------------------------------------------------------


def _write_file(blob_store: BlobStore, entry: ManifestEntry, target: Path) -> None:
    with blob_store.open(entry["sha256"]) as source, open(target, "xb") as sink:
        digest, size = _hash_stream(source, sink)
    if digest != entry["sha256"] or size != entry["size"]:
        raise BlobMismatch(f"stored blob {entry['sha256']} does not match the manifest")
    os.chmod(target, entry["mode"])


def materialize(manifest: Manifest, blob_store: BlobStore, target_dir: Path) -> None:
    """Write the workspace ``manifest`` describes at ``target_dir``, replacing what is there.

    The files are written into a temporary sibling directory, each checked against its digest,
    and that directory is then renamed into place; an existing workspace is moved aside first and
    deleted after, so a failure leaves the previous workspace as it was. Raises
    :class:`BlobMissing` / :class:`BlobMismatch` for absent or damaged content.
    """
    target_dir = Path(target_dir)
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target_dir.parent, prefix=f".{target_dir.name}.new-"))
    try:
        for entry in manifest:
            destination = staging / entry["path"]
            destination.parent.mkdir(parents=True, exist_ok=True)
            _write_file(blob_store, entry, destination)
        replace_directory(staging, target_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def replace_directory(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target``, moving an existing ``target`` aside and deleting it after."""
    aside: Path | None = None
    if target.exists() or target.is_symlink():
        aside = target.with_name(f".{target.name}.old-{uuid.uuid4().hex}")
        os.rename(target, aside)
    try:
        os.rename(source, target)
    except BaseException:
        if aside is not None:
            os.rename(aside, target)
        raise
    if aside is not None:
        remove_tree(aside)


def remove_tree(path: Path) -> None:
    """Delete a directory tree (or a file or link) if it exists."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, onexc=_make_writable_and_retry)


def _make_writable_and_retry(function: Any, path: str, _error: BaseException) -> None:
    # A worker may have left a read-only directory behind; its owner may still delete it.
    with contextlib.suppress(OSError):
        parent = os.path.dirname(path)
        os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        function(path)


def snapshot(root: Path, blob_store: BlobStore) -> Manifest:
    """The manifest of ``root`` with all of its content in ``blob_store`` (an export's consistent view).

    Content the store lacks is copied in, and each such entry is rewritten from the bytes actually
    copied: a file that changed after it was hashed is described as the content that was stored, so
    the manifest never names a blob the store does not hold.
    """
    manifest = build_manifest(root)
    for entry in manifest:
        if blob_store.has(entry["sha256"]):
            continue
        try:
            entry["sha256"], entry["size"] = blob_store.put_file(Path(root) / entry["path"])
        except FileNotFoundError:
            raise WorkspaceError("a workspace file disappeared while it was exported") from None
    if sum(entry["size"] for entry in manifest) > MAX_TOTAL_BYTES:
        raise WorkspaceError(f"workspace is larger than {MAX_TOTAL_BYTES} bytes")
    return manifest


def changed_digests(manifest: Manifest, base: Manifest | None) -> list[str]:
    """The digests of ``manifest`` absent from ``base`` (all of them without a base), sorted."""
    known = {entry["sha256"] for entry in base or ()}
    return [digest for digest in digests(manifest) if digest not in known]


@dataclass(frozen=True)
class ExportPage:
    """One answer's worth of blobs: their content by digest, and where the next page starts (None: last)."""

    blobs: dict[str, bytes]
    next_offset: int | None


def export_page(
    manifest: Manifest, wanted: list[str], blob_store: BlobStore, *, offset: int, budget: int
) -> ExportPage:
    """The blobs ``wanted[offset:]`` that fit in ``budget`` bytes of content, read (and checked) from the store.

    A page holds at least one blob, so a file larger than the budget still travels, alone.
    """
    sizes = {entry["sha256"]: entry["size"] for entry in manifest}
    end, used = offset, 0
    while end < len(wanted) and (end == offset or used + sizes[wanted[end]] <= budget):
        used += sizes[wanted[end]]
        end += 1
    blobs = {digest: blob_store.read(digest) for digest in wanted[offset:end]}
    return ExportPage(blobs=blobs, next_offset=end if end < len(wanted) else None)


def encode_blobs(blobs: dict[str, bytes]) -> dict[str, str]:
    """``{sha256: base64}``, as the protocol carries content."""
    return {digest: base64.b64encode(data).decode("ascii") for digest, data in blobs.items()}


def decode_blobs(value: Any) -> dict[str, bytes]:
    """The content of a ``{sha256: base64}`` map; raises :class:`InvalidManifest` for a malformed one.

    The digests are only checked for shape here; :meth:`BlobStore.put` checks them against the content.
    """
    if not isinstance(value, dict):
        raise InvalidManifest("blobs must be an object of sha256 to base64 content")
    decoded: dict[str, bytes] = {}
    for digest, text in value.items():
        if not is_hex_digest(digest) or not isinstance(text, str):
            raise InvalidManifest("blobs must map sha256 hex digests to base64 strings")
        try:
            decoded[digest] = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidManifest(f"blob {digest} is not valid base64") from None
    return decoded
