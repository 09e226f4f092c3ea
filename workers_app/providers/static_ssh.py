"""The ``static-ssh`` provider (workers.md §6): one machine the operator already runs, reached over SSH.

Its leases are logical (``static-ssh:<operationId>``): nothing is created or torn down, so a retried
provision gets the same lease and every session placed on the profile shares the host. What the
provider does check is that the host answers: ``provision`` and ``inspect`` log in with the profile's
key, trusting the profile's ``hostKey`` and nothing else, and run ``true``.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from .base import Inspection, SshEndpoint, WorkerLease, WorkerProfile, WorkerProviderError

PROVIDER_ID = "static-ssh"
LEASE_PREFIX = f"{PROVIDER_ID}:"
SETTINGS_FIELDS = ("host", "port", "user", "hostKey", "keyRef", "connectTimeoutMs", "workDir")
# Where on the host the gateway installs its node host (absolute, or under the SSH user's home).
DEFAULT_WORK_DIR = "~/.openclaw-worker"
REQUIRED_FIELDS = ("host", "user", "hostKey", "keyRef")
KEY_REF_FIELDS = frozenset({"source", "id", "provider"})
KEY_SOURCES = ("file", "env")
DEFAULT_PORT = 22
DEFAULT_CONNECT_TIMEOUT_MS = 10_000
CONNECT_TIMEOUT_RANGE_MS = (100, 120_000)
# One OpenSSH public key line: "<type> <base64>[ comment]" (import_public_key alone would take the first of several).
HOST_KEY_LINE = re.compile(r"[A-Za-z0-9@._+-]+ [A-Za-z0-9+/]+={0,3}(?: [^\r\n]*)?")


@dataclass(frozen=True)
class _Target:
    profile_id: str
    host: str
    port: int
    user: str
    host_key: str
    key_ref: dict[str, Any]
    timeout_ms: int
    work_dir: str = DEFAULT_WORK_DIR

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class StaticSshProvider:
    id = PROVIDER_ID

    def validate_settings(self, settings: dict[str, Any]) -> None:
        unknown = sorted(set(settings) - set(SETTINGS_FIELDS))
        if unknown:
            raise WorkerProviderError.invalid_profile(
                f"unknown field (allowed: {', '.join(SETTINGS_FIELDS)})", field=unknown[0]
            )
        for name in ("host", "user"):
            if name in settings and not (isinstance(settings[name], str) and settings[name].strip()):
                raise WorkerProviderError.invalid_profile("must be a non-empty string", field=name)
        if "port" in settings:
            _check_int(settings["port"], "port", 1, 65535)
        if "connectTimeoutMs" in settings:
            _check_int(settings["connectTimeoutMs"], "connectTimeoutMs", *CONNECT_TIMEOUT_RANGE_MS)
        if "hostKey" in settings:
            _check_host_key(settings["hostKey"])
        if "keyRef" in settings:
            _check_key_ref(settings["keyRef"])
        if "workDir" in settings:
            work_dir = settings["workDir"]
            if (
                not isinstance(work_dir, str)
                or not work_dir.startswith(("/", "~/"))
                or ".." in work_dir.split("/")
                or any(ch in work_dir for ch in "\0\n")
            ):
                raise WorkerProviderError.invalid_profile(
                    "must be an absolute path or one under ~/ (no '..')", field="workDir"
                )

    def provision(self, profile: WorkerProfile, operation_id: str) -> WorkerLease:
        if not isinstance(operation_id, str) or not operation_id.strip():
            raise WorkerProviderError(f"{PROVIDER_ID} provision needs an operation id")
        target = self._target(profile)
        _probe(target)
        return WorkerLease(
            lease_id=LEASE_PREFIX + operation_id,
            shared_host=True,
            ssh=SshEndpoint(target.host, target.port, target.user, target.host_key, target.key_ref),
        )

    def inspect(self, lease_id: str, profile: WorkerProfile) -> Inspection:
        # Decided before any network: the disappearance proof relies on a bare prefix being unknown.
        if not lease_id.startswith(LEASE_PREFIX) or lease_id == LEASE_PREFIX:
            return Inspection("unknown")
        # A profile without a host is OpenClaw's dev provider: nothing to reach, the lease stands.
        if profile.settings.get("host") is not None:
            _probe(self._target(profile))
        return Inspection("active", shared_host=True)

    def destroy(self, lease_id: str, profile: WorkerProfile) -> None:
        """Releases the logical lease only: the host belongs to the operator and is shared by every
        lease of the profile, so there is nothing to tear down and nothing left to prove."""

    def _target(self, profile: WorkerProfile) -> _Target:
        # Again here: a profile restored from an environment's snapshot was never checked at start.
        settings = profile.settings
        self.validate_settings(settings)
        for name in REQUIRED_FIELDS:
            if name not in settings:
                raise WorkerProviderError.invalid_profile(f"{PROVIDER_ID} needs {name}", field=name)
        return _Target(
            profile_id=profile.id,
            host=settings["host"],
            port=settings.get("port", DEFAULT_PORT),
            user=settings["user"],
            host_key=settings["hostKey"].strip(),
            key_ref=settings["keyRef"],
            timeout_ms=settings.get("connectTimeoutMs", DEFAULT_CONNECT_TIMEOUT_MS),
            work_dir=settings.get("workDir", DEFAULT_WORK_DIR),
        )


def _check_int(value: Any, name: str, low: int, high: int) -> None:
    # bool is an int to Python, not to a profile.
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise WorkerProviderError.invalid_profile(f"must be a whole number from {low} to {high}", field=name)


def _check_host_key(value: Any) -> None:
    message = "must be one OpenSSH public key line '<type> <base64>[ comment]'"
    if not isinstance(value, str) or not HOST_KEY_LINE.fullmatch(value.strip()):
        raise WorkerProviderError.invalid_profile(message, field="hostKey")
    try:
        asyncssh.import_public_key(value.strip())
    except (asyncssh.KeyImportError, ValueError) as error:
        raise WorkerProviderError.invalid_profile(f"{message}: {error}", field="hostKey") from None


def _check_key_ref(value: Any) -> None:
    if not isinstance(value, dict):
        raise WorkerProviderError.invalid_profile('must be an object {"source": "file"|"env", "id": …}', field="keyRef")
    unknown = sorted(set(value) - KEY_REF_FIELDS)
    if unknown:
        raise WorkerProviderError.invalid_profile(
            "unknown field (allowed: source, id, provider)", field=f"keyRef.{unknown[0]}"
        )
    if value.get("source") not in KEY_SOURCES:
        raise WorkerProviderError.invalid_profile("must be 'file' or 'env'", field="keyRef.source")
    if not isinstance(value.get("id"), str) or not value["id"].strip():
        raise WorkerProviderError.invalid_profile("must be a non-empty string", field="keyRef.id")
    if "provider" in value and not isinstance(value["provider"], str):
        raise WorkerProviderError.invalid_profile("must be a string", field="keyRef.provider")


def _private_key(target: _Target) -> asyncssh.SSHKey:
    """The key the profile's keyRef points at. Errors name the profile and the reference — an environment
    variable by its name, a file only as the profile's key file (its path is the gateway host's business) —
    never what the key holds."""
    source, ref = target.key_ref["source"], target.key_ref["id"]
    if source == "file":
        named = f"the keyRef key file of profile {target.profile_id}"
        try:
            data = Path(ref).read_bytes()
        except OSError as error:
            raise WorkerProviderError.invalid_profile(
                f"{named} cannot be read: {error.strerror or type(error).__name__}", field="keyRef"
            ) from None
    else:
        named = f"the keyRef environment variable {ref} of profile {target.profile_id}"
        text = os.environ.get(ref, "")
        if not text.strip():
            raise WorkerProviderError.invalid_profile(f"{named} holds no key", field="keyRef")
        data = text.encode()
    try:
        return asyncssh.import_private_key(data)
    except (asyncssh.KeyImportError, ValueError):
        raise WorkerProviderError.invalid_profile(
            f"{named} is not an unencrypted private key (OpenSSH or PEM)", field="keyRef"
        ) from None


def _probe(target: _Target) -> None:
    """Log in and run ``true``, within ``connectTimeoutMs`` overall; any failure is transient."""
    completed = _ssh(
        target,
        "true",
        stdin=None,
        timeout_s=target.timeout_ms / 1000,
        timeout_reason=f"is unreachable: no answer within {target.timeout_ms} ms",
    )
    if completed.exit_status != 0:
        raise _failure(target, f"could not run `true` (exit status {completed.exit_status})")


def ssh_target(profile: WorkerProfile) -> _Target:
    """The profile's host as the provider reaches it (settings validated again)."""
    return StaticSshProvider()._target(profile)


