"""``worker.workspace.retain.v1`` in OpenClaw's shapes (node-worker-dialect.md §1.2): after every (re)connect,
and after an environment stopped, the node is told which workspaces and bundles this gateway still needs,
deletes the rest, and says whether it holds this gateway's current bundle.

* Only environments with exactly one attached session are listed (the schema needs a session id); a
  settled one names the manifest synced to it, any other keeps all its generations (``manifestRefs: null``).
  An environment being torn down is left out: its files go.
* ``controllerId`` is one per process and ``sequence`` only grows within it; a continuation pass
  (``applied && hasMore``) repeats the same snapshot, as the node expects.
* The node's ``bundleGeneration`` is remembered per connection and sent back as
  ``acknowledgedBundleGeneration`` (the node protects bundles installed since then).
* ``bundleStatus`` is trusted only when it is about this gateway's current bundle.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache

from gateway.invoke import NodeCommandFailed

from ...models import TERMINAL_ENVIRONMENT_STATES, Placement, PlacementState, WorkerEnvironment
from ...providers import WorkerProviderError
from ..hosts import node_bundle_record, node_offers
from .bundle import openclaw_bundle
from .calls import call_openclaw
from .dialect import gateway_namespace, node_session_id
from .provisioning import openclaw_stop

logger = logging.getLogger(__name__)

RETAIN_COMMAND = "worker.workspace.retain.v1"
RETAIN_TIMEOUT_MS = 600_000
RETAIN_VERSION = 1
MANIFEST_REFS_MAX = 32
# A node that keeps answering "more" is not followed for ever.
RETAIN_PASSES_MAX = 64
CONTROLLER_ID = str(uuid.uuid4())
GENERATION_TTL_S = 7 * 24 * 3600
RESULT_KEYS = frozenset({"applied", "deleted", "hasMore", "bundleDeleted", "bundleGeneration", "bundleStatus"})
BUNDLE_HASH = re.compile(r"[a-f0-9]{64}")
MANIFEST_REF = re.compile(r"sha256:[a-f0-9]{64}")
SETTLED_STATES = (PlacementState.STARTING, PlacementState.ACTIVE, PlacementState.DRAINING, PlacementState.RECONCILING)
SAFE_INTEGER_MAX = 2**53 - 1

_sequence_lock = threading.Lock()
_last_sequence = 0


def next_sequence() -> int:
    """Strictly increasing within this controller; time-based, so forked processes that share the
    controller id also rise."""
    global _last_sequence
    with _sequence_lock:
        _last_sequence = max(_last_sequence + 1, time.time_ns() // 1000)
        return _last_sequence


@dataclass(frozen=True)
class RetainResult:
    applied: bool
    deleted: int
    has_more: bool
    bundle_generation: int | None
    bundle_status: dict[str, str] | None


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= SAFE_INTEGER_MAX


def parse_retain_result(value: Any) -> RetainResult | None:
    """OpenClaw's strict ``RetainResultSchema``, or None for anything else."""
    if not isinstance(value, dict) or not {"applied", "deleted", "hasMore"} <= set(value) <= RESULT_KEYS:
        return None
    if type(value["applied"]) is not bool or type(value["hasMore"]) is not bool or not _count(value["deleted"]):
        return None
    for optional in ("bundleDeleted", "bundleGeneration"):
        if optional in value and not _count(value[optional]):
            return None
    status = value.get("bundleStatus")
    if status is not None:
        if (
            not isinstance(status, dict)
            or set(status) != {"bundleHash", "status"}
            or not isinstance(status["bundleHash"], str)
            or not BUNDLE_HASH.fullmatch(status["bundleHash"])
            or status["status"] not in ("installed", "missing")
        ):
            return None
    elif "bundleStatus" in value:
        return None
    return RetainResult(
        applied=value["applied"],
        deleted=value["deleted"],
        has_more=value["hasMore"],
        bundle_generation=value.get("bundleGeneration"),
        bundle_status=dict(status) if status is not None else None,
    )


