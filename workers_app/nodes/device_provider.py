"""The ``device`` provider (workers.md §5.4, §6): a paired node that declared itself a worker host.

Its lease is logical — ``device:<sha256(deviceId)>:<sha256(operationId)[:32]>`` on the node's own
machine — so the facts are the gateway's own: is the device still a paired node, is it connected,
and how long has it been gone.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from django.utils import timezone

from devices_app.models import PairedDevice
from gateway import selectors as gateway_selectors

from ..models import WorkerEnvironment
from ..providers.base import CREDENTIALS_REVOKED, Inspection, WorkerLease, WorkerProfile, WorkerProviderError
from .calls import NodeCommandFailed, call_node, not_connected
from .openclaw.dialect import node_speaks_openclaw
from .openclaw.provisioning import openclaw_stop
from .openclaw.retention import openclaw_retain

PROVIDER_ID = "device"
STOP_COMMAND = "worker.environment.stop.v1"
# A disconnected node's environments stay dormant this long, then its leases count as gone.
DORMANCY = timedelta(days=14)


def device_lease_id(device_id: str, operation_id: str) -> str:
    device = hashlib.sha256(device_id.encode()).hexdigest()
    operation = hashlib.sha256(operation_id.encode()).hexdigest()[:32]
    return f"{PROVIDER_ID}:{device}:{operation}"


class DeviceProvider:
    id = PROVIDER_ID

    def validate_settings(self, settings: dict[str, Any]) -> None:
        unknown = sorted(set(settings) - {"deviceId"})
        if unknown:
            raise WorkerProviderError.invalid_profile("unknown field (allowed: deviceId)", field=unknown[0])
        if "deviceId" in settings and not (isinstance(settings["deviceId"], str) and settings["deviceId"]):
            raise WorkerProviderError.invalid_profile("must be a non-empty string", field="deviceId")

    def provision(self, profile: WorkerProfile, operation_id: str) -> WorkerLease:
        device_id = _device_id(profile)
        if not PairedDevice.objects.filter(device_id=device_id, is_node=True).exists():
            raise WorkerProviderError(f"device worker is not a paired node host: {device_id}")
        if gateway_selectors.live_node_connection(device_id) is None:
            raise WorkerProviderError(not_connected(device_id))
        return WorkerLease(
            lease_id=device_lease_id(device_id, operation_id), shared_host=True, node_device_id=device_id
        )

    def inspect(self, lease_id: str, profile: WorkerProfile) -> Inspection:
        device = PairedDevice.objects.filter(device_id=_device_id(profile), is_node=True).first()
        if device is None:
            return Inspection("unknown")  # no longer a paired node: authoritative absence
        if gateway_selectors.live_node_connection(device.device_id) is not None:
            return Inspection("active", shared_host=True)
        # A record that never saw a disconnect (legacy) stays dormant.
        if device.last_disconnected_at is None or timezone.now() - device.last_disconnected_at < DORMANCY:
            return Inspection("dormant")
        return Inspection("unknown")

    def destroy(self, lease_id: str, profile: WorkerProfile) -> None:
        """The lease is logical; what must be proven is that the node stopped the lease's workers and
        deleted its workspace, which only a connected node can confirm. A paired node that is not
        connected leaves the teardown pending (the sweep retries)."""
        device_id = _device_id(profile)
        connection = gateway_selectors.live_node_connection(device_id)
        if not PairedDevice.objects.filter(device_id=device_id, is_node=True).exists():
            # No longer a node of this gateway: its stop cannot be asked for, but its credentials are
            # revoked, so it can no longer act for this gateway either — the lease is over.
            raise WorkerProviderError(not_connected(device_id), code=CREDENTIALS_REVOKED)
        if connection is None:
            raise WorkerProviderError(not_connected(device_id), code="cleanup_indeterminate")
        openclaw = node_speaks_openclaw(device_id)
        if not openclaw and STOP_COMMAND not in (connection.commands or []):
            return  # a node without the worker commands never ran anything of this gateway's
        try:
            if openclaw:
                environment = WorkerEnvironment.objects.filter(provider_id=PROVIDER_ID, lease_id=lease_id).first()
                if environment is not None:
                    openclaw_stop(device_id, environment)
                # The stop leaves the files; the snapshot without this environment deletes them.
                openclaw_retain(node_id=device_id, conn_id=str(connection.conn_id))
            else:
                call_node(device_id, STOP_COMMAND, {"leaseId": lease_id})
        except NodeCommandFailed as failure:
            if failure.code in ("NOT_CONNECTED", "TIMEOUT"):
                raise WorkerProviderError(not_connected(device_id), code="cleanup_indeterminate") from None
            raise WorkerProviderError(
                f"device worker node {device_id} could not stop the environment: {failure.message}",
                code="cleanup_indeterminate",
            ) from None


def _device_id(profile: WorkerProfile) -> str:
    device_id = profile.settings.get("deviceId")
    if not isinstance(device_id, str) or not device_id:
        raise WorkerProviderError.invalid_profile("a device profile names its deviceId", field="deviceId")
    return device_id


def device_profile(device_id: str) -> WorkerProfile:
    """The profile of a ``deviceId`` dispatch target (``device:<deviceId>``)."""
    return WorkerProfile(id=f"device:{device_id}", provider_id=PROVIDER_ID, settings={"deviceId": device_id})
