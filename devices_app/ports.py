"""What the node catalog asks of the app that runs sessions on nodes: one port, provided once at start.

A node is a paired device with the ``node`` role. What runs on it (worker slots, environments,
placements) belongs to ``workers_app``, which imports this app and so cannot be imported by it:
``WorkersConfig.ready()`` provides the :class:`NodeWorkers` port; a grep for ``provide_node_workers``
answers "who fills this?". Without it (no workers app) nodes have no worker fields and nothing to
clean up when removed.
"""

from __future__ import annotations

from typing import Any, Protocol


class NodeWorkers(Protocol):
    def node_fields(self, node_ids: set[str], live: dict[str, Any]) -> dict[str, dict]:
        """Extra ``node.list`` / ``node.describe`` fields per node id (``live``: node id → its live
        ``GatewayConnection``); nodes without any may be absent. May not repeat a catalog field."""

    def node_leaving(self, node_id: str) -> None:
        """The node's pairing is about to be removed, while it may still be connected: ask it to delete what it
        keeps for this gateway (a node that cleans up only when told). Best effort, bounded; never raises."""

    def node_removed(self, node_id: str) -> None:
        """The node's pairing was removed: clean up what ran on it before ``node.pair.remove`` answers."""


class _NoWorkers:
    def node_fields(self, node_ids: set[str], live: dict[str, Any]) -> dict[str, dict]:
        return {}

    def node_leaving(self, node_id: str) -> None:
        return None

    def node_removed(self, node_id: str) -> None:
        return None


_NO_WORKERS = _NoWorkers()
_node_workers: NodeWorkers = _NO_WORKERS


def provide_node_workers(port: NodeWorkers) -> None:
    global _node_workers
    if _node_workers is not _NO_WORKERS and _node_workers is not port:
        raise RuntimeError("the node catalog's worker port is provided once")
    _node_workers = port


def node_workers() -> NodeWorkers:
    return _node_workers