def _manifest_refs(placement: Placement | None, environment: WorkerEnvironment) -> list[str] | None:
    """The synced manifest of a settled placement on this environment (as OpenClaw keeps exactly that
    generation's content); None — keep everything — while a sync, a turn or a move is under way."""
    if (
        placement is None
        or placement.state not in SETTLED_STATES
        or placement.turn_claim_owner
        or placement.environment_id != environment.pk
        or not placement.workspace_base_manifest_ref
        or not MANIFEST_REF.fullmatch(placement.workspace_base_manifest_ref)
        or (placement.active_owner_epoch != environment.owner_epoch and placement.state != PlacementState.STARTING)
    ):
        return None
    return sorted({placement.workspace_base_manifest_ref})[:MANIFEST_REFS_MAX]


def retain_entries(node_id: str) -> list[dict[str, Any]]:
    """The environments the node keeps, sorted as the node sorts them; each names its session by the id the
    node synced it under (a reset since does not change it: the node would delete the workspace otherwise)."""
    environments = [
        environment
        for environment in WorkerEnvironment.objects.filter(
            node_device_id=node_id, destroy_requested_at_ms__isnull=True
        )
        .exclude(state__in=TERMINAL_ENVIRONMENT_STATES)
        .only("environment_id", "attached_session_ids", "workspace_session_id", "owner_epoch")
        if node_session_id(environment) is not None and environment.owner_epoch >= 1
    ]
    placements = {
        placement.session.session_id: placement
        for placement in Placement.objects.filter(
            session__session_id__in=[environment.attached_session_ids[0] for environment in environments]
        ).select_related("session")
    }
    entries = [
        {
            "environmentId": environment.pk,
            "sessionId": node_session_id(environment),
            "generation": environment.owner_epoch,
            "manifestRefs": _manifest_refs(placements.get(environment.attached_session_ids[0]), environment),
        }
        for environment in environments
    ]
    entries.sort(key=lambda entry: (entry["environmentId"], entry["sessionId"], entry["generation"]))
    return entries


def retained_bundle_hashes(node_id: str) -> list[str]:
    """This gateway's current bundle and every build an environment still on the node was installed with."""
    hashes = {openclaw_bundle().bundle_hash}
    for bundle_hash in (
        WorkerEnvironment.objects.filter(node_device_id=node_id)
        .exclude(state__in=TERMINAL_ENVIRONMENT_STATES)
        .exclude(bootstrap_bundle_hash__isnull=True)
        .values_list("bootstrap_bundle_hash", flat=True)
    ):
        if BUNDLE_HASH.fullmatch(bundle_hash):
            hashes.add(bundle_hash)
    return sorted(hashes)


def _generation_key(node_id: str, conn_id: str) -> str:
    return f"workers:openclaw-retain:bundle-generation:{node_id}:{conn_id}"


def retain_params(node_id: str, conn_id: str) -> dict[str, Any]:
    """The snapshot; bundles only for a node that declared bundle retention (and their status only when it
    declared that too), as OpenClaw's gateway sends them."""
    params: dict[str, Any] = {
        "version": RETAIN_VERSION,  # the one OpenClaw private command whose schema has it
        "gatewayNamespace": gateway_namespace(),
        "controllerId": CONTROLLER_ID,
        "sequence": next_sequence(),
        "retain": retain_entries(node_id),
    }
    if not node_offers(node_id, "bundleRetention"):
        return params
    params["bundleHashes"] = retained_bundle_hashes(node_id)
    acknowledged = cache.get(_generation_key(node_id, conn_id))
    if _count(acknowledged):
        params["acknowledgedBundleGeneration"] = acknowledged
    if node_offers(node_id, "bundleStatus"):
        params["bundleStatusHash"] = openclaw_bundle().bundle_hash
    return params


