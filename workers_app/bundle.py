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

from gateway.protocol import SERVER_VERSION

PACKAGES = ("openclaw_client",)
MANIFEST_NAME = "openclaw-worker-bundle.json"
REQUIREMENTS_NAME = "requirements.txt"
SOURCE_ROOT = Path(__file__).resolve().parent.parent
LOCK_FILE = SOURCE_ROOT / "requirements.lock"
# What openclaw_client needs besides the standard library, with what those need in turn; a host
# that runs the bundle outside this checkout installs them from the bundle's requirements.txt.
RUNTIME_PACKAGES = ("websockets", "cryptography", "cffi", "pycparser")


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


def runtime_requirements(lock: Path = LOCK_FILE) -> str:
    """The :data:`RUNTIME_PACKAGES` entries of the lock, hashes included (``pip install --require-hashes``)."""
    blocks: list[list[str]] = []
    for line in lock.read_text(encoding="utf-8").splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            blocks.append([line])
        elif blocks and line.strip().startswith("--hash"):
            blocks[-1].append(line)
    wanted = [block for block in blocks if block[0].split("==")[0].strip().lower() in RUNTIME_PACKAGES]
    found = {block[0].split("==")[0].strip().lower() for block in wanted}
    if found != set(RUNTIME_PACKAGES):
        raise RuntimeError(f"{lock.name} does not pin {sorted(set(RUNTIME_PACKAGES) - found)}")
    return "".join(
        line.rstrip(" \\") + (" \\\n" if i < len(block) - 1 else "\n")
        for block in wanted
        for i, line in enumerate(block)
    )


def bundle_bytes(root: Path = SOURCE_ROOT, *, version: str = SERVER_VERSION) -> bytes:
    """The archive of ``root``'s packages; equal sources give equal bytes."""
    files = _sources(root)
    names = [path.relative_to(root).as_posix() for path in files]
    manifest = {
        "name": "openclaw-worker",
        "version": version,
        "entry": "openclaw_client.node",
        "files": names,
        "requirements": REQUIREMENTS_NAME,
    }
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=9) as compressed:
        with tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive:
            archive.addfile(*_entry(MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True).encode()))
            archive.addfile(*_entry(REQUIREMENTS_NAME, runtime_requirements(root / LOCK_FILE.name).encode()))
            for name, path in zip(names, files, strict=True):
                archive.addfile(*_entry(name, path.read_bytes()))
    return buffer.getvalue()


def bundle_file_keep(directory: Path, name: str, data: bytes) -> Path:
    """``directory/name`` holding ``data`` (a content-addressed name: written once, kept)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if not path.exists() or path.stat().st_size != len(data):
        # Another process may write the same name at the same time: same bytes, atomic rename.
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".bundle-")
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    return path


@functools.cache
def current_bundle() -> WorkerBundle:
    """This gateway's bundle, built once per process and kept (content-addressed) under the state dir."""
    data = bundle_bytes()
    digest = hashlib.sha256(data).hexdigest()
    path = bundle_file_keep(Path(settings.STATE_DIR) / "worker-bundles", f"{digest}.tar.gz", data)
    return WorkerBundle(sha256=digest, version=SERVER_VERSION, size=len(data), path=path)
