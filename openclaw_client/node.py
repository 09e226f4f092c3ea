"""The node host: a paired machine's long-running connection to its gateway, hosting its workers.

    python -m openclaw_client.node --gateway ws://gateway:18789 --state-dir ~/.openclaw-node --capacity 4

It keeps its Ed25519 identity (and, once paired, its device token) in the state directory; asks
for pairing and waits until an operator approves it (``manage.py pairing approve <requestId>``);
stays connected, reconnecting with backoff, and closes a connection that stopped ticking; and after
every connect declares its worker host (``node.runnerInventory.update``: capacity, the captured
exec policy) — a declaration is scoped to the connection that made it.

The gateway then drives it with the private worker commands of docs/node-worker-protocol.md: install
the worker bundle, prepare and export workspaces, launch and cancel turns in worker children
(``openclaw_client.worker`` run from the installed bundle), report status, stop environments and
retain what the gateway still needs. State directory layout::

    identity/                 the device identity and token (IdentityStore)
    bundles/<sha256>/         installed worker bundles (a marker file says "complete")
    blobs/<2 hex>/<sha256>    workspace content, by digest (BlobStore)
    workspaces/<environment>/ materialized workspaces
    environments/<environment>.json  what was prepared / exported there (manifests by ref)

A node whose pairing was removed (its connection closed ``4001 device removed``, or a connect refused
``NOT_PAIRED`` while it holds a node token) deletes what it kept for the gateway — workspaces, environment
records, bundles, blobs — and forgets its token, so that nothing of that gateway stays on its disk, also
when it was offline at the removal.

With ``--journal PATH`` it appends what a supervisor (or a test) checks to a JSON-lines file: every
``node.invoke`` it answered with an error, each removal clean-up, and each inventory publish asked for
with ``SIGUSR1`` (republished on the current connection, not a new one).

No Django here: this module is part of the worker bundle the gateway ships to its hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import signal
import ssl
import sys
import tarfile
import tempfile
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import websockets

from .client import (
    ClientOptions,
    ConnectError,
    ConnectionClosed,
    GatewayClient,
    GatewayError,
    NodeCommandError,
    current_invoke,
)
from .identity import IdentityStore
from .workspace import (
    BlobMismatch,
    BlobStore,
    InvalidManifest,
    Manifest,
    WorkspaceError,
    changed_digests,
    decode_blobs,
    digests,
    encode_blobs,
    export_page,
    is_hex_digest,
    is_manifest_ref,
    manifest_ref,
    materialize,
    path_problem,
    remove_tree,
    snapshot,
    validate_manifest,
)

logger = logging.getLogger("openclaw.node")

WORKER_SUPERVISOR_FEATURE = "node-worker-supervisor-v6"
CAPACITY_MAX = 1024
DEFAULT_CAPACITY_WAIT_MS = 10_000
COMMAND_VERSION = 1

INSTALL_COMMAND = "worker.bundle.install.v1"
PREPARE_COMMAND = "worker.workspace.prepare.v1"
EXPORT_COMMAND = "worker.workspace.export.v1"
LAUNCH_COMMAND = "worker.launch.v1"
CANCEL_COMMAND = "worker.cancel.v1"
# The gateway's decision on an exec a running turn asked about (its child waits for it).
APPROVAL_COMMAND = "worker.approval.v1"
STATUS_COMMAND = "worker.status.v1"
STOP_COMMAND = "worker.environment.stop.v1"
RETAIN_COMMAND = "worker.workspace.retain.v1"
# What a node host declares at connect (a pre-approved pairing names the same).
NODE_HOST_COMMANDS = tuple(
    sorted(
        (
            INSTALL_COMMAND,
            PREPARE_COMMAND,
            EXPORT_COMMAND,
            LAUNCH_COMMAND,
            CANCEL_COMMAND,
            APPROVAL_COMMAND,
            STATUS_COMMAND,
            STOP_COMMAND,
            RETAIN_COMMAND,
        )
    )
)
NODE_HOST_CAPS = ("worker-host",)
# Why a gateway asks a node that holds its token to pair again: it is not (or no longer) paired as a node there.
NOT_A_NODE_REASONS = frozenset({"not-paired", "role-upgrade"})
# How a gateway closes a removed device's socket (workers.md §5.4: code 4001, either reason).
REMOVED_CLOSE_CODE = 4001
REMOVED_CLOSE_REASONS = frozenset({"device removed", "client invalidated: device-pair-removed"})

MAX_BUNDLE_BYTES = 256 * 1024 * 1024
MAX_BUNDLE_FILES = 10_000
MAX_BUNDLE_CONTENT_BYTES = 1 << 30
BUNDLE_MANIFEST_NAME = "openclaw-worker-bundle.json"
BUNDLE_WORKER_FILE = "openclaw_client/worker.py"
INSTALLED_MARKER = ".openclaw-bundle-installed.json"
DOWNLOAD_TIMEOUT_S = 60.0

IDLE_WORKER_LIMIT = 2
IDLE_WORKER_TTL_S = 120.0
WORKER_STOP_GRACE_S = 2.0
CANCEL_GRACE_S = 5.0
TURN_GRACE_S = 10.0
PROGRESS_COALESCE_S = 0.005
MAX_TURN_TIMEOUT_MS = 24 * 60 * 60 * 1000
MAX_AGENT_STEPS = 1000
DEFAULT_EXEC_CONCURRENCY = 4
CHILD_LINE_LIMIT = 64 * 1024 * 1024
CHILD_ENVIRONMENT_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR")

EXPORT_PAGE_BYTES = 8 * 1024 * 1024
BLOB_GC_GRACE_S = 15 * 60
MAX_ID_LENGTH = 512
JOURNAL_MAX_BYTES = 8 * 1024 * 1024
_ENVIRONMENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}")


@dataclass(frozen=True)
class NodeHostConfig:
    gateway_url: str
    state_dir: Path
    capacity: int
    capacity_wait_ms: int = DEFAULT_CAPACITY_WAIT_MS
    token: str | None = None
    display_name: str | None = None
    idle_worker_limit: int = IDLE_WORKER_LIMIT
    idle_worker_ttl_s: float = IDLE_WORKER_TTL_S
    # Commands the agents' exec tool runs at once on this host, across all worker children.
    exec_concurrency: int = DEFAULT_EXEC_CONCURRENCY
    # JSON lines of invoke errors, removal clean-ups and asked-for inventory publishes (None: not kept).
    journal_path: Path | None = None


def gateway_http_origin(gateway_url: str) -> str:
    """``http(s)://host:port`` of the gateway a ``ws(s)://`` URL names (its HTTP API shares the origin)."""
    parts = urlsplit(gateway_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ValueError("the gateway URL must be ws:// or wss://")
    return f"{scheme}://{parts.netloc}"


# --- params ---------------------------------------------------------------------------------------


def invalid_request(message: str) -> NodeCommandError:
    return NodeCommandError("INVALID_REQUEST", message)


class Params:
    """A command's params (or an object inside them), read with the contract's checks.

    A refusal is ``INVALID_REQUEST`` naming the command and the field, never echoing a path or a secret.
    """

    def __init__(self, command: str, raw: Any, prefix: str = ""):
        if not isinstance(raw, dict):
            raise invalid_request(f"{command}: {prefix.rstrip('.') or 'params'} must be an object")
        self.command = command
        self.raw = raw
        self.prefix = prefix

    @classmethod
    def of_command(cls, command: str, raw: Any) -> Params:
        """The params of ``command``, whose ``version`` this node must speak (else ``UNSUPPORTED_VERSION``)."""
        params = cls(command, raw)
        version = params.raw.get("version")
        if type(version) is not int:
            raise params.invalid("version", str(COMMAND_VERSION))
        if version != COMMAND_VERSION:
            message = f"{command} version {version} is not supported (this node speaks version {COMMAND_VERSION})"
            raise NodeCommandError("UNSUPPORTED_VERSION", message)
        return params

    def invalid(self, key: str, expectation: str) -> NodeCommandError:
        return invalid_request(f"{self.command}: {self.prefix}{key} must be {expectation}")

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def text(self, key: str, *, max_length: int = MAX_ID_LENGTH) -> str:
        value = self.raw.get(key)
        if not isinstance(value, str) or not value or len(value) > max_length:
            raise self.invalid(key, f"a non-empty string of at most {max_length} characters")
        return value

    def string(self, key: str, *, max_length: int = MAX_ID_LENGTH) -> str:
        """A string that may be empty (a session id the gateway does not know yet is ``""``)."""
        value = self.raw.get(key)
        if not isinstance(value, str) or len(value) > max_length:
            raise self.invalid(key, f"a string of at most {max_length} characters")
        return value

    def optional_text(self, key: str) -> str | None:
        return self.text(key) if self.has(key) else None

    def environment_id(self, key: str = "environmentId") -> str:
        value = self.raw.get(key)
        if not isinstance(value, str) or not _ENVIRONMENT_ID.fullmatch(value):
            raise self.invalid(key, "an environment id (letters, digits, '.', '_', ':', '@', '-'; at most 200)")
        return value

    def digest(self, key: str) -> str:
        value = self.raw.get(key)
        if not is_hex_digest(value):
            raise self.invalid(key, "a sha256 of 64 lowercase hex digits")
        return value

    def manifest_ref(self, key: str) -> str:
        value = self.raw.get(key)
        if not is_manifest_ref(value):
            raise self.invalid(key, "sha256:<64 lowercase hex digits>")
        return value

    def integer(self, key: str, *, minimum: int, maximum: int) -> int:
        value = self.raw.get(key)
        if type(value) is not int or not minimum <= value <= maximum:
            raise self.invalid(key, f"an integer from {minimum} to {maximum}")
        return value

    def digest_list(self, key: str) -> list[str]:
        value = self.raw.get(key)
        if not isinstance(value, list) or not all(is_hex_digest(item) for item in value):
            raise self.invalid(key, "a list of sha256 hex digests")
        return value

    def items(self, key: str) -> list[Params]:
        value = self.raw.get(key)
        if not isinstance(value, list):
            raise self.invalid(key, "a list")
        return [Params(self.command, item, f"{self.prefix}{key}[{index}].") for index, item in enumerate(value)]


# --- worker bundles -------------------------------------------------------------------------------


class BundleInstallError(Exception):
    """Why a bundle could not be installed, in words for people (no host path, no token)."""


def download_bundle(url: str, token: str, size_bytes: int, sink: Path) -> None:
    """Fetch ``url`` into the file ``sink``: at most ``size_bytes`` are read, and exactly that many are expected.

    Plain http.client, so a redirect is never followed with the node's bearer token.
    """
    parts = urlsplit(url)
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(
            parts.netloc, timeout=DOWNLOAD_TIMEOUT_S, context=ssl.create_default_context()
        )
    else:
        connection = http.client.HTTPConnection(parts.netloc, timeout=DOWNLOAD_TIMEOUT_S)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        if response.status != 200:
            raise BundleInstallError(f"the gateway answered HTTP {response.status}")
        _receive(response, size_bytes, sink)
    except (OSError, http.client.HTTPException) as error:
        raise BundleInstallError(f"download failed ({_os_reason(error)})") from None
    finally:
        connection.close()


def _receive(response: http.client.HTTPResponse, size_bytes: int, sink: Path) -> None:
    declared = response.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > size_bytes:
        raise BundleInstallError(f"the download is larger than {size_bytes} bytes")
    received = 0
    with open(sink, "wb") as out:
        while chunk := response.read(1 << 20):
            received += len(chunk)
            if received > size_bytes:
                raise BundleInstallError(f"the download is larger than {size_bytes} bytes")
            out.write(chunk)
    if received != size_bytes:
        raise BundleInstallError(f"the download was {received} bytes, expected {size_bytes}")


def extract_bundle(archive: Path, target: Path) -> dict[str, Any]:
    """Unpack the bundle ``archive`` into the empty directory ``target``; returns its manifest.

    Only regular files with safe relative names are written (directory members are implied by
    them); a link, a device, an absolute or ``..`` name, a duplicate, or a bundle past the size
    limits refuses the whole bundle.
    """
    count = total = 0
    try:
        with tarfile.open(archive, "r:gz") as bundle:
            for member in bundle:
                if member.isdir():
                    continue
                count += 1
                total += member.size
                if count > MAX_BUNDLE_FILES or total > MAX_BUNDLE_CONTENT_BYTES:
                    raise BundleInstallError("the bundle unpacks past its size limits")
                _extract_member(bundle, member, target)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise BundleInstallError(f"the bundle is not a valid .tar.gz ({type(error).__name__})") from None
    return _bundle_manifest(target)


def _extract_member(bundle: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    if not member.isfile():
        raise BundleInstallError(f"bundle member {member.name!r} is not a regular file")
    problem = path_problem(member.name)
    if problem is not None:
        raise BundleInstallError(f"bundle member {member.name!r} is unsafe: {problem}")
    destination = target / member.name
    source = bundle.extractfile(member)
    if source is None:
        raise BundleInstallError(f"bundle member {member.name!r} has no content")
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        with source, open(destination, "xb") as out:
            shutil.copyfileobj(source, out)
    except FileExistsError:
        raise BundleInstallError(f"bundle member {member.name!r} appears twice") from None
    except (NotADirectoryError, IsADirectoryError):
        raise BundleInstallError(f"bundle member {member.name!r} collides with another member") from None
    os.chmod(destination, 0o755 if member.mode & 0o111 else 0o644)


def _bundle_manifest(target: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((target / BUNDLE_MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise BundleInstallError(f"the bundle has no readable {BUNDLE_MANIFEST_NAME}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("version"), str):
        raise BundleInstallError(f"the bundle's {BUNDLE_MANIFEST_NAME} names no version")
    if not (target / BUNDLE_WORKER_FILE).is_file():
        raise BundleInstallError("the bundle has no worker program")
    return manifest


class BundleStore:
    """Installed worker bundles under ``<state-dir>/bundles``: one directory per sha256, complete once marked."""

    def __init__(self, root: Path):
        self.root = root

    def directory(self, bundle_hash: str) -> Path:
        return self.root / bundle_hash

    def receipt(self, bundle_hash: str) -> dict[str, Any] | None:
        """The install marker of a complete bundle, or None when it is not installed."""
        try:
            return json.loads((self.directory(bundle_hash) / INSTALLED_MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def installed(self, bundle_hash: str) -> bool:
        return self.receipt(bundle_hash) is not None

    def hashes(self) -> list[str]:
        """Every bundle directory here (complete or not), by name."""
        if not self.root.is_dir():
            return []
        return sorted(entry.name for entry in self.root.iterdir() if is_hex_digest(entry.name))

    def install_archive(self, archive: Path, bundle_hash: str) -> dict[str, Any]:
        """Check ``archive`` against ``bundle_hash``, unpack it beside its final place and rename it in.

        A bundle already installed under that hash is kept as it is (a running child may use it).
        """
        with open(archive, "rb") as handle:
            if hashlib.file_digest(handle, "sha256").hexdigest() != bundle_hash:
                raise BundleInstallError("the download does not match the bundle's sha256")
        existing = self.receipt(bundle_hash)
        if existing is not None:
            return existing
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=self.root, prefix=f".install-{bundle_hash[:12]}-"))
        try:
            manifest = extract_bundle(archive, staging)
            receipt = {"bundleHash": bundle_hash, "version": manifest["version"], "installedAtMs": _now_ms()}
            (staging / INSTALLED_MARKER).write_text(json.dumps(receipt), encoding="utf-8")
            target = self.directory(bundle_hash)
            if target.exists():
                remove_tree(target)  # an unmarked leftover: never a complete bundle (those are kept)
            os.rename(staging, target)
        except BaseException:
            remove_tree(staging)
            raise
        return receipt

    def delete(self, bundle_hash: str) -> None:
        target = self.directory(bundle_hash)
        if target.exists():
            aside = self.root / f".delete-{bundle_hash[:12]}-{uuid.uuid4().hex}"
            os.rename(target, aside)  # gone from view at once, removed after
            remove_tree(aside)

    def remove_leftovers(self) -> None:
        """Staging directories an interrupted install or delete left behind."""
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if entry.name.startswith((".install-", ".delete-")):
                    remove_tree(entry)


# --- environments ---------------------------------------------------------------------------------


class EnvironmentStore:
    """Workspaces under ``workspaces/`` and, beside them, what the node knows of each (``environments/``).

    The record of an environment keeps its lease and session, the ref it was prepared with, the
    ref of its last export and the manifests behind those refs (an export's base is looked up there,
    and the blobs they name are kept from garbage collection).
    """

    def __init__(self, workspaces: Path, records: Path):
        self.workspaces = workspaces
        self.records = records

    def workspace(self, environment_id: str) -> Path:
        return self.workspaces / environment_id

    def has_workspace(self, environment_id: str) -> bool:
        return self.workspace(environment_id).is_dir()

    def record(self, environment_id: str) -> dict[str, Any]:
        try:
            record = json.loads((self.records / f"{environment_id}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {"manifests": {}}
        return record if isinstance(record, dict) and isinstance(record.get("manifests"), dict) else {"manifests": {}}

    def save_record(self, environment_id: str, record: dict[str, Any]) -> None:
        self.records.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=self.records, prefix=".record-")
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(record, handle, separators=(",", ":"))
        os.replace(temporary, self.records / f"{environment_id}.json")

    def prepared(self) -> list[str]:
        """Environments with a workspace here, sorted."""
        return _listed_ids(self.workspaces, lambda entry: entry.is_dir())

    def known(self) -> set[str]:
        """Environments with a workspace or a record here."""
        records = _listed_ids(self.records, lambda entry: entry.suffix == ".json", strip=".json")
        return set(self.prepared()) | set(records)

    def with_lease(self, lease_id: str) -> list[str]:
        return sorted(env for env in self.known() if self.record(env).get("leaseId") == lease_id)

    def delete(self, environment_id: str) -> None:
        remove_tree(self.workspace(environment_id))
        (self.records / f"{environment_id}.json").unlink(missing_ok=True)

    def referenced_digests(self) -> set[str]:
        """Every digest a manifest of a known environment names (kept by blob garbage collection)."""
        kept: set[str] = set()
        for environment_id in self.known():
            for manifest in self.record(environment_id)["manifests"].values():
                kept.update(entry["sha256"] for entry in manifest)
        return kept

    def remove_leftovers(self) -> None:
        """Staging workspaces and half-written records an interrupted prepare or stop left behind."""
        for directory in (self.workspaces, self.records):
            if directory.is_dir():
                for entry in directory.iterdir():
                    if entry.name.startswith("."):
                        remove_tree(entry)


def _listed_ids(directory: Path, keep: Callable[[Path], bool], strip: str = "") -> list[str]:
    if not directory.is_dir():
        return []
    names = (entry.name.removesuffix(strip) for entry in directory.iterdir() if keep(entry))
    return sorted(name for name in names if _ENVIRONMENT_ID.fullmatch(name))


def remember_manifest(record: dict[str, Any], ref: str, manifest: Manifest, keep: Iterable[str]) -> None:
    """Add ``manifest`` to the record's manifests, keeping only ``ref`` and the refs in ``keep``."""
    wanted = {ref, *keep}
    record["manifests"] = {key: value for key, value in record["manifests"].items() if key in wanted}
    record["manifests"][ref] = manifest


# --- worker children ------------------------------------------------------------------------------


class WorkerDied(Exception):
    """The worker child ended (or broke its protocol) before it finished the turn."""

    def __init__(self, reason: str, text: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.text = text


def child_environment(bundle_dir: Path) -> dict[str, str]:
    """A minimal environment: the bundle on ``PYTHONPATH`` and none of the node's own secrets."""
    environment = {key: os.environ[key] for key in CHILD_ENVIRONMENT_KEYS if key in os.environ}
    environment.update(PYTHONPATH=str(bundle_dir), PYTHONUNBUFFERED="1")
    return environment


EventCallback = Callable[[dict[str, Any]], Awaitable[None]]
# What a child reports besides deltas, passed on to the gateway as the launch's progress at once and in order.
FORWARDED_CHILD_EVENTS = frozenset({"message", "tool", "approval"})


class CoalescedDeltas:
    """A turn's deltas as ``node.invoke.progress``, at most one per :data:`PROGRESS_COALESCE_S` window.

    Each progress costs the gateway a relay and an event; a window's deltas leave as one (the text
    so far, with their deltas joined). A turn that ends inside the window sends none: its result
    carries the whole text. The window is far below the gateway's own delta throttle, so operators
    see no difference but a faster end of short replies.
    """

    def __init__(self, send: Callable[[dict[str, Any]], Awaitable[None]] | None):
        self._send = send
        self._pending: dict[str, Any] | None = None
        self._waiting: asyncio.Task[None] | None = None
        self._sending: asyncio.Task[None] | None = None

    async def add(self, event: dict[str, Any]) -> None:
        if self._send is None:
            return
        delta = event.get("delta", "")
        if self._pending is not None:
            delta = self._pending["delta"] + delta
        self._pending = {"kind": "delta", "delta": delta, "text": event["text"]}
        if self._waiting is None:
            self._waiting = asyncio.ensure_future(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(PROGRESS_COALESCE_S)
        self._waiting = None
        pending, self._pending = self._pending, None
        if pending is not None and self._send is not None:
            # Sent as a task of its own, so that close() never interrupts a frame half sent.
            self._sending = asyncio.ensure_future(self._send(pending))
            try:
                await asyncio.shield(self._sending)
            except Exception:
                logger.warning("a turn's progress could not be sent", exc_info=True)

    async def send_now(self, data: dict[str, Any]) -> None:
        """A progress that must not wait (a step's message, a tool's start, an exec question): the deltas
        held back go first, so the gateway sees everything in the order the child wrote it."""
        if self._send is None:
            return
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None
        if self._sending is not None:
            with contextlib.suppress(Exception):  # reported by _flush_later
                await self._sending
        pending, self._pending = self._pending, None
        if pending is not None:
            await self._send(pending)
        await self._send(data)

    async def close(self) -> None:
        """The turn ended: drop what its result carries anyway, and let a send under way finish first."""
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None
        self._pending = None
        if self._sending is not None:
            with contextlib.suppress(Exception):  # reported by _flush_later
                await self._sending


class WorkerChild:
    """One ``python -m openclaw_client.worker`` process run from an installed bundle."""

    def __init__(self, process: asyncio.subprocess.Process, bundle_hash: str):
        self.process = process
        self.bundle_hash = bundle_hash
        self._killed = False

    @classmethod
    async def spawn(cls, bundle_hash: str, bundle_dir: Path, cwd: Path) -> WorkerChild:
        """Start a child running the bundle's code (``-P``: never the workspace's, which is its cwd)."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",
            "-s",
            "-m",
            "openclaw_client.worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=child_environment(bundle_dir),
            limit=CHILD_LINE_LIMIT,
            start_new_session=True,  # the terminal's Ctrl-C stops the node, which stops its children
        )
        return cls(process, bundle_hash)

    @property
    def alive(self) -> bool:
        """Running and usable (a killed child may not have been reaped yet, but is not usable)."""
        return self.process.returncode is None and not self._killed

    async def run_turn(self, job: dict[str, Any], on_event: EventCallback) -> dict[str, Any]:
        """Send the turn and follow it to its ``done`` event (returned), passing every other event of the run
        on (deltas, the transcript's messages, tool progress, exec questions); raises :class:`WorkerDied`."""
        text = ""
        await self._send(job)
        while True:
            event = await self._next_event(text)
            if event.get("runId") != job["runId"]:
                continue
            kind = event.get("type")
            if kind == "done":
                return event
            if kind == "delta" and isinstance(event.get("text"), str):
                text = event["text"]
            elif kind == "message":
                text = ""  # a step ended: what the turn was writing is in that message now
            await on_event(event)

    async def answer(self, message: dict[str, Any]) -> None:
        """Pass the gateway's answer to a question of the running turn (an exec decision)."""
        with contextlib.suppress(WorkerDied):
            await self._send(message)

    async def cancel(self, run_id: str) -> None:
        with contextlib.suppress(WorkerDied):
            await self._send({"type": "cancel", "runId": run_id})

    async def stop(self) -> None:
        """End the child: closing stdin asks it to exit; one that lingers is killed."""
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), WORKER_STOP_GRACE_S)
        except TimeoutError:
            self.kill()
            await self.process.wait()

    def kill(self) -> None:
        self._killed = True
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()

    async def _send(self, message: dict[str, Any]) -> None:
        stdin = self.process.stdin
        if stdin is None or stdin.is_closing():
            raise WorkerDied("the worker process is gone")
        try:
            stdin.write((json.dumps(message) + "\n").encode("utf-8"))
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise WorkerDied("the worker process stopped reading its jobs") from None

    async def _next_event(self, text: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            try:
                line = await self.process.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                self.kill()
                raise WorkerDied("the worker process wrote a line past the size limit", text) from None
            if not line:
                code = await self.process.wait()
                raise WorkerDied(f"the worker process exited unexpectedly (exit code {code})", text)
            try:
                event = json.loads(line)
            except ValueError:
                logger.warning("worker child wrote a line that is not JSON")
                continue
            if isinstance(event, dict):
                return event


class CapacityExhausted(Exception):
    pass


class SlotWaitAborted(Exception):
    pass


@dataclass
class IdleWorker:
    child: WorkerChild
    expiry: asyncio.TimerHandle | None = None


class WorkerPool:
    """The node's worker slots, held by running turns and by idle (warm, reclaimable) children.

    ``available + reclaimableIdle`` is what a launch can get at once: a free slot, the warm child
    of its bundle, or the slot of another bundle's idle child (which is then stopped). Idle
    children are kept for ``idle_ttl_s`` and at most ``idle_limit`` of them.
    """

    def __init__(self, total: int, *, idle_limit: int = IDLE_WORKER_LIMIT, idle_ttl_s: float = IDLE_WORKER_TTL_S):
        self.total = total
        self.idle_limit = idle_limit
        self.idle_ttl_s = idle_ttl_s
        self.running = 0
        self._idle: list[IdleWorker] = []
        self._changed = asyncio.Condition()
        self._stopping: set[asyncio.Task] = set()

    @property
    def available(self) -> int:
        return max(0, self.total - self.running - len(self._idle))

    @property
    def reclaimable_idle(self) -> int:
        return len(self._idle)

    def capacity(self) -> dict[str, int]:
        return {"total": self.total, "available": self.available, "reclaimableIdle": self.reclaimable_idle}

    def idle_bundles(self) -> set[str]:
        return {idle.child.bundle_hash for idle in self._idle}

    async def take(self, bundle_hash: str, wait_ms: int, abort: asyncio.Event | None = None) -> WorkerChild | None:
        """Take a slot for a turn of ``bundle_hash``: its warm child when one is idle (returned), else None.

        Waits up to ``wait_ms`` for a slot; raises :class:`CapacityExhausted` after that, or
        :class:`SlotWaitAborted` once ``abort`` is set (and :meth:`wake` called).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        async with self._changed:
            while True:
                if abort is not None and abort.is_set():
                    raise SlotWaitAborted
                taken, child = self._take_now(bundle_hash)
                if taken:
                    return child
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise CapacityExhausted
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._changed.wait()

    def try_take_free(self) -> bool:
        """Take a free slot if there is one, without waiting or reclaiming (a prewarm)."""
        if self.available <= 0:
            return False
        self.running += 1
        return True

    async def release(self, child: WorkerChild | None, *, reusable: bool) -> None:
        """Give a turn's slot back: to its child, now idle and warm, or to the pool."""
        self.running -= 1
        if child is not None:
            if reusable and child.alive and len(self._idle) < self.idle_limit:
                self._park(child)
            else:
                self._retire(child)
        await self.wake()

    async def wake(self) -> None:
        """Let waiting launches look again (a slot freed, or one of them was cancelled)."""
        async with self._changed:
            self._changed.notify_all()

    async def stop_idle(self, bundle_hashes: set[str] | None = None) -> None:
        """Stop the idle children (of those bundles only, when given) and wait until they are gone."""
        for idle in list(self._idle):
            if bundle_hashes is None or idle.child.bundle_hash in bundle_hashes:
                self._unpark(idle)
                self._retire(idle.child)
        if self._stopping:
            await asyncio.wait(set(self._stopping))
        await self.wake()

    def _take_now(self, bundle_hash: str) -> tuple[bool, WorkerChild | None]:
        for idle in [idle for idle in self._idle if not idle.child.alive]:
            self._unpark(idle)  # it died while idle: its slot is free again
            self._retire(idle.child)
        warm = next((idle for idle in self._idle if idle.child.bundle_hash == bundle_hash), None)
        if warm is not None:
            self._unpark(warm)
            self.running += 1
            return True, warm.child
        if self.available > 0:
            self.running += 1
            return True, None
        if self._idle:
            oldest = self._idle[0]
            self._unpark(oldest)
            self._retire(oldest.child)
            self.running += 1
            return True, None
        return False, None

    def _park(self, child: WorkerChild) -> None:
        idle = IdleWorker(child)
        idle.expiry = asyncio.get_running_loop().call_later(self.idle_ttl_s, self._expire, idle)
        self._idle.append(idle)

    def _unpark(self, idle: IdleWorker) -> None:
        self._idle.remove(idle)
        if idle.expiry is not None:
            idle.expiry.cancel()

    def _expire(self, idle: IdleWorker) -> None:
        if idle in self._idle:
            self._unpark(idle)
            self._retire(idle.child)
            self._background(self.wake())

    def _retire(self, child: WorkerChild) -> None:
        self._background(child.stop())

    def _background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)


# --- runs -----------------------------------------------------------------------------------------


@dataclass
class Run:
    """A launched turn, from its launch until its result (waiting for a slot included)."""

    run_id: str
    environment_id: str
    session_id: str
    lease_id: str
    bundle_hash: str
    started_at_ms: int = field(default_factory=lambda: _now_ms())
    child: WorkerChild | None = None
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def describe(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "environmentId": self.environment_id,
            "sessionId": self.session_id,
            "startedAtMs": self.started_at_ms,
        }


@dataclass(frozen=True)
class Launch:
    run_id: str
    environment_id: str
    session_id: str
    lease_id: str
    bundle_hash: str
    model: str
    messages: list[dict[str, Any]]
    inference_path: str
    inference_token: str
    timeout_ms: int
    max_steps: int
    tools: bool
    exec_timeout_s: float | None
    exec_policy: dict[str, Any] | None


CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})


def _chat_message(message: Any) -> bool:
    """A chat-completions message as the gateway sends a turn's context (the proxy checks them in full)."""
    return (
        isinstance(message, dict)
        and message.get("role") in CHAT_ROLES
        and (
            isinstance(message.get("content"), str)
            or (message.get("role") == "assistant" and message.get("content") is None)
        )
        and isinstance(message.get("tool_calls", []), list)
        and (message.get("tool_call_id") is None or isinstance(message.get("tool_call_id"), str))
    )


def _launch_params(params: Params) -> Launch:
    messages = params.raw.get("messages")
    if not isinstance(messages, list) or not all(_chat_message(message) for message in messages):
        raise params.invalid("messages", "a list of chat messages ({role, content, tool_calls?, tool_call_id?})")
    agent = Params(LAUNCH_COMMAND, params.raw.get("agent") or {}, prefix="agent.")
    tools = agent.raw.get("tools", False)
    if not isinstance(tools, bool):
        raise agent.invalid("tools", "a boolean")
    exec_policy = agent.raw.get("execPolicy")
    if exec_policy is not None and not isinstance(exec_policy, dict):
        raise agent.invalid("execPolicy", "an object (the effective exec policy)")
    exec_timeout_ms = None
    if agent.has("execTimeoutMs"):
        exec_timeout_ms = agent.integer("execTimeoutMs", minimum=1000, maximum=MAX_TURN_TIMEOUT_MS)
    inference = params.raw.get("inference")
    if not (
        isinstance(inference, dict)
        and isinstance(inference.get("path"), str)
        and inference["path"].startswith("/")
        and isinstance(inference.get("token"), str)
        and inference["token"]
    ):
        raise params.invalid("inference", "{path: an absolute path, token: a non-empty string}")
    return Launch(
        run_id=params.text("runId"),
        environment_id=params.environment_id(),
        session_id=params.string("sessionId"),
        lease_id=params.text("leaseId"),
        bundle_hash=params.digest("bundleHash"),
        model=params.text("model"),
        messages=messages,
        inference_path=inference["path"],
        inference_token=inference["token"],
        timeout_ms=params.integer("timeoutMs", minimum=1, maximum=MAX_TURN_TIMEOUT_MS),
        max_steps=agent.integer("maxSteps", minimum=1, maximum=MAX_AGENT_STEPS) if agent.has("maxSteps") else 24,
        tools=tools,
        exec_timeout_s=exec_timeout_ms / 1000 if exec_timeout_ms is not None else None,
        exec_policy=exec_policy,
    )


def _retained_environments(params: Params) -> set[str]:
    """The environment ids of ``retain`` (each entry checked: id, session, generation, manifestRefs)."""
    retained = set()
    for entry in params.items("retain"):
        refs = entry.raw.get("manifestRefs")
        if refs is not None and (not isinstance(refs, list) or not all(is_manifest_ref(ref) for ref in refs)):
            raise entry.invalid("manifestRefs", "null or a list of manifest refs")
        entry.string("sessionId")
        entry.integer("generation", minimum=0, maximum=2**63 - 1)
        retained.add(entry.environment_id())
    return retained


# --- the journal ----------------------------------------------------------------------------------


class Journal:
    """What the node host did that others check afterwards, one JSON object a line (appended, never read back).

    Bounded: past :data:`JOURNAL_MAX_BYTES` the file becomes ``<name>.1`` (replacing the previous one) and a new
    one starts.
    """

    def __init__(self, path: Path | None, max_bytes: int = JOURNAL_MAX_BYTES):
        self.path = path
        self.max_bytes = max_bytes

    def record(self, kind: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"kind": kind, "atMs": _now_ms(), **fields}, separators=(",", ":"))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists() and self.path.stat().st_size >= self.max_bytes:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            with open(self.path, "a", encoding="utf-8") as journal:
                journal.write(line + "\n")
        except OSError as error:
            logger.warning("could not write the journal: %s", _os_reason(error))


# --- the node host --------------------------------------------------------------------------------


class NodeHost:
    """The node's connection to its gateway and the worker host behind its private commands."""

    def __init__(self, config: NodeHostConfig):
        self.config = config
        root = Path(config.state_dir)
        self.bundles = BundleStore(root / "bundles")
        self.blobs = BlobStore(root / "blobs")
        self.environments = EnvironmentStore(root / "workspaces", root / "environments")
        self.exec_slots_dir = root / "exec-slots"
        self.pool = WorkerPool(
            config.capacity, idle_limit=config.idle_worker_limit, idle_ttl_s=config.idle_worker_ttl_s
        )
        self.runs: dict[str, Run] = {}
        self._identity = IdentityStore(root)
        self._installs: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._environment_locks: dict[str, asyncio.Lock] = {}
        self._retain_sequences: dict[str, int] = {}
        self._background: set[asyncio.Task] = set()
        self._handlers: dict[str, Callable[[Params], Awaitable[dict[str, Any]]]] = {
            INSTALL_COMMAND: self.install_bundle,
            PREPARE_COMMAND: self.prepare_workspace,
            EXPORT_COMMAND: self.export_workspace,
            LAUNCH_COMMAND: self.launch,
            CANCEL_COMMAND: self.cancel,
            APPROVAL_COMMAND: self.approve,
            STATUS_COMMAND: self.status,
            STOP_COMMAND: self.stop_environment,
            RETAIN_COMMAND: self.retain,
        }
        options = ClientOptions(
            url=config.gateway_url,
            token=config.token,
            role="node",
            client_id="node-host",
            client_mode="node",
            display_name=config.display_name or os.uname().nodename,
            commands=list(NODE_HOST_COMMANDS),
            caps=list(NODE_HOST_CAPS),
            state_dir=str(config.state_dir),
        )
        self.client = GatewayClient(options, invoke_handler=self._invoke)
        self.journal = Journal(config.journal_path)
        self._announced_request: str | None = None

    def inventory(self) -> dict[str, Any]:
        """The worker host this node offers, as ``node.runnerInventory.update`` takes it."""
        capacity = {"total": self.pool.total, "available": self.pool.available}
        if self.pool.reclaimable_idle:
            capacity["reclaimableIdle"] = self.pool.reclaimable_idle
        return {
            "protocolFeatures": [WORKER_SUPERVISOR_FEATURE],
            "workerHost": {
                "enabled": True,
                "capacity": capacity,
                "bundlePrewarm": 1,
                "bundleRetention": 1,
                "bundleStatus": 1,
                "capturedExecPolicy": True,
            },
        }

    async def _on_connected(self, client: GatewayClient) -> None:
        self._announced_request = None
        accepted = await client.request("node.runnerInventory.update", self.inventory())
        logger.info(
            "connected to %s as node %s; hosting %d worker slot(s)",
            self.config.gateway_url,
            accepted.get("nodeId"),
            self.config.capacity,
        )

    async def _invoke(self, command: str, params: Any) -> Any:
        invoke = current_invoke.get()
        invoke_id = invoke.invoke_id if invoke is not None else None
        logger.info("invoke %s id=%s", command, invoke_id or "-")
        try:
            return await self.handle(command, params)
        except NodeCommandError as error:
            self.journal.record(
                "invoke-error", command=command, invokeId=invoke_id, code=error.code, message=error.message
            )
            raise
        except Exception as error:
            self.journal.record(
                "invoke-error", command=command, invokeId=invoke_id, code="UNAVAILABLE", message=type(error).__name__
            )
            raise

    async def publish_inventory(self) -> None:
        """Declare the worker host again on the current connection (``SIGUSR1``); the outcome goes to the journal."""
        try:
            accepted = await self.client.request("node.runnerInventory.update", self.inventory(), timeout=10)
        except GatewayError as refused:
            self.journal.record("inventory-publish", ok=False, code=refused.code, message=refused.message)
        except ConnectionClosed as closed:
            self.journal.record(
                "inventory-publish", ok=False, code="CLOSED", closeCode=closed.code, closeReason=closed.reason
            )
        except websockets.ConnectionClosed as closed:
            frame = closed.rcvd
            self.journal.record(
                "inventory-publish",
                ok=False,
                code="CLOSED",
                closeCode=frame.code if frame else None,
                closeReason=frame.reason if frame else None,
            )
        except (OSError, TimeoutError) as error:
            self.journal.record("inventory-publish", ok=False, code="UNREACHABLE", message=type(error).__name__)
        else:
            # What it declared, and the turns its worker children are running now (a supervisor's "idle" check).
            self.journal.record(
                "inventory-publish",
                ok=True,
                nodeId=accepted.get("nodeId"),
                capacity=self.inventory()["workerHost"]["capacity"],
                runsInFlight=len(self.runs),
            )

    async def handle(self, command: str, params: Any) -> dict[str, Any]:
        """Run one private command (what a ``node.invoke.request`` asks); raises :class:`NodeCommandError`."""
        handler = self._handlers.get(command)
        if handler is None:
            raise NodeCommandError("UNAVAILABLE", f"this node host does not implement {command}")
        return await handler(Params.of_command(command, params))

    # --- worker.bundle.install.v1 -------------------------------------------------------------

    async def install_bundle(self, params: Params) -> dict[str, Any]:
        bundle_hash = params.digest("bundleHash")
        params.text("openclawVersion")
        params.text("idempotencyKey", max_length=1024)
        download_path = params.text("downloadPath", max_length=4096)
        if not download_path.startswith("/") or download_path.startswith("//"):
            raise params.invalid("downloadPath", "a path on the gateway's origin")
        size_bytes = params.integer("sizeBytes", minimum=1, maximum=MAX_BUNDLE_BYTES)
        receipt = await asyncio.to_thread(self.bundles.receipt, bundle_hash)
        kind = "existing"
        if receipt is None:
            receipt = await self._shared_install(bundle_hash, download_path, size_bytes)
            kind = "installed"
        if params.raw.get("bundlePrewarm") == 1:
            await self._prewarm(bundle_hash)
        return {
            "bundleHash": bundle_hash,
            "openclawVersion": receipt["version"],
            "protocolFeatures": [WORKER_SUPERVISOR_FEATURE],
            "installKind": kind,
        }

    async def _shared_install(self, bundle_hash: str, download_path: str, size_bytes: int) -> dict[str, Any]:
        """One transfer per hash: a concurrent install of the same bundle waits for the first one's."""
        transfer = self._installs.get(bundle_hash)
        if transfer is None:
            transfer = asyncio.ensure_future(self._download_and_install(bundle_hash, download_path, size_bytes))
            self._installs[bundle_hash] = transfer
            transfer.add_done_callback(lambda done: self._install_finished(bundle_hash, done))
        try:
            return await asyncio.shield(transfer)
        except BundleInstallError as error:
            raise NodeCommandError("BUNDLE_INSTALL_FAILED", f"worker bundle installation failed: {error}") from None
        except OSError as error:
            message = f"worker bundle installation failed: could not store the bundle ({_os_reason(error)})"
            raise NodeCommandError("BUNDLE_INSTALL_FAILED", message) from None

    def _install_finished(self, bundle_hash: str, transfer: asyncio.Future[dict[str, Any]]) -> None:
        self._installs.pop(bundle_hash, None)
        if not transfer.cancelled():
            transfer.exception()  # every waiter may have gone; the failure was theirs to report, not the loop's

    async def _download_and_install(self, bundle_hash: str, download_path: str, size_bytes: int) -> dict[str, Any]:
        token = await asyncio.to_thread(self._identity.device_token, "node")
        if not token:
            raise BundleInstallError("this node has no device token yet")
        url = gateway_http_origin(self.config.gateway_url) + download_path
        return await asyncio.to_thread(self._fetch_and_install, url, token, size_bytes, bundle_hash)

    def _fetch_and_install(self, url: str, token: str, size_bytes: int, bundle_hash: str) -> dict[str, Any]:
        self.bundles.root.mkdir(parents=True, exist_ok=True)
        descriptor, archive = tempfile.mkstemp(dir=self.bundles.root, prefix=f".install-{bundle_hash[:12]}-")
        os.close(descriptor)
        try:
            download_bundle(url, token, size_bytes, Path(archive))
            return self.bundles.install_archive(Path(archive), bundle_hash)
        finally:
            Path(archive).unlink(missing_ok=True)

    async def _prewarm(self, bundle_hash: str) -> None:
        """Start an idle child of a freshly installed bundle while a slot is free (its first turn is warm)."""
        if self.pool.reclaimable_idle >= self.pool.idle_limit or not self.pool.try_take_free():
            return
        child = None
        try:
            child = await WorkerChild.spawn(bundle_hash, self.bundles.directory(bundle_hash), self._neutral_cwd())
        except OSError as error:
            logger.warning("could not prewarm a worker: %s", _os_reason(error))
        await self.pool.release(child, reusable=child is not None)

    def _neutral_cwd(self) -> Path:
        self.environments.workspaces.mkdir(parents=True, exist_ok=True)
        return self.environments.workspaces

    # --- worker.workspace.prepare.v1 ----------------------------------------------------------

    async def prepare_workspace(self, params: Params) -> dict[str, Any]:
        environment_id = params.environment_id()
        lease_id, session_id = params.text("leaseId"), params.string("sessionId")
        ref = params.manifest_ref("manifestRef")
        manifest, blobs = params.raw.get("manifest"), params.raw.get("blobs")
        async with self._environment_lock(environment_id):
            return await asyncio.to_thread(
                self._prepare, environment_id, lease_id, session_id, ref, manifest, {} if blobs is None else blobs
            )

    def _prepare(
        self, environment_id: str, lease_id: str, session_id: str, ref: str, manifest: Any, blobs: Any
    ) -> dict[str, Any]:
        workspace = self.environments.workspace(environment_id)
        record = self.environments.record(environment_id)
        if record.get("preparedRef") == ref and workspace.is_dir():
            return {"status": "ready", "manifestRef": ref, "remoteWorkspaceDir": str(workspace)}
        try:
            validate_manifest(manifest)
            if manifest_ref(manifest) != ref:
                raise InvalidManifest("manifest does not match manifestRef")
            contents = decode_blobs(blobs)
        except InvalidManifest as error:
            raise NodeCommandError("INVALID_MANIFEST", f"invalid workspace manifest: {error}") from None
        try:
            for digest, data in contents.items():
                self.blobs.put(digest, data)
        except BlobMismatch as error:
            raise NodeCommandError("BLOB_MISMATCH", str(error)) from None
        record.update(environmentId=environment_id, leaseId=lease_id, sessionId=session_id)
        missing = self.blobs.missing(digests(manifest))
        if missing:
            record["pendingRef"] = ref  # its manifest keeps the blobs sent so far from garbage collection
            remember_manifest(record, ref, manifest, _record_refs(record))
            self.environments.save_record(environment_id, record)
            return {"status": "missing", "missing": missing}
        try:
            materialize(manifest, self.blobs, workspace)
        except (WorkspaceError, OSError) as error:
            reason = str(error) if isinstance(error, WorkspaceError) else _os_reason(error)
            raise NodeCommandError("WORKSPACE_PREPARE_FAILED", f"workspace could not be prepared: {reason}") from None
        record.pop("pendingRef", None)
        record["preparedRef"] = ref
        remember_manifest(record, ref, manifest, _record_refs(record))
        self.environments.save_record(environment_id, record)
        return {"status": "ready", "manifestRef": ref, "remoteWorkspaceDir": str(workspace)}

    # --- worker.workspace.export.v1 -----------------------------------------------------------

    async def export_workspace(self, params: Params) -> dict[str, Any]:
        environment_id = params.environment_id()
        base_ref = params.manifest_ref("baseManifestRef")
        cursor = params.optional_text("cursor")
        async with self._environment_lock(environment_id):
            return await asyncio.to_thread(self._export, environment_id, base_ref, cursor)

    def _export(self, environment_id: str, base_ref: str, cursor: str | None) -> dict[str, Any]:
        workspace = self.environments.workspace(environment_id)
        if not workspace.is_dir():
            raise NodeCommandError("WORKSPACE_MISSING", f"no workspace for environment {environment_id} on this node")
        record = self.environments.record(environment_id)
        base = record["manifests"].get(base_ref)
        try:
            if cursor is None:
                manifest = snapshot(workspace, self.blobs)
                ref, offset = manifest_ref(manifest), 0
                record["exportedRef"] = ref
                remember_manifest(record, ref, manifest, [*_record_refs(record), base_ref])
                self.environments.save_record(environment_id, record)
            else:
                ref, offset = _parse_cursor(cursor, record)
                manifest = record["manifests"][ref]
            page = export_page(
                manifest, changed_digests(manifest, base), self.blobs, offset=offset, budget=EXPORT_PAGE_BYTES
            )
        except (WorkspaceError, OSError) as error:
            reason = str(error) if isinstance(error, WorkspaceError) else _os_reason(error)
            raise NodeCommandError("WORKSPACE_EXPORT_FAILED", f"workspace could not be exported: {reason}") from None
        answer: dict[str, Any] = {
            "manifestRef": ref,
            "manifest": manifest,
            "blobs": encode_blobs(page.blobs),
            "hasMore": page.next_offset is not None,
        }
        if page.next_offset is not None:
            answer["cursor"] = f"{ref}@{page.next_offset}"
        return answer

    # --- worker.launch.v1 / worker.cancel.v1 --------------------------------------------------

    async def launch(self, params: Params) -> dict[str, Any]:
        launch = _launch_params(params)
        workspace = await asyncio.to_thread(self._launch_workspace, launch)  # one hop: it is on every turn's path
        if launch.run_id in self.runs:
            raise invalid_request(f"run {launch.run_id} is already running on this node")
        run = Run(launch.run_id, launch.environment_id, launch.session_id, launch.lease_id, launch.bundle_hash)
        self.runs[run.run_id] = run
        try:
            return await self._run_turn(run, launch, workspace)
        finally:
            del self.runs[run.run_id]
            run.finished.set()

    def _launch_workspace(self, launch: Launch) -> Path:
        """The launch's workspace, once its bundle and workspace are known to be here."""
        if not self.bundles.installed(launch.bundle_hash):
            raise NodeCommandError("BUNDLE_MISSING", "the worker bundle is not installed on this node")
        workspace = self.environments.workspace(launch.environment_id)
        if not workspace.is_dir():
            raise NodeCommandError(
                "WORKSPACE_MISSING", f"no workspace for environment {launch.environment_id} on this node"
            )
        # The turn (and its tools) run only under the lease the workspace was prepared for: a launch of an
        # older placement of the environment is refused before anything runs.
        lease = self.environments.record(launch.environment_id).get("leaseId")
        if lease is not None and lease != launch.lease_id:
            raise NodeCommandError(
                "STALE_LEASE", f"environment {launch.environment_id} is held under another lease on this node"
            )
        return workspace

    async def _run_turn(self, run: Run, launch: Launch, workspace: Path) -> dict[str, Any]:
        wait_ms = self.config.capacity_wait_ms
        try:
            child = await self.pool.take(launch.bundle_hash, wait_ms, abort=run.cancelled)
        except CapacityExhausted:
            message = f"node worker capacity remained full for {wait_ms} ms"
            raise NodeCommandError("WORKER_CAPACITY_EXHAUSTED", message) from None
        except SlotWaitAborted:
            return {"status": "aborted", "text": ""}
        try:
            if child is None:
                child = await self._spawn(launch.bundle_hash, workspace)
            run.child = child
            return await self._follow_turn(run, launch, child, workspace)
        finally:
            # A child that ended its turn properly is still alive and goes back warm; a killed one is not.
            await self.pool.release(child, reusable=child is not None and child.alive)

    async def _spawn(self, bundle_hash: str, workspace: Path) -> WorkerChild:
        try:
            return await WorkerChild.spawn(bundle_hash, self.bundles.directory(bundle_hash), workspace)
        except OSError as error:
            message = f"the worker process could not start ({_os_reason(error)})"
            raise NodeCommandError("WORKER_FAILED", message) from None

    async def _follow_turn(self, run: Run, launch: Launch, child: WorkerChild, workspace: Path) -> dict[str, Any]:
        job = {
            "type": "turn",
            "runId": launch.run_id,
            "model": launch.model,
            "messages": launch.messages,
            "inference": {
                "url": gateway_http_origin(self.config.gateway_url) + launch.inference_path,
                "token": launch.inference_token,
            },
            "timeoutMs": launch.timeout_ms,
            "cwd": str(workspace),
            "agent": {
                "maxSteps": launch.max_steps,
                "tools": launch.tools,
                "execTimeoutS": launch.exec_timeout_s,
                "execPolicy": launch.exec_policy,
                "execSlots": {"dir": str(self.exec_slots_dir), "count": self.config.exec_concurrency},
            },
        }
        invoke = current_invoke.get()
        progress = CoalescedDeltas(invoke.progress if invoke is not None else None)

        async def on_event(event: dict[str, Any]) -> None:
            kind = event.get("type")
            if kind == "delta":
                await progress.add(event)
            elif kind in FORWARDED_CHILD_EVENTS:
                fields = {key: value for key, value in event.items() if key not in ("type", "runId")}
                await progress.send_now({"kind": kind, **fields})

        try:
            async with asyncio.timeout(launch.timeout_ms / 1000 + TURN_GRACE_S):
                if run.cancelled.is_set():
                    return {"status": "aborted", "text": ""}
                done = await child.run_turn(job, on_event)
        except TimeoutError:
            child.kill()
            message = f"the worker did not finish the turn within {launch.timeout_ms} ms"
            raise NodeCommandError("WORKER_FAILED", message) from None
        except WorkerDied as died:
            child.kill()
            if run.cancelled.is_set():
                return {"status": "aborted", "text": died.text}
            raise NodeCommandError("WORKER_FAILED", f"worker failed: {died.reason}") from None
        finally:
            await progress.close()
        return {key: value for key, value in done.items() if key not in ("type", "runId")}

    async def cancel(self, params: Params) -> dict[str, Any]:
        run = self.runs.get(params.text("runId"))
        if run is None:
            return {"cancelled": False}
        await self._cancel_run(run)
        return {"cancelled": True}

    # --- worker.approval.v1 -------------------------------------------------------------------

    async def approve(self, params: Params) -> dict[str, Any]:
        """The gateway's decision on an exec the run's child asked about; a run that ended takes none."""
        run = self.runs.get(params.text("runId"))
        call_id = params.text("toolCallId")
        allowed, aborted = params.raw.get("allowed"), params.raw.get("aborted", False)
        reason = params.raw.get("reason", "")
        if not isinstance(allowed, bool) or not isinstance(aborted, bool) or not isinstance(reason, str):
            raise params.invalid("allowed", "a boolean (with aborted a boolean and reason a string)")
        if run is None or run.child is None:
            return {"delivered": False}
        await run.child.answer(
            {
                "type": "approval",
                "runId": run.run_id,
                "toolCallId": call_id,
                "allowed": allowed,
                "aborted": aborted,
                "reason": reason[:4000],
            }
        )
        return {"delivered": True}

    async def _cancel_run(self, run: Run) -> None:
        """Ask the run's child to stop; one that has not ended the turn after a grace period is killed."""
        if run.cancelled.is_set():
            return
        run.cancelled.set()
        await self.pool.wake()
        if run.child is not None:
            await run.child.cancel(run.run_id)
        self._spawn_background(self._enforce_cancel(run))

    async def _enforce_cancel(self, run: Run) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.finished.wait(), CANCEL_GRACE_S)
            return
        if run.child is not None:
            logger.warning("worker for run %s ignored its cancel; killing it", run.run_id)
            run.child.kill()

    # --- worker.status.v1 ---------------------------------------------------------------------

    async def status(self, params: Params) -> dict[str, Any]:
        return {
            "capacity": self.pool.capacity(),
            "running": [run.describe() for run in self.runs.values() if run.child is not None],
            "environments": await asyncio.to_thread(self.environments.prepared),
        }

    # --- worker.environment.stop.v1 -----------------------------------------------------------

    async def stop_environment(self, params: Params) -> dict[str, Any]:
        environment_id = params.environment_id() if params.has("environmentId") else None
        lease_id = params.optional_text("leaseId")
        if environment_id is None and lease_id is None:
            raise invalid_request(f"{STOP_COMMAND} needs environmentId or leaseId")
        targets = await asyncio.to_thread(self.environments.known)
        targets |= {run.environment_id for run in self.runs.values()}
        if environment_id is not None:
            targets &= {environment_id}
        if lease_id is not None:
            leased = await asyncio.to_thread(self.environments.with_lease, lease_id)
            targets &= {*leased, *(run.environment_id for run in self.runs.values() if run.lease_id == lease_id)}
        for target in sorted(targets):
            await self._stop_environment(target)
        return {"stopped": True, "environmentIds": sorted(targets)}

    async def _stop_environment(self, environment_id: str) -> None:
        """Cancel the environment's turns, wait for them to end, and delete its workspace and record."""
        runs = [run for run in self.runs.values() if run.environment_id == environment_id]
        for run in runs:
            await self._cancel_run(run)
        if runs:
            waits = [asyncio.ensure_future(run.finished.wait()) for run in runs]
            _done, pending = await asyncio.wait(waits, timeout=CANCEL_GRACE_S + WORKER_STOP_GRACE_S)
            for wait in pending:
                wait.cancel()
        async with self._environment_lock(environment_id):
            await asyncio.to_thread(self.environments.delete, environment_id)

    # --- worker.workspace.retain.v1 -----------------------------------------------------------

    async def retain(self, params: Params) -> dict[str, Any]:
        params.text("gatewayNamespace")
        controller = params.text("controllerId")
        sequence = params.integer("sequence", minimum=0, maximum=2**63 - 1)
        retained = _retained_environments(params)
        bundle_hashes = params.digest_list("bundleHashes") if params.has("bundleHashes") else None
        status_hash = params.digest("bundleStatusHash") if params.has("bundleStatusHash") else None
        applied = sequence > self._retain_sequences.get(controller, -1)
        deleted: dict[str, list[str]] = {"environments": [], "bundles": []}
        if applied:
            self._retain_sequences[controller] = sequence
            deleted["environments"] = await self._drop_environments(retained)
            if bundle_hashes is not None:
                deleted["bundles"] = await self._drop_bundles(set(bundle_hashes))
            await asyncio.to_thread(self._collect_blobs)
        answer: dict[str, Any] = {"applied": applied, "deleted": deleted, "hasMore": False}
        if status_hash is not None:
            installed = await asyncio.to_thread(self.bundles.installed, status_hash)
            answer["bundleStatus"] = "installed" if installed else "missing"
        return answer

    async def _drop_environments(self, keep: set[str]) -> list[str]:
        known = await asyncio.to_thread(self.environments.known)
        known |= {run.environment_id for run in self.runs.values()}
        dropped = sorted(known - keep)
        for environment_id in dropped:
            await self._stop_environment(environment_id)
        return dropped

    async def _drop_bundles(self, keep: set[str]) -> list[str]:
        """Delete bundles not in ``keep``, except those a run uses; their idle children stop first."""
        in_use = {run.bundle_hash for run in self.runs.values()} | set(self._installs)
        candidates = set(await asyncio.to_thread(self.bundles.hashes)) - keep - in_use
        if not candidates:
            return []
        await self.pool.stop_idle(candidates)
        in_use = {run.bundle_hash for run in self.runs.values()} | set(self._installs)
        dropped = sorted(candidates - in_use)
        for bundle_hash in dropped:
            await asyncio.to_thread(self.bundles.delete, bundle_hash)
        return dropped

    def _collect_blobs(self) -> None:
        """Delete blobs no known environment's manifest names (older than a grace period: a prepare may be mid-way)."""
        referenced = self.environments.referenced_digests()
        horizon = time.time() - BLOB_GC_GRACE_S
        for blob in self.blobs.stored():
            with contextlib.suppress(FileNotFoundError):
                if blob.name not in referenced and blob.stat().st_mtime < horizon:
                    blob.unlink()

    # --- plumbing -----------------------------------------------------------------------------

    def _environment_lock(self, environment_id: str) -> asyncio.Lock:
        return self._environment_locks.setdefault(environment_id, asyncio.Lock())

    def _spawn_background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def announce_pairing(self, error: ConnectError) -> None:
        """Say once per request how an operator approves this node."""
        request_id = (error.details or {}).get("requestId")
        if error.code == "NOT_PAIRED" and request_id and request_id != self._announced_request:
            self._announced_request = request_id
            print(
                f"waiting for pairing approval: request {request_id} "
                f"(on the gateway: manage.py pairing approve {request_id})",
                file=sys.stderr,
                flush=True,
            )

    async def _on_refused(self, error: ConnectError) -> None:
        self.announce_pairing(error)
        details = error.details or {}
        # The gateway asks for a new pairing only of a device it does not (or no longer) pair as a node.
        removed = (
            error.code == "NOT_PAIRED"
            and details.get("code") == "PAIRING_REQUIRED"
            and details.get("reason") in NOT_A_NODE_REASONS
        )
        if removed and await asyncio.to_thread(self._identity.device_token, "node"):
            await self.forget_gateway()

    async def _on_closed(self, code: int | None, reason: str | None) -> None:
        """The gateway closed our connection because it removed this node: the same end of the pairing as a
        refused connect, learnt at once (a node that holds no shared secret could not learn it otherwise: its
        device token is refused as a mismatch from then on)."""
        if code == REMOVED_CLOSE_CODE and reason in REMOVED_CLOSE_REASONS:
            if await asyncio.to_thread(self._identity.device_token, "node"):
                await self.forget_gateway()

    async def forget_gateway(self) -> dict[str, list[str]]:
        """The gateway no longer pairs this node (it asks for a new pairing though we hold its token): nothing
        it placed here may stay. Its turns are cancelled, then its workspaces, environment records, bundles and
        blobs deleted; the token goes last, so a clean-up cut short is done again at the next refusal."""
        dropped = await self._drop_environments(set())
        await self.pool.stop_idle()
        bundles = await self._drop_bundles(set())
        await asyncio.to_thread(self._delete_blobs)
        self._retain_sequences.clear()
        await asyncio.to_thread(self._identity.forget_device_token, "node")
        deleted = {"environments": dropped, "bundles": bundles}
        logger.warning(
            "this node's pairing with %s was removed: deleted %d environment(s) and %d bundle(s)",
            self.config.gateway_url,
            len(dropped),
            len(bundles),
        )
        self.journal.record("pairing-removed", deleted=deleted)
        return deleted

    def _delete_blobs(self) -> None:
        remove_tree(self.blobs.root)  # no workspace is left to need any of it (and no prepare runs unpaired)

    def remove_leftovers(self) -> None:
        """Staging directories a previous run of this node left behind (it was stopped mid-way)."""
        self.bundles.remove_leftovers()
        self.environments.remove_leftovers()

    async def shutdown(self) -> None:
        """Stop every worker child: running turns end (their children killed), idle children are stopped."""
        for run in list(self.runs.values()):
            run.cancelled.set()
            if run.child is not None:
                run.child.kill()
        await self.pool.wake()  # launches still waiting for a slot give up
        for run in list(self.runs.values()):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.finished.wait(), WORKER_STOP_GRACE_S)
        await self.pool.stop_idle()
        for task in list(self._background):
            task.cancel()

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.to_thread(self.remove_leftovers)
        try:
            await self.client.run_forever(
                on_connected=self._on_connected, stop=stop, on_refused=self._on_refused, on_closed=self._on_closed
            )
        finally:
            await self.shutdown()


def _record_refs(record: dict[str, Any]) -> list[str]:
    return [record[key] for key in ("preparedRef", "exportedRef", "pendingRef") if isinstance(record.get(key), str)]


def _parse_cursor(cursor: str, record: dict[str, Any]) -> tuple[str, int]:
    """``<manifestRef>@<offset>`` of the environment's last export; anything else is no longer current."""
    ref, _, offset = cursor.rpartition("@")
    if ref != record.get("exportedRef") or ref not in record["manifests"] or not offset.isdigit():
        raise invalid_request("export cursor is not current; export again without a cursor")
    return ref, int(offset)


def _os_reason(error: BaseException) -> str:
    """An OS error without its file names (they are host paths)."""
    reason = getattr(error, "strerror", None)
    return reason or type(error).__name__


def _now_ms() -> int:
    return int(time.time() * 1000)


# --- the program ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> NodeHostConfig:
    parser = argparse.ArgumentParser(prog="openclaw-node", description="Run a node host for an OpenClaw gateway.")
    parser.add_argument("--gateway", required=True, help="the gateway's WebSocket URL, e.g. ws://127.0.0.1:18789")
    parser.add_argument("--state-dir", required=True, help="where the node keeps its identity and device token")
    parser.add_argument("--capacity", type=int, default=os.cpu_count() or 1, help="worker slots (1-1024)")
    parser.add_argument(
        "--capacity-wait-ms", type=int, default=DEFAULT_CAPACITY_WAIT_MS, help="how long a launch waits for a free slot"
    )
    parser.add_argument("--token", default=None, help="the gateway's shared token (default: $OPENCLAW_GATEWAY_TOKEN)")
    parser.add_argument("--name", default=None, help="the name operators see (default: the host name)")
    parser.add_argument(
        "--exec-concurrency",
        type=int,
        default=DEFAULT_EXEC_CONCURRENCY,
        help="commands the agents' exec tool runs at once on this host (1-256)",
    )
    parser.add_argument(
        "--journal", default=None, help="append invoke errors and removal clean-ups to this JSON-lines file"
    )
    args = parser.parse_args(argv)
    if not args.gateway.startswith(("ws://", "wss://")):
        parser.error("--gateway must be a ws:// or wss:// URL")
    if not 1 <= args.capacity <= CAPACITY_MAX:
        parser.error(f"--capacity must be between 1 and {CAPACITY_MAX}")
    if args.capacity_wait_ms < 0:
        parser.error("--capacity-wait-ms must not be negative")
    if not 1 <= args.exec_concurrency <= 256:
        parser.error("--exec-concurrency must be between 1 and 256")
    return NodeHostConfig(
        gateway_url=args.gateway,
        state_dir=Path(args.state_dir).expanduser(),
        capacity=args.capacity,
        capacity_wait_ms=args.capacity_wait_ms,
        token=args.token or os.environ.get("OPENCLAW_GATEWAY_TOKEN") or None,
        display_name=args.name,
        exec_concurrency=args.exec_concurrency,
        journal_path=Path(args.journal).expanduser() if args.journal else None,
    )


async def serve(config: NodeHostConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    host = NodeHost(config)
    publishes: set[asyncio.Task] = set()

    def publish() -> None:
        task = loop.create_task(host.publish_inventory())
        publishes.add(task)
        task.add_done_callback(publishes.discard)

    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGUSR1, publish)
    await host.run(stop)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("OPENCLAW_LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config.state_dir.mkdir(parents=True, exist_ok=True)
    try:
        asyncio.run(serve(config))
    except ConnectError as refused:
        print(f"error: {refused}", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
