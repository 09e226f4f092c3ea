"""Pairing events, to the operators allowed to pair (``operator.pairing``), and nodes' resource samples, to
readers; published after commit."""

from __future__ import annotations

from gateway import scopes as sc
from gateway.events import publish_on_commit
from gateway.registry import registry

EVENT_DEVICE_PAIR_REQUESTED = registry.event("device.pair.requested", scope=sc.PAIRING)
EVENT_DEVICE_PAIR_RESOLVED = registry.event("device.pair.resolved", scope=sc.PAIRING)
EVENT_NODE_PAIR_REQUESTED = registry.event("node.pair.requested", scope=sc.PAIRING)
EVENT_NODE_PAIR_RESOLVED = registry.event("node.pair.resolved", scope=sc.PAIRING)
# A node's latest resource sample ({nodeId, hostStats}), as OpenClaw's gateway broadcasts it to readers.
EVENT_NODE_HOST_STATS = registry.event("node.hostStats", scope=sc.READ)

__all__ = [
    "EVENT_DEVICE_PAIR_REQUESTED",
    "EVENT_DEVICE_PAIR_RESOLVED",
    "EVENT_NODE_HOST_STATS",
    "EVENT_NODE_PAIR_REQUESTED",
    "EVENT_NODE_PAIR_RESOLVED",
    "publish_on_commit",
]
