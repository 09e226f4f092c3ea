"""The ``local`` provider: a node host started on this machine for each environment (development, tests,
a single-machine install).

``provision`` gives the environment a node host of its own — a process running ``openclaw_client.node``
with its own state directory under the gateway's, enrolled with a pre-approved pairing (the gateway
makes its identity and node token; no operator approval is waited for) — and waits until it is
connected and hosting. From then on it is a node like any paired one, and the node worker runtime
does the rest. ``destroy`` stops the process, withdraws its pairing and deletes its state.

Profile settings: ``capacity`` (worker slots, 1–1024, default 2) and ``capacityWaitMs`` (how long a
turn waits for a free slot, default 10,000).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from devices_app.models import PairedDevice
from devices_app.services import pairing
from gateway import selectors as gateway_selectors
from gateway.audit import Actor
from gateway.background import release_database_connections
from gateway.exceptions import NotFound
from openclaw_client.identity import IdentityStore
from openclaw_client.node import NODE_HOST_CAPS, NODE_HOST_COMMANDS

from ..addresses import gateway_url
from ..models import NodeWorkerHost
from .base import Inspection, WorkerLease, WorkerProfile, WorkerProviderError

logger = logging.getLogger(__name__)
# How much of an exited node host's log the gateway's log repeats.
LOG_TAIL_BYTES = 4096

PROVIDER_ID = "local"
SETTINGS = {"capacity": (1, 1024, 2), "capacityWaitMs": (0, 600_000, 10_000)}
STOP_GRACE_S = 5.0
PID_FILE = "node-host.pid"
ACTOR = Actor("provider:local")


def lease_key(operation_id: str) -> str:
    return hashlib.sha256(operation_id.encode()).hexdigest()[:32]


def state_dir_for(lease_id: str) -> Path:
    key = lease_id.removeprefix(f"{PROVIDER_ID}:")
    if len(key) != 32 or any(c not in "0123456789abcdef" for c in key):
        raise WorkerProviderError(f"not a local worker lease: {lease_id}", code="invalid_profile")
    return Path(settings.STATE_DIR) / "local-workers" / key


def _setting(profile: WorkerProfile, name: str) -> int:
    return int(profile.settings.get(name, SETTINGS[name][2]))


def _running_pid(state_dir: Path) -> int | None:
    """The node host's pid if it is alive and still this state dir's node host (pids are reused)."""
    try:
        pid = int((state_dir / PID_FILE).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if str(state_dir).encode() in cmdline else None


def _hosting(device_id: str) -> bool:
    connection = gateway_selectors.live_node_connection(device_id)
    if connection is None:
        return False
    return NodeWorkerHost.objects.filter(node_id=device_id, conn_id=str(connection.conn_id)).exists()


class LocalProvider:
    id = PROVIDER_ID

    def validate_settings(self, settings: dict[str, Any]) -> None:
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise WorkerProviderError.invalid_profile(
                f"unknown field (allowed: {', '.join(SETTINGS)})", field=unknown[0]
            )
        for name, (low, high, _default) in SETTINGS.items():
            value = settings.get(name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
            ):
                raise WorkerProviderError.invalid_profile(f"must be an integer from {low} to {high}", field=name)

    def provision(self, profile: WorkerProfile, operation_id: str) -> WorkerLease:
        if not operation_id.strip():
            raise WorkerProviderError.invalid_profile("local worker provision needs an operation id")
        lease_id = f"{PROVIDER_ID}:{lease_key(operation_id)}"
        state_dir = state_dir_for(lease_id)
        store = IdentityStore(state_dir)
        identity = store.load_or_create()
        device_id = identity.device_id
        if _running_pid(state_dir) is None:
            # Enrolled anew for each start: the token is handed to this process only.
            _device, token = pairing.node_enroll(
                public_key=identity.public_key,
                display_name=f"local worker {lease_id[len(PROVIDER_ID) + 1 :][:8]}",
                commands=list(NODE_HOST_COMMANDS),
                caps=list(NODE_HOST_CAPS),
                actor=ACTOR,
            )
            store.save_device_token("node", token, [])
            self._start(profile, state_dir)
        deadline = time.monotonic() + settings.OPENCLAW_WORKERS["PROVIDER_TIMEOUT_MS"] / 1000 * 0.8
        while not _hosting(device_id):
            if _running_pid(state_dir) is None:
                logger.warning(
                    "local node host %s exited before it connected; the end of its log:\n%s",
                    state_dir.name,
                    _log_tail(state_dir),
                )
                raise WorkerProviderError(f"local node host exited before it connected (log: {state_dir.name})")
            if time.monotonic() >= deadline:
                raise WorkerProviderError("local node host did not connect in time")
            # The node host's connect needs a connection of this process's pool: none is held while it is awaited.
            release_database_connections()
            time.sleep(0.05)
        return WorkerLease(lease_id=lease_id, shared_host=False, node_device_id=device_id)

    def _start(self, profile: WorkerProfile, state_dir: Path) -> None:
        source_root = Path(__file__).resolve().parents[2]
        argv = [
            sys.executable,
            "-m",
            "openclaw_client.node",
            "--gateway",
            gateway_url(),
            "--state-dir",
            str(state_dir),
            "--capacity",
            str(_setting(profile, "capacity")),
            "--capacity-wait-ms",
            str(_setting(profile, "capacityWaitMs")),
            "--name",
            f"local-worker-{state_dir.name[:8]}",
        ]
        # Its own session (it outlives the process that started it), and no secret of the gateway's.
        env = {"PATH": os.defpath, "PYTHONPATH": str(source_root), "HOME": str(state_dir)}
        with open(state_dir / "node-host.log", "ab") as log:
            process = subprocess.Popen(
                argv,
                cwd=state_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (state_dir / PID_FILE).write_text(str(process.pid))
        # Reaped when it exits, so that an exited node host is not mistaken for a live one.
        threading.Thread(target=process.wait, name="local-node-host-reaper", daemon=True).start()

    def inspect(self, lease_id: str, profile: WorkerProfile) -> Inspection:
        state_dir = state_dir_for(lease_id)
        device_id = _enrolled_device(state_dir)
        if device_id is None or not PairedDevice.objects.filter(device_id=device_id, is_node=True).exists():
            return Inspection("unknown")
        if _running_pid(state_dir) is None:
            return Inspection("unknown")  # its process is gone (a reboot, a kill): so are its workers
        return Inspection("active", shared_host=False)

    def destroy(self, lease_id: str, profile: WorkerProfile) -> None:
        """Stop the node host, withdraw its pairing, delete its state (idempotent)."""
        state_dir = state_dir_for(lease_id)
        pid = _running_pid(state_dir)
        if pid is not None:
            _terminate(pid, state_dir)
        device_id = _enrolled_device(state_dir)
        if device_id is not None:
            try:
                pairing.node_remove(node_id=device_id, actor=ACTOR)
            except NotFound:
                pass
        shutil.rmtree(state_dir, ignore_errors=True)


def _log_tail(state_dir: Path) -> str:
    try:
        with open(state_dir / "node-host.log", "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - LOG_TAIL_BYTES))
            return log.read().decode("utf-8", "replace")
    except OSError as error:
        return f"(unreadable: {error.strerror})"


def _enrolled_device(state_dir: Path) -> str | None:
    if not (state_dir / "identity" / "device.json").exists():
        return None
    return IdentityStore(state_dir).load_or_create().device_id


def _terminate(pid: int, state_dir: Path) -> None:
    """SIGTERM to the node host's process group (it and its worker children), SIGKILL after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            if _running_pid(state_dir) is None:
                return
            time.sleep(0.05)
    raise WorkerProviderError.cleanup_indeterminate(f"{PROVIDER_ID}:{state_dir.name}", "the node host did not stop")