def openclaw_retain(*, node_id: str, conn_id: str) -> str | None:
    """Publish the retain snapshot to the node's connection ``conn_id``; returns the status of this
    gateway's bundle it reported (None when it could not answer, or said nothing about that bundle)."""
    params = retain_params(node_id, conn_id)
    bundle_hash = params.get("bundleStatusHash")
    for _pass in range(RETAIN_PASSES_MAX):
        try:
            answer = call_openclaw(node_id, RETAIN_COMMAND, params, timeout_ms=RETAIN_TIMEOUT_MS)
        except NodeCommandFailed as failure:
            logger.warning("retain on node %s failed: %s", node_id, failure)
            return None
        result = parse_retain_result(answer)
        if result is None:
            logger.warning("retain on node %s: the answer violates the retain result contract", node_id)
            return None
        if result.applied and result.bundle_generation is not None:
            cache.set(_generation_key(node_id, conn_id), result.bundle_generation, GENERATION_TTL_S)
        if result.applied and result.has_more:
            continue
        status = result.bundle_status
        if not result.applied or status is None or bundle_hash is None or status["bundleHash"] != bundle_hash:
            return None
        node_bundle_record(node_id=node_id, bundle_hash=bundle_hash, status=status["status"], conn_id=conn_id)
        return status["status"]
    logger.warning("retain on node %s still had more to delete after %d passes", node_id, RETAIN_PASSES_MAX)
    return None


# A node being removed is asked briefly: its removal does not wait on a node that does not answer.
FORGET_TIMEOUT_MS = 30_000


def forget_params(acknowledged: int | None, *, bundles: bool) -> dict[str, Any]:
    """A snapshot that keeps nothing of this gateway's: no workspace and, for a node that retains bundles, no
    bundle up to the generation ``acknowledged`` (the node protects bundles installed after it)."""
    params: dict[str, Any] = {
        "version": RETAIN_VERSION,
        "gatewayNamespace": gateway_namespace(),
        "controllerId": CONTROLLER_ID,
        "sequence": next_sequence(),
        "retain": [],
    }
    if bundles:
        params["bundleHashes"] = []
        if acknowledged is not None:
            params["acknowledgedBundleGeneration"] = acknowledged
    return params


def openclaw_node_forget(node_id: str) -> None:
    """Before the node's pairing is removed: stop its environments of this gateway, then a snapshot that keeps
    nothing, repeated with the bundle generation the node reports until nothing is left (or it stops answering).
    OpenClaw's node host deletes a gateway's files only when told; once removed it can no longer be told."""
    for environment in WorkerEnvironment.objects.filter(node_device_id=node_id).exclude(
        state__in=TERMINAL_ENVIRONMENT_STATES
    ):
        try:
            openclaw_stop(node_id, environment, timeout_ms=FORGET_TIMEOUT_MS)
        except (NodeCommandFailed, WorkerProviderError) as failure:
            logger.warning(
                "node %s did not stop environment %s before its removal: %s", node_id, environment.pk, failure
            )
    bundles = node_offers(node_id, "bundleRetention")
    acknowledged: int | None = None
    for _pass in range(RETAIN_PASSES_MAX):
        try:
            answer = call_openclaw(
                node_id, RETAIN_COMMAND, forget_params(acknowledged, bundles=bundles), timeout_ms=FORGET_TIMEOUT_MS
            )
        except NodeCommandFailed as failure:
            logger.warning("node %s did not delete this gateway's files before its removal: %s", node_id, failure)
            return
        result = parse_retain_result(answer)
        if result is None or not result.applied:
            logger.warning("node %s did not apply the snapshot that deletes this gateway's files", node_id)
            return
        current = result.bundle_generation
        if not result.has_more and (not bundles or current is None or current == acknowledged):
            return
        acknowledged = current if current is not None else acknowledged
    logger.warning("node %s still had files of this gateway after %d passes", node_id, RETAIN_PASSES_MAX)
