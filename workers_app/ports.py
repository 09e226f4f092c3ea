"""What workers_app provides through the ports of the apps below it, once, from ``WorkersConfig.ready()``."""

from __future__ import annotations

from typing import Any

from .selectors import node_worker_fields
from .services.recovery import workers_node_removed


class WorkersOnNodes:
    """The node catalog's worker port (``devices_app.ports.NodeWorkers``)."""

    def node_fields(self, node_ids: set[str], live: dict[str, Any]) -> dict[str, dict]:
        # sessionHost, workerSlots, issues and workerBundle of each node's current declaration.
        return node_worker_fields(node_ids, live)

    def node_removed(self, node_id: str) -> None:
        # The node's environments lose their provider's recognition now and their placements fail.
        workers_node_removed(node_id)
