"""The interface every worker provider implements (workers.md §6), and what it returns.

A provider leases machines (or slots on them) for worker environments. Its methods are plain
functions called from a database thread or a Celery worker, never on the gateway's event loop;
each bounds its own network waits. ``inspect`` raises :class:`WorkerProviderError` on a transient
failure (state is left alone and the error recorded) and returns ``unknown`` only when the
provider knows the lease is gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

InspectionStatus = Literal["active", "dormant", "destroyed", "unknown"]
INSPECTION_STATUSES: frozenset[str] = frozenset({"active", "dormant", "destroyed", "unknown"})
# The code of a destroy that could not reach its worker, whose credentials are revoked (a removed
# node): the teardown reports it, yet the lease is over.
CREDENTIALS_REVOKED = "credentials_revoked"


class WorkerProviderError(Exception):
    """A provider failure. ``invalid_profile`` is permanent (the profile must change);
    ``cleanup_indeterminate`` keeps cleanup ownership (teardown is retried); ``transient`` may
    succeed when retried; ``credentials_revoked`` (destroy only) ends the lease with its reason."""

    def __init__(self, message: str, *, code: str = "transient", field: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field

    @classmethod
    def invalid_profile(cls, message: str, *, field: str | None = None) -> WorkerProviderError:
        return cls(message, code="invalid_profile", field=field)

    @classmethod
    def cleanup_indeterminate(cls, lease_id: str, detail: str) -> WorkerProviderError:
        return cls(f"Cleanup of worker lease {lease_id} is indeterminate: {detail}", code="cleanup_indeterminate")


@dataclass(frozen=True)
class WorkerProfile:
    """One entry of ``OPENCLAW_WORKER_PROFILES``: which provider, how the worker runtime is installed,
    and the provider's own settings (validated by the provider at start)."""

    id: str
    provider_id: str
    install: Literal["bundle", "local"] = "bundle"
    settings: dict[str, Any] = field(default_factory=dict)

    def snapshot(self) -> dict[str, Any]:
        """What an environment records of the profile it was created from (no secrets: key refs only)."""
        return {"id": self.id, "provider": self.provider_id, "install": self.install, "settings": self.settings}


@dataclass(frozen=True)
class SshEndpoint:
    host: str
    port: int
    user: str
    host_key: str
    # Where the private key is kept ({"source": "file"|"env", "id": …}); the key itself never is.
    key_ref: dict[str, Any]


@dataclass(frozen=True)
class WorkerLease:
    lease_id: str
    shared_host: bool | None = None
    ssh: SshEndpoint | None = None
    node_device_id: str | None = None


@dataclass(frozen=True)
class Inspection:
    status: InspectionStatus
    shared_host: bool | None = None


class WorkerProvider(Protocol):
    id: str

    def validate_settings(self, settings: dict[str, Any]) -> None:
        """Check the settings a profile gives this provider; raise ``WorkerProviderError.invalid_profile``
        naming the field. Only what is present is checked here; ``provision`` requires what it needs."""

    def provision(self, profile: WorkerProfile, operation_id: str) -> WorkerLease:
        """Lease a worker machine; idempotent per ``operation_id`` (a retry after a restart gets the same lease)."""

    def inspect(self, lease_id: str, profile: WorkerProfile) -> Inspection:
        """What the provider knows of a lease; raises on a transient failure."""

    def destroy(self, lease_id: str, profile: WorkerProfile) -> None:
        """Release a lease; idempotent, returns only once teardown is proven."""
