"""Which dialect a node's live connection speaks (docs/node-worker-protocol.md, "Two dialects").

The project's node host lists its private ``worker.*`` commands in ``commands``. OpenClaw's node host never
does: it proves it hosts workers by a current ``node-worker-supervisor-v6`` declaration on the same connection,
from OpenClaw's node client ids in ``node`` mode (OpenClaw's ``resolveNodeWorkerSupervisorProof``).
"""

from __future__ import annotations

import hashlib

from django.utils.crypto import salted_hmac

from gateway import selectors as gateway_selectors
from gateway.models import GatewayConnection
from gateway.node_commands import is_private_node_command

from ...models import NodeWorkerHost, WorkerEnvironment
from ..inventory import WORKER_SUPERVISOR_FEATURE

OPENCLAW_NODE_CLIENT_IDS = frozenset({"node-host", "openclaw-macos"})
NODE_CLIENT_MODE = "node"
NAMESPACE_SALT = "openclaw.node-worker.gateway-namespace"


def speaks_openclaw(connection: GatewayConnection, host: NodeWorkerHost | None) -> bool:
    """Whether ``connection`` is OpenClaw's node host with a current hosting declaration (``host``)."""
    if connection.client_id not in OPENCLAW_NODE_CLIENT_IDS or connection.client_mode != NODE_CLIENT_MODE:
        return False
    if any(is_private_node_command(command) for command in connection.commands or []):
        return False  # the project's node host (or a node that mixes dialects: not OpenClaw's)
    return bool(
        host is not None
        and host.conn_id == str(connection.conn_id)
        and host.protocol_features == [WORKER_SUPERVISOR_FEATURE]
        and host.worker_host
        and host.worker_host.get("enabled")
    )


def node_speaks_openclaw(node_id: str) -> bool:
    """Whether the node's live connection speaks OpenClaw's dialect (False when it is not connected)."""
    connection = gateway_selectors.live_node_connection(node_id)
    if connection is None:
        return False
    return speaks_openclaw(connection, NodeWorkerHost.objects.filter(node_id=node_id).first())


def gateway_namespace() -> str:
    """This gateway's ``gatewayNamespace`` on OpenClaw's nodes: stable while its secret key is, distinct per
    deployment (OpenClaw derives it from its gateway's device id; ``gateway-`` + 32 hex characters as there)."""
    digest = hashlib.sha256(salted_hmac(NAMESPACE_SALT, "v1").digest()).hexdigest()
    return f"gateway-{digest[:32]}"


def node_session_id(environment: WorkerEnvironment) -> str | None:
    """The id OpenClaw's node knows the environment's one attached session by, or None (none or several
    attached). It is the id the workspace was synced and attached under: the node keys the workspace directory
    by its digest and checks launch, exec, retain and stop against it, so a ``sessions.reset`` (a new id for
    the session, which ``attached_session_ids`` follows) must not change it."""
    attached = environment.attached_session_ids or []
    if len(attached) != 1:
        return None
    return environment.workspace_session_id or attached[0]
