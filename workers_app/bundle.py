"""The worker bundle: the worker runtime this gateway ships to its worker hosts (workers.md §5.3).

The runtime is the Django-free ``openclaw_client`` package (the node host lives there). The bundle
is a reproducible ``.tar.gz`` of its sources plus a manifest: entries sorted, owners and times
zeroed, the gzip header without a time, so the same sources give the same bytes and the same
sha256 on every gateway process and every machine. The sha256 is the bundle's name; nodes report
only ``{status, version}`` of it, never the hash or a path.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from openclaw_site.gateway.protocol import SERVER_VERSION

PACKAGES = ("openclaw_client",)
MANIFEST_NAME = "openclaw-worker-bundle.json"
SOURCE_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class WorkerBundle:
    sha256: str
    version: str
    size: int
    path: Path


def _sources(root: Path) -> list[Path]:
    files = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                files.append(path)
    return files


def _entry(name: str, data: bytes) -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info, io.BytesIO(data)


def bundle_bytes(root: Path = SOURCE_ROOT, *, version: str = SERVER_VERSION) -> bytes:
    """The archive of ``root``'s packages; equal sources give equal bytes."""
    files = _sources(root)
    names = [path.relative_to(root).as_posix() for path in files]
    manifest = {"name": "openclaw-worker", "version": version, "entry": "openclaw_client.node", "files": names}
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=9) as compressed:
        with tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive:
            archive.addfile(*_entry(MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True).encode()))
            for name, path in zip(names, files, strict=True):
                archive.addfile(*_entry(name, path.read_bytes()))
    return buffer.getvalue()


@functools.cache
def current_bundle() -> WorkerBundle:
    """This gateway's bundle, built once per process and kept (content-addressed) under the state dir."""
    data = bundle_bytes()
    digest = hashlib.sha256(data).hexdigest()
    directory = Path(settings.STATE_DIR) / "worker-bundles"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{digest}.tar.gz"
    if not path.exists() or path.stat().st_size != len(data):
        # Another process may write the same name at the same time: same bytes, atomic rename.
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".bundle-")
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    return WorkerBundle(sha256=digest, version=SERVER_VERSION, size=len(data), path=path)
