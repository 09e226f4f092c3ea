"""The body an OpenClaw node POSTs to reconcile its workspace (content type :data:`CONTENT_TYPE`; OpenClaw's
``uploadWorkspace`` / ``readNodeWorkspaceUpload``), read as it arrives and checked before anything is kept:

    u32 BE length + the base manifest (the one this gateway served: its digest must be the route's)
    u32 BE length + the node's current manifest
    for each file of the current manifest that is not the same entry in the base, in manifest order:
        u64 BE size (the manifest's) + that many bytes (their sha256 must be the manifest's)

and nothing after. Both manifests are parsed (:func:`manifest.parse`: paths, sizes, counts) before the first
file byte is read; file bytes go to a staging directory outside the worktree, named by their index, never by
the node's path. Refusals are OpenClaw's: :class:`TransferTooLarge` (413 ``workspace_transfer_limit``) and
:class:`TransferInvalid` with one of OpenClaw's reasons (400 ``workspace_transfer_invalid``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import manifest as oc_manifest
from .manifest import ManifestInvalid, ManifestTooLarge, ParsedManifest

CONTENT_TYPE = "application/vnd.openclaw.worker-workspace-reconcile-v1"
MAX_UPLOAD_BYTES = (
    2 * oc_manifest.MAX_MANIFEST_BYTES + oc_manifest.MAX_RECONCILIATION_TOTAL_BYTES + 8 * oc_manifest.MAX_ENTRIES + 8
)
MANIFEST_LENGTH_BYTES = 4
FILE_SIZE_BYTES = 8
MIN_MANIFEST_BYTES = 2
READ_BYTES = 1 << 16


class TransferInvalid(Exception):
    """The upload broke the format; ``reason`` is one of OpenClaw's ``NODE_WORKSPACE_TRANSFER_INVALID_REASONS``."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class TransferTooLarge(Exception):
    """The upload, or something it declares, is past the bounds."""


@dataclass(frozen=True)
class Upload:
    base: ParsedManifest
    current: ParsedManifest
    # The changed files' bytes, verified, by sha256: a file in the staging directory.
    staged: dict[str, Path]

    def blobs(self) -> dict[str, bytes]:
        return {digest: path.read_bytes() for digest, path in self.staged.items()}


class BodyReader:
    """The request body as exact reads over ``read_chunk`` (which answers ``b""`` at the end), counted."""

    def __init__(self, read_chunk: Callable[[], bytes]):
        self._read_chunk = read_chunk
        self._pending = b""
        self._ended = False
        self.bytes_read = 0

    def take(self, at_most: int) -> bytes:
        if not self._pending and not self._ended:
            chunk = self._read_chunk()
            if not isinstance(chunk, bytes):
                raise TransferInvalid("payload", "the upload must be binary data")
            self._pending = chunk
            self._ended = not chunk
        value, self._pending = self._pending[:at_most], self._pending[at_most:]
        self.bytes_read += len(value)
        if self.bytes_read > MAX_UPLOAD_BYTES:
            raise TransferTooLarge("the upload is larger than its byte limit")
        return value

    def exactly(self, count: int) -> bytes:
        parts = []
        remaining = count
        while remaining:
            part = self.take(remaining)
            if not part:
                raise TransferInvalid("premature_eof", "the upload ended before its declared payload")
            parts.append(part)
            remaining -= len(part)
        return b"".join(parts)

    def expect_end(self) -> None:
        if self.take(1):
            raise TransferInvalid("trailing_bytes", "the upload has bytes after its last file")


def _manifest(reader: BodyReader, expected_ref: str | None) -> ParsedManifest:
    length = int.from_bytes(reader.exactly(MANIFEST_LENGTH_BYTES), "big")
    if not MIN_MANIFEST_BYTES <= length <= oc_manifest.MAX_MANIFEST_BYTES:
        raise TransferTooLarge("an uploaded manifest is outside its byte limits")
    raw = reader.exactly(length)
    try:
        return oc_manifest.parse(raw, expected_ref=expected_ref)
    except ManifestTooLarge as error:
        raise TransferTooLarge(str(error)) from None
    except ManifestInvalid as error:
        raise TransferInvalid("manifest", str(error)) from None


def _stage_file(reader: BodyReader, entry: dict, target: Path) -> None:
    if int.from_bytes(reader.exactly(FILE_SIZE_BYTES), "big") != entry["size"]:
        raise TransferInvalid("file_size", f"an uploaded file's size differs from its manifest: {entry['path']}")
    digest = hashlib.sha256()
    remaining = entry["size"]
    with open(target, "xb") as sink:
        while remaining:
            part = reader.take(min(READ_BYTES, remaining))
            if not part:
                raise TransferInvalid("premature_eof", "the upload ended in the middle of a file")
            digest.update(part)
            sink.write(part)
            remaining -= len(part)
    if digest.hexdigest() != entry["sha256"]:
        raise TransferInvalid("file_digest", f"an uploaded file's digest differs from its manifest: {entry['path']}")


def read_upload(
    read_chunk: Callable[[], bytes],
    *,
    content_type: str | None,
    content_length: int | None,
    base_ref: str,
    staging: Path,
) -> Upload:
    """Read and verify a whole reconcile upload; its changed files land in ``staging`` (an empty directory)."""
    if (content_type or "").split(";")[0].strip().lower() != CONTENT_TYPE:
        raise TransferInvalid("payload", f"the upload must be {CONTENT_TYPE}")
    if content_length is None or not FILE_SIZE_BYTES <= content_length <= MAX_UPLOAD_BYTES:
        raise TransferTooLarge("the upload must declare a content-length within its byte limit")
    reader = BodyReader(read_chunk)
    base = _manifest(reader, base_ref)
    current = _manifest(reader, None)
    try:
        changed = oc_manifest.changed_files(base, current)
    except ManifestTooLarge as error:
        raise TransferTooLarge(str(error)) from None
    staged: dict[str, Path] = {}
    for index, entry in enumerate(changed):
        target = staging / str(index)
        _stage_file(reader, entry, target)
        staged.setdefault(entry["sha256"], target)
    reader.expect_end()
    if reader.bytes_read != content_length:
        raise TransferInvalid("content_length", "the upload's length is not its declared content-length")
    return Upload(base=base, current=current, staged=staged)
