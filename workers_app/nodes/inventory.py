"""``node.runnerInventory.update``: what a paired node declares about hosting workers (workers.md §5.1).

The declaration is closed: exactly the shapes below, no extra keys, capacity within bounds. It is
scoped to the connection that made it; a node that reconnects declares again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WORKER_SUPERVISOR_FEATURE = "node-worker-supervisor-v6"
RETIRED_WORKER_SUPERVISOR_FEATURES = frozenset(f"node-worker-supervisor-v{n}" for n in range(1, 6))
CAPACITY_MAX = 1024
CAPACITY_REQUIRED = frozenset({"total", "available"})
CAPACITY_KEYS = frozenset({"total", "available", "reclaimableIdle"})
# Optional flags of an enabled worker host; each may only be 1 (capturedExecPolicy: true).
VERSION_FLAGS = (
    "bundlePrewarm",
    "bundleRetention",
    "bundleStatus",
    "portalStream",
    "environmentSession",
    "statusWait",
    "preparedWorkspace",
)
UPDATE_REQUIRED_ISSUE = {
    "code": "update-required",
    "action": "update-and-reconnect",
    "updateCommand": "openclaw update",
    "headlessReconnectCommand": "openclaw node restart",
}


class InvalidInventory(ValueError):
    pass


@dataclass(frozen=True)
class Declaration:
    protocol_features: list[str]
    worker_host: dict[str, Any] | None
    retired: bool = False

    @property
    def hosting(self) -> bool:
        return bool(self.worker_host and self.worker_host["enabled"])

    @property
    def update_required(self) -> bool:
        """A retired supervisor, or a host that would not keep the gateway's captured exec policy."""
        return self.retired or (self.hosting and self.worker_host.get("capturedExecPolicy") is not True)


def openclaw_update_required(worker_host: dict[str, Any] | None) -> bool:
    """A hosting declaration OpenClaw's own node host could not serve this gateway under: its launch and stop
    need the environment session, its launch the captured exec policy (``isNodeWorkerSupervisorProofCurrent``)."""
    if not worker_host or not worker_host.get("enabled"):
        return False
    return worker_host.get("environmentSession") != 1 or worker_host.get("capturedExecPolicy") is not True


def update_required_message(node_id: str) -> str:
    issue = UPDATE_REQUIRED_ISSUE
    return (
        f"device worker node {node_id} requires an update before it can host sessions; run "
        f"{issue['updateCommand']}, then reconnect it (for a headless node, run {issue['headlessReconnectCommand']})"
    )


def _integer(value: Any) -> bool:
    return type(value) is int  # not a bool, not a float that happens to be whole


def _capacity(value: Any) -> dict[str, int]:
    if not isinstance(value, dict) or not {"total", "available"} <= set(value) <= {
        "total",
        "available",
        "reclaimableIdle",
    }:
        raise InvalidInventory
    total, available = value["total"], value["available"]
    if not (_integer(total) and _integer(available) and 1 <= total <= CAPACITY_MAX and 0 <= available <= total):
        raise InvalidInventory
    capacity = {"total": total, "available": available}
    if "reclaimableIdle" in value:
        idle = value["reclaimableIdle"]
        if not (_integer(idle) and 0 <= idle <= total - available):
            raise InvalidInventory
        capacity["reclaimableIdle"] = idle
    return capacity


def _worker_host(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("enabled"), bool):
        raise InvalidInventory
    if not value["enabled"]:
        if set(value) != {"enabled"}:
            raise InvalidInventory
        return {"enabled": False}
    allowed = {"enabled", "capacity", "capturedExecPolicy", *VERSION_FLAGS}
    if not set(value) <= allowed or "capacity" not in value:
        raise InvalidInventory
    host: dict[str, Any] = {"enabled": True, "capacity": _capacity(value["capacity"])}
    for flag in VERSION_FLAGS:
        if flag in value:
            if not (_integer(value[flag]) and value[flag] == 1):
                raise InvalidInventory
            host[flag] = 1
    if "bundleStatus" in host and "bundleRetention" not in host:
        raise InvalidInventory
    if "capturedExecPolicy" in value:
        if value["capturedExecPolicy"] is not True:
            raise InvalidInventory
        host["capturedExecPolicy"] = True
    return host


def parse_declaration(value: Any) -> Declaration:
    """The declaration, or :class:`InvalidInventory` for anything else (the reference's closed shapes)."""
    if not isinstance(value, dict) or not isinstance(value.get("protocolFeatures"), list):
        raise InvalidInventory
    features = value["protocolFeatures"]
    if not features:
        if set(value) != {"protocolFeatures"}:
            raise InvalidInventory
        return Declaration([], None)
    if len(features) != 1:
        raise InvalidInventory
    feature = features[0]
    if feature in RETIRED_WORKER_SUPERVISOR_FEATURES:
        if not set(value) <= {"protocolFeatures", "workerRuns", "workerHost"}:
            raise InvalidInventory
        return Declaration([feature], None, retired=True)
    if feature != WORKER_SUPERVISOR_FEATURE or set(value) != {"protocolFeatures", "workerHost"}:
        raise InvalidInventory
    return Declaration([feature], _worker_host(value["workerHost"]))
