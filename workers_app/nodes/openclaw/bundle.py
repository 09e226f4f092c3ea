"""This gateway's worker bundle in OpenClaw's format (node-worker-dialect.md §1.3, §3.3): what OpenClaw's own
node host installs and runs as ``node <bundle>/worker.mjs``.

The bundle is every ``*.mjs`` directly in ``workers_app/openclaw_worker/``, packed as a gzip tar of regular
files only (no directory entries), each at the archive's root with mode 0600: OpenClaw's node extracts with
umask 077 and hashes the extracted tree again, so any other mode would make it refuse its own extraction.
Owners, times and the gzip header carry nothing variable, so the same sources give the same bytes on every
gateway process and machine.

Its name is OpenClaw's *manifest* hash (``bundleHash``: sha256 of ``openclaw-worker-bundle-v1\\0`` and, per
file sorted by path, ``path\\0<octal mode>\\0size\\0sha256\\0``), not the archive's hash; the archive has its
own sha256 and size, which the node checks while downloading.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from gateway.protocol import SERVER_VERSION

from ...bundle import bundle_file_keep

WORKER_SOURCE = Path(__file__).resolve().parents[2] / "openclaw_worker"
MANIFEST_VERSION = "openclaw-worker-bundle-v1"
ENTRY_PATH = "worker.mjs"
FILE_MODE = 0o600
# What the build declares it speaks; OpenClaw's gateway fences builds without both as unable to parse
# its current launch descriptor (``supportsCurrentWorkerLaunch``), and its node runs a build without
# ``worker-lineage-start-v1`` as a plain child process, which is what this worker is.
PROTOCOL_FEATURES = ("worker-execution-context-v2", "worker-execution-authority-v1")
# bootstrap_openclaw_version's column width; OpenClaw allows 128.
VERSION_MAX_LENGTH = 64


@dataclass(frozen=True)
class BundleFile:
    path: str
    mode: int
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class OpenClawBundle:
    bundle_hash: str  # the manifest hash: the bundle's name on the node and in the download path
    openclaw_version: str
    protocol_features: tuple[str, ...]
    tarball_sha256: str
    tarball_bytes: int
    path: Path

    def build(self) -> dict[str, Any]:
        """The build identity: what the install sends and the node's receipt must echo exactly."""
        return {
            "bundleHash": self.bundle_hash,
            "openclawVersion": self.openclaw_version,
            "protocolFeatures": list(self.protocol_features),
        }


def bundle_files(source: Path = WORKER_SOURCE) -> list[BundleFile]:
    """The regular ``*.mjs`` files directly in ``source``, sorted by path (the manifest's order)."""
    files = [
        BundleFile(path=entry.name, mode=FILE_MODE, data=entry.read_bytes())
        for entry in source.iterdir()
        if entry.name.endswith(".mjs") and entry.is_file() and not entry.is_symlink()
    ]
    files.sort(key=lambda file: file.path.encode("utf-8"))
    if ENTRY_PATH not in {file.path for file in files}:
        raise RuntimeError(f"the OpenClaw worker bundle has no {ENTRY_PATH} in {source.name}")
    return files


def manifest_hash(files: list[BundleFile]) -> str:
    """OpenClaw's ``hashWorkerBundleManifest`` over ``files`` (already sorted by path)."""
    digest = hashlib.sha256(f"{MANIFEST_VERSION}\0".encode())
    for file in files:
        digest.update(f"{file.path}\0{file.mode:o}\0{len(file.data)}\0{file.sha256}\0".encode())
    return digest.hexdigest()


def tarball_bytes(files: list[BundleFile]) -> bytes:
    """The archive of ``files``: plain ustar file entries, zeroed owners and times, no gzip time."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=9) as compressed:
        with tarfile.open(fileobj=compressed, mode="w", format=tarfile.USTAR_FORMAT) as archive:
            for file in files:
                info = tarfile.TarInfo(file.path)
                info.type = tarfile.REGTYPE
                info.size, info.mode, info.mtime = len(file.data), file.mode, 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                archive.addfile(info, io.BytesIO(file.data))
    return buffer.getvalue()


def bundle_version(bundle_hash: str) -> str:
    """The build's ``openclawVersion``: this gateway's version and which build of the worker it is."""
    return f"{SERVER_VERSION}+{bundle_hash[:12]}"[:VERSION_MAX_LENGTH]


def build_bundle(source: Path, directory: Path) -> OpenClawBundle:
    """Build the bundle of ``source`` into ``directory`` (kept there by its archive's sha256)."""
    files = bundle_files(source)
    data = tarball_bytes(files)
    bundle_hash = manifest_hash(files)
    tarball_sha256 = hashlib.sha256(data).hexdigest()
    path = bundle_file_keep(directory, f"{tarball_sha256}.tgz", data)
    return OpenClawBundle(
        bundle_hash=bundle_hash,
        openclaw_version=bundle_version(bundle_hash),
        protocol_features=PROTOCOL_FEATURES,
        tarball_sha256=tarball_sha256,
        tarball_bytes=len(data),
        path=path,
    )


@functools.cache
def openclaw_bundle() -> OpenClawBundle:
    """This gateway's OpenClaw-format bundle, built once per process into the state dir."""
    return build_bundle(WORKER_SOURCE, Path(settings.STATE_DIR) / "worker-bundles")
