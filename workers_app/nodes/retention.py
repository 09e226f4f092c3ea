"""What is kept (workers.md §5.3): after every (re)connect the gateway tells the node which workspaces and
bundles are still needed, and learns from the answer whether the node still holds this gateway's bundle
— the source of the public ``workerBundle`` status. On the gateway's side, synced manifests are kept
while a placement names them.
"""

from __future__ import annotations

import logging
import time
import uuid

from gateway import selectors as gateway_selectors
from gateway.selectors import now_ms

from ..bundle import current_bundle
from ..models import TERMINAL_ENVIRONMENT_STATES, Placement, PlacementState, WorkerEnvironment, WorkspaceManifest
from .calls import NodeCommandFailed, call_node
from .hosts import node_bundle_record
from .openclaw.dialect import node_speaks_openclaw
from .openclaw.retention import openclaw_retain

logger = logging.getLogger(__name__)

RETAIN_TIMEOUT_MS = 600_000
# One controller per process; its sequence only grows (a node ignores an older controller word).
CONTROLLER_ID = str(uuid.uuid4())
GATEWAY_NAMESPACE = "default"


def retain_entries(node_id: str) -> list[dict]:
    """Every environment on the node that is not over: settled ones with the manifest to keep, the
    others (mid-dispatch, mid-move) with ``manifestRefs: null`` — keep everything."""
    environments = list(
        WorkerEnvironment.objects.filter(node_device_id=node_id).exclude(state__in=TERMINAL_ENVIRONMENT_STATES)
    )
    session_ids = [env.attached_session_ids[0] for env in environments if len(env.attached_session_ids) == 1]
    manifests = dict(
        Placement.objects.filter(session__session_id__in=session_ids, state=PlacementState.ACTIVE).values_list(
            "environment_id", "workspace_base_manifest_ref"
        )
    )
    entries = []
    for environment in sorted(environments, key=lambda env: env.pk):
        attached = environment.attached_session_ids
        manifest = manifests.get(environment.pk)
        entries.append(
            {
                "environmentId": environment.pk,
                "sessionId": attached[0] if len(attached) == 1 else "",
                "generation": environment.owner_epoch,
                "manifestRefs": [manifest] if manifest else None,
            }
        )
    return entries


def node_retain(*, node_id: str, conn_id: str) -> str | None:
    """Send the retain list to the node's connection ``conn_id``; returns the bundle status it reported
    (None when that connection is gone or the node could not answer)."""
    connection = gateway_selectors.live_node_connection(node_id)
    if connection is None or str(connection.conn_id) != conn_id:
        return None
    if node_speaks_openclaw(node_id):
        return openclaw_retain(node_id=node_id, conn_id=conn_id)
    bundle = current_bundle()
    params = {
        "gatewayNamespace": GATEWAY_NAMESPACE,
        "controllerId": CONTROLLER_ID,
        "sequence": time.time_ns() // 1000,
        "retain": retain_entries(node_id),
        "bundleHashes": [bundle.sha256],
        "bundleStatusHash": bundle.sha256,
    }
    try:
        answer = call_node(node_id, "worker.workspace.retain.v1", params, timeout_ms=RETAIN_TIMEOUT_MS)
    except NodeCommandFailed as failure:
        logger.warning("retain on node %s failed: %s", node_id, failure)
        return None
    status = answer.get("bundleStatus") if isinstance(answer, dict) else None
    if status not in ("installed", "missing"):
        return None
    node_bundle_record(node_id=node_id, bundle_hash=bundle.sha256, status=status, conn_id=conn_id)
    return status


# A manifest stored by a sync whose placement has not recorded its ref yet must survive the sweep.
MANIFEST_GRACE_MS = 3_600_000


def workspace_manifests_prune() -> int:
    """Forget synced manifests no placement names any more (older than the grace period); returns how many."""
    named = Placement.objects.exclude(workspace_base_manifest_ref__isnull=True).values("workspace_base_manifest_ref")
    deleted, _ = (
        WorkspaceManifest.objects.filter(created_at_ms__lt=now_ms() - MANIFEST_GRACE_MS).exclude(ref__in=named).delete()
    )
    return deleted
