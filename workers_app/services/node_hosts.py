"""Node worker-host declarations (workers.md §5.1): recorded per connection, read by node rows and dispatch."""

from __future__ import annotations

from openclaw_site.gateway import selectors as gateway_selectors

from ..inventory import Declaration
from ..models import NodeWorkerHost
from .placements import now_ms


def node_host_declare(*, node_id: str, conn_id: str, declaration: Declaration) -> NodeWorkerHost:
    """Replace the node's declaration with this connection's (the newest connection's word wins)."""
    host, _ = NodeWorkerHost.objects.update_or_create(
        node_id=node_id,
        defaults={
            "conn_id": conn_id,
            "protocol_features": declaration.protocol_features,
            "worker_host": declaration.worker_host,
            "update_required": declaration.update_required,
            "updated_at_ms": now_ms(),
        },
    )
    # node.list rows show the declaration: every process's memoized catalog must be refreshed.
    gateway_selectors.node_catalog_changed()
    return host