def ssh_run(target: _Target, command: str, *, stdin: str, timeout_s: float) -> str:
    """Run ``command`` on the host with ``stdin`` (secrets travel there, never in the command line); its
    standard output. A failure to connect, or a non-zero exit, is a :class:`WorkerProviderError` that
    names the host and the command's last line of standard error (never what was sent)."""
    completed = _ssh(
        target, command, stdin=stdin, timeout_s=timeout_s, timeout_reason=f"did not finish within {int(timeout_s)} s"
    )
    if completed.exit_status != 0:
        errors = str(completed.stderr or "").strip().splitlines()
        raise _failure(
            target, f"failed (exit status {completed.exit_status}): {errors[-1][:300] if errors else 'no output'}"
        )
    return str(completed.stdout or "")


def _failure(target: _Target, reason: str) -> WorkerProviderError:
    return WorkerProviderError(f"{PROVIDER_ID} host {target.address} {reason}", code="transient")


def _ssh(
    target: _Target, command: str, *, stdin: str | None, timeout_s: float, timeout_reason: str
) -> asyncssh.SSHCompletedProcess:
    """Log in with the profile's key, trusting exactly its host key (no known_hosts file, ssh config or
    agent), and run ``command``. Called from database and Celery threads, never the event loop: a loop
    of its own per call."""
    key = _private_key(target)
    trusted = asyncssh.import_public_key(target.host_key)

    async def run() -> asyncssh.SSHCompletedProcess:
        async with asyncssh.connect(
            target.host,
            target.port,
            username=target.user,
            known_hosts=([trusted], [], []),
            client_keys=[key],
            agent_path=None,
            config=None,
            preferred_auth="publickey",
        ) as connection:
            return await connection.run(command, input=stdin, check=False)

    try:
        return asyncio.run(asyncio.wait_for(run(), timeout_s))
    except TimeoutError:
        raise _failure(target, timeout_reason) from None
    except asyncssh.HostKeyNotVerifiable:
        raise _failure(target, "did not present the host key of the profile's hostKey") from None
    except asyncssh.PermissionDenied:
        raise _failure(target, f"refused the keyRef key for user {target.user}") from None
    except asyncssh.Error as error:
        raise _failure(target, f"is unreachable: {error.reason}") from None
    except OSError as error:
        raise _failure(target, f"is unreachable: {_os_reason(error)}") from None


def _os_reason(error: OSError) -> str:
    # asyncio words a refused connect as "Connect call failed (addr)"; the errno says it plainly.
    # Resolver errors (socket.gaierror) have negative numbers and their own text.
    if error.errno and error.errno > 0:
        return os.strerror(error.errno)
    return error.strerror or str(error) or type(error).__name__
