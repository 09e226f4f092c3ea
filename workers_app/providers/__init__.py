"""Worker providers, registered by id (``workers_app`` registers its own at ``ready()``; a third-party
app adds one the same way from its own ``ready()``)."""

from __future__ import annotations

import threading

from .base import (
    CREDENTIALS_REVOKED,
    INSPECTION_STATUSES,
    Inspection,
    SshEndpoint,
    WorkerLease,
    WorkerProfile,
    WorkerProvider,
    WorkerProviderError,
)


class ProviderRegistry:
    def __init__(self) -> None:
        self._providers: dict[str, WorkerProvider] = {}
        self._lock = threading.Lock()

    def register(self, provider: WorkerProvider) -> None:
        with self._lock:
            if provider.id in self._providers and self._providers[provider.id] is not provider:
                raise ValueError(f"worker provider {provider.id!r} is already registered")
            self._providers[provider.id] = provider

    def unregister(self, provider_id: str) -> None:
        with self._lock:
            self._providers.pop(provider_id, None)

    def get(self, provider_id: str) -> WorkerProvider | None:
        return self._providers.get(provider_id)

    def ids(self) -> list[str]:
        return sorted(self._providers)


providers = ProviderRegistry()

__all__ = [
    "CREDENTIALS_REVOKED",
    "INSPECTION_STATUSES",
    "Inspection",
    "ProviderRegistry",
    "SshEndpoint",
    "WorkerLease",
    "WorkerProfile",
    "WorkerProvider",
    "WorkerProviderError",
    "providers",
]
