"""Reads of workers_app: the public placement projection (workers.md §4.4) and environment summaries."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import Count, Q, Subquery

from devices_app import selectors as device_selectors
from gateway import selectors as gateway_selectors
from gateway import sql_reads
from gateway.cursors import cursor_decode, cursor_encode, cursor_int
from gateway.redaction import host_paths_out
from sessions_app.models import Session

from .bundle import current_bundle
from .models import (
    TERMINAL_ENVIRONMENT_STATES,
    EnvironmentState,
    NodeWorkerHost,
    Placement,
    PlacementHistory,
    PlacementMove,
    PlacementState,
    WorkerEnvironment,
)
from .nodes.inventory import UPDATE_REQUIRED_ISSUE
from .nodes.openclaw.bundle import openclaw_bundle
from .schemas import PlacementsListParams

S = PlacementState
PRE_OWNER_STATES = (S.PROVISIONING, S.SYNCING, S.STARTING)
OWNER_STATES = (S.ACTIVE, S.DRAINING, S.RECONCILING)


def placement_projection(placement: Placement, environment: WorkerEnvironment | None) -> dict[str, Any]:
    """What clients see of a placement: never turn claims, agent or session ids (workers.md §4.4)."""
    projection: dict[str, Any] = {
        "state": placement.state,
        "generation": placement.generation,
        "createdAtMs": placement.created_at_ms,
        "updatedAtMs": placement.updated_at_ms,
        "stateChangedAtMs": placement.state_changed_at_ms,
    }
    fields = {
        "environmentId": placement.environment_id,
        "activeOwnerEpoch": placement.active_owner_epoch,
        "workerBundleHash": placement.worker_bundle_hash,
        "workspaceBaseManifestRef": placement.workspace_base_manifest_ref,
        # A local worker's lies under this host's state directory: named relative to it, as session paths are.
        "remoteWorkspaceDir": host_paths_out(placement.remote_workspace_dir or "") or None,
        "lastTranscriptAckCursor": placement.last_transcript_ack_cursor,
        "lastLiveEventAckCursor": placement.last_live_event_ack_cursor,
    }
    if placement.state in (S.LOCAL, S.REQUESTED):
        shown: tuple[str, ...] = ()
    elif placement.state == S.PROVISIONING:
        shown = ("environmentId",)
    elif placement.state == S.SYNCING:
        shown = ("environmentId", "workerBundleHash")
    elif placement.state == S.STARTING:
        shown = ("environmentId", "workerBundleHash", "workspaceBaseManifestRef", "remoteWorkspaceDir")
    else:  # owner and terminal states keep every fact they still hold
        shown = tuple(fields)
    projection.update({name: fields[name] for name in shown if fields[name] is not None})
    if placement.state in (S.RECLAIMED, S.FAILED):
        if placement.terminal_reason is not None:
            projection["terminalReason"] = placement.terminal_reason
        if placement.terminal_at_ms is not None:
            projection["terminalAtMs"] = placement.terminal_at_ms
    if placement.state == S.FAILED:
        projection["recoveryError"] = placement.recovery_error
        projection["recoveryAction"] = recovery_action(placement, environment)
    if _shows_provenance(placement, environment):
        projection["providerId"] = environment.provider_id
        projection["profileId"] = environment.profile_id
    return projection


def recovery_action(placement: Placement, environment: WorkerEnvironment | None) -> str:
    """``restart`` once the environment is gone; ``stop-first`` while it still holds a live lease."""
    if environment is None or environment.state in TERMINAL_ENVIRONMENT_STATES or environment.lease_id is None:
        return "restart"
    return "stop-first"


def _shows_provenance(placement: Placement, environment: WorkerEnvironment | None) -> bool:
    """Provider and profile only for the environment this placement still owns (a reused environment,
    or a lost epoch, shows no identity)."""
    if environment is None:
        return False
    if placement.active_owner_epoch is None:
        return placement.state in PRE_OWNER_STATES
    return environment.owner_epoch == placement.active_owner_epoch


def placement_fields(sessions: Sequence[Session]) -> dict[str, dict[str, Any]]:
    """The ``placement`` field of each session row that has a placement: one query for a page of sessions (SQL
    written once per page size, ``gateway.sql_reads``: it is on every ``sessions.list``'s path), one more for
    the environments when any session is placed."""
    keys = {session.pk: session.key for session in sessions}
    if not keys:
        return {}
    placements = sql_reads.instances(Placement, _PLACEMENT_FIELDS, _placements_sql(len(keys)), list(keys))
    if not placements:
        return {}
    environment_ids = {p.environment_id for p in placements if p.environment_id}
    environments = WorkerEnvironment.objects.in_bulk(environment_ids) if environment_ids else {}
    return {keys[p.pk]: {"placement": placement_projection(p, environments.get(p.environment_id))} for p in placements}


_PLACEMENT_FIELDS = tuple(Placement._meta.concrete_fields)


@functools.lru_cache(maxsize=128)
def _placements_sql(count: int) -> str:
    placeholders = ", ".join(["%s"] * count)
    return (
        f'SELECT {sql_reads.columns(_PLACEMENT_FIELDS)} FROM "{Placement._meta.db_table}" '
        f'WHERE "{Placement._meta.pk.column}" IN ({placeholders})'
    )


def placement_for(session: Session) -> Placement | None:
    return Placement.objects.filter(pk=session.pk).first()


def move_progress(session_pk: int) -> tuple[str, str | None, str] | None:
    """The session's move in flight as ``(driver, last error, placement state)`` ("" driver: nobody drives it
    now, after a failed attempt), or None when it has none (finished, or never made)."""
    row = PlacementMove.objects.filter(session_id=session_pk).values_list("driver", "last_error").first()
    if row is None:
        return None
    state = Placement.objects.filter(pk=session_pk).values_list("state", flat=True).first()
    return row[0], row[1], state or "local"


def placement_result(session: Session) -> dict[str, Any]:
    """What sessions.dispatch / move / reclaim answer (and the JSON API's placement of one session)."""
    placement = placement_for(session)
    environment = environment_for(placement)
    return {
        "ok": True,
        "key": session.key,
        "sessionId": session.session_id,
        "placement": placement_projection(placement, environment) if placement else {"state": "local"},
    }


def _placement_key(placement: Placement) -> str:
    return cursor_encode(placement.updated_at_ms, placement.pk)


def placements_list_payload(query: PlacementsListParams) -> dict[str, Any]:
    """The JSON API's placement list: one page, most recently changed first, and the next page's cursor.

    Keyset on ``(updated_at_ms, session)``; two queries per page (the placements with their sessions,
    then their environments)."""
    qs = Placement.objects.select_related("session")
    if query.state is not None:
        qs = qs.filter(state=query.state)
    if query.environmentId is not None:
        qs = qs.filter(environment_id=query.environmentId)
    if query.cursor is not None:
        updated_at_ms, session_pk = cursor_decode(query.cursor, cursor_int, cursor_int)
        qs = qs.filter(Q(updated_at_ms__lt=updated_at_ms) | Q(updated_at_ms=updated_at_ms, pk__lt=session_pk))
    rows = list(qs.order_by("-updated_at_ms", "-pk")[: query.limit + 1])
    page, more = rows[: query.limit], len(rows) > query.limit
    environment_ids = {p.environment_id for p in page if p.environment_id}
    environments = WorkerEnvironment.objects.in_bulk(environment_ids) if environment_ids else {}
    return {
        "placements": [
            {
                "key": p.session.key,
                "sessionId": p.session.session_id,
                "placement": placement_projection(p, environments.get(p.environment_id)),
            }
            for p in page
        ],
        "nextCursor": _placement_key(page[-1]) if more else None,
    }


def placement_history(session: Session, *, limit: int = 20) -> list[PlacementHistory]:
    """The session's newest placement changes, newest first (one indexed query)."""
    return list(PlacementHistory.objects.filter(session=session).order_by("-id")[:limit])


# The dispatch path of workers.md §1.3 in order; each stage is a placement state (§4.1's flow).
DISPATCH_STAGES = (S.REQUESTED, S.PROVISIONING, S.SYNCING, S.STARTING, S.ACTIVE)


@dataclass(frozen=True)
class DispatchStage:
    state: str  # one of DISPATCH_STAGES
    status: str  # "done" | "current" | "pending" | "failed"
    entered_at_ms: int | None = None  # when the transition into it committed; None: the dispatch did not reach it
    reason: str = ""  # a failed stage: the placement's terminal reason
    requested_at_ms: int | None = None  # when the dispatch was requested (its first stage entered)

    @property
    def entered_at(self) -> datetime | None:
        return datetime.fromtimestamp(self.entered_at_ms / 1000, tz=UTC) if self.entered_at_ms is not None else None

    @property
    def seconds_after_request(self) -> float | None:
        """How long after the request this stage started (stages a second apart read alike as relative times)."""
        if self.entered_at_ms is None or self.requested_at_ms is None:
            return None
        return (self.entered_at_ms - self.requested_at_ms) / 1000


def dispatch_stages(placement: Placement | None) -> list[DispatchStage]:
    """Where the placement's latest dispatch stands, stage by stage, read from its history since that
    dispatch was requested (one indexed query). Empty when no dispatch stands behind the placement
    (local, reclaimed, canceled, moved back). A failure after the worker took the session over
    (active, or a move back in draining/reconciling) is the active stage's."""
    if placement is None or placement.state in (S.LOCAL, S.RECLAIMED):
        return []
    started = (
        PlacementHistory.objects.filter(session_id=placement.pk, to_state=S.REQUESTED).order_by("-id").values("id")[:1]
    )
    rows = PlacementHistory.objects.filter(session_id=placement.pk, id__gte=Subquery(started)).order_by("id")
    entered: dict[str, int] = {}
    failed_from: str | None = None
    for from_state, to_state, at_ms in rows.values_list("from_state", "to_state", "at_ms"):
        if to_state in (S.LOCAL, S.RECLAIMED):
            return []  # that dispatch is over
        if to_state == S.FAILED:
            failed_from = failed_from or from_state
        else:
            entered.setdefault(to_state, at_ms)
    if placement.state == S.FAILED:
        if failed_from in OWNER_STATES:
            failed_from = S.ACTIVE
        if failed_from not in DISPATCH_STAGES:
            return []
        reached, reached_status = failed_from, "failed"
    elif placement.state in DISPATCH_STAGES:
        reached = placement.state
        reached_status = "done" if reached == S.ACTIVE else "current"
    else:  # draining or reconciling: the dispatch completed, a move back is under way
        reached, reached_status = S.ACTIVE, "done"
    at = DISPATCH_STAGES.index(reached)
    stages = []
    for index, state in enumerate(DISPATCH_STAGES):
        status = "done" if index < at else reached_status if index == at else "pending"
        reason = (placement.terminal_reason or "") if status == "failed" else ""
        stages.append(
            DispatchStage(
                state=state,
                status=status,
                entered_at_ms=entered.get(state) if status != "pending" else None,
                reason=reason,
                requested_at_ms=entered.get(S.REQUESTED),
            )
        )
    return stages


def session_host_nodes() -> list[dict]:
    """Connected nodes that host sessions (dispatch targets), from the node catalog."""
    return [
        node
        for node in device_selectors.node_catalog_snapshot()
        if node.get("connected") and node.get("paired") and node.get("sessionHost")
    ]


# --- environments (workers.md §2.3) -----------------------------------------------------------------

ENVIRONMENTS_LISTED = 1000
ENVIRONMENT_STATUS = {
    "requested": "starting",
    "provisioning": "starting",
    "bootstrapping": "starting",
    "ready": "available",
    "attached": "available",
    "idle": "available",
    "draining": "stopping",
    "destroying": "stopping",
    "destroyed": "unavailable",
    "failed": "error",
    "orphaned": "error",
}


def environment_summary(environment: WorkerEnvironment, *, now_ms: int, include_prepared: bool = False) -> dict:
    """The public row of a worker environment: never its SSH endpoint's key reference."""
    cleanup_pending = environment.destroy_requested_at_ms is not None and environment.state != "destroyed"
    error = environment.last_error if environment.state in ("failed", "orphaned") or cleanup_pending else None
    worker: dict[str, Any] = {
        "profileId": environment.profile_id,
        "providerId": environment.provider_id,
        "state": environment.state,
        "ageMs": max(0, now_ms - environment.created_at_ms),
        "attachedSessionIds": sorted(set(environment.attached_session_ids or [])),
        "tunnelStatus": "stopped",
    }
    if environment.lease_id is not None:
        worker["leaseId"] = environment.lease_id
    if environment.node_device_id and environment.shared_host is False:
        worker["nodeId"] = environment.node_device_id
    if include_prepared and environment.destroy_requested_at_ms is not None:
        worker["destroyRequestedAtMs"] = environment.destroy_requested_at_ms
    if environment.state == "idle" and environment.idle_since_at_ms is not None:
        worker["idleMs"] = max(0, now_ms - environment.idle_since_at_ms)
    if error:
        worker["error"] = error
    row: dict[str, Any] = {
        "id": environment.environment_id,
        "type": "worker",
        "status": "error" if error else ENVIRONMENT_STATUS[environment.state],
        "worker": worker,
    }
    if environment.shared_host is not None:
        row["trust"] = "persistent" if environment.shared_host else "disposable"
    return row


def environments_list(*, include_prepared: bool = False) -> list[dict]:
    """The paired nodes (``node:<id>`` rows), then worker environments newest first, at most
    :data:`ENVIRONMENTS_LISTED` of those (torn-down records accumulate)."""
    now = int(time.time() * 1000)
    environments = WorkerEnvironment.objects.order_by("-created_at_ms", "environment_id")[:ENVIRONMENTS_LISTED]
    nodes = [node_environment_row(node) for node in device_selectors.node_catalog_snapshot() if node.get("paired")]
    return nodes + [environment_summary(e, now_ms=now, include_prepared=include_prepared) for e in environments]


NODE_ROW_FIELDS = (
    "platform",
    "workerBundle",
    "sessionHost",
    "workerSlots",
    "lastConnectedAtMs",
    "lastDisconnectedAtMs",
    "lastSeenAtMs",
    "lastSeenReason",
    "issues",
)


def worker_bundle_projection(host: NodeWorkerHost) -> dict[str, str] | None:
    """The node's copy of this gateway's worker bundle, as the public sees it (workers.md §5.3): exactly
    ``{status: "installed", version}`` or ``{status: "missing"}`` — never a hash or a path. None while
    unknown, or when what the node reported is about another build."""
    bundle = current_bundle()
    openclaw = openclaw_bundle()
    if host.bundle_hash == bundle.sha256:
        version = bundle.version
    elif host.bundle_hash == openclaw.bundle_hash:
        version = openclaw.openclaw_version  # what OpenClaw's node host was given
    else:
        return None
    if host.bundle_status == "installed":
        return {"status": "installed", "version": version}
    if host.bundle_status == "missing":
        return {"status": "missing"}
    return None


def node_environment_row(node: dict) -> dict:
    """A paired node as ``environments.list`` shows it (workers.md §2.3): it is a persistent host."""
    row: dict[str, Any] = {
        "id": f"node:{node['nodeId']}",
        "type": "node",
        "label": node.get("displayName") or node["nodeId"],
        "status": "available" if node.get("connected") else "unavailable",
        "trust": "persistent",
        "sessionHost": bool(node.get("sessionHost")),
    }
    row.update({name: node[name] for name in NODE_ROW_FIELDS if name in node and name not in row})
    if node.get("caps"):
        row["capabilities"] = node["caps"]
    if node.get("commands"):
        row["invocableCommands"] = node["commands"]
    return row


def environment_status(environment_id: str, *, include_prepared: bool = False) -> dict | None:
    environment = WorkerEnvironment.objects.filter(pk=environment_id).first()
    if environment is None:
        return None
    return environment_summary(environment, now_ms=int(time.time() * 1000), include_prepared=include_prepared)


def environment_for(placement: Placement | None) -> WorkerEnvironment | None:
    if placement is None or not placement.environment_id:
        return None
    return WorkerEnvironment.objects.filter(pk=placement.environment_id).first()


# --- paired nodes as worker hosts (workers.md §5.1, §2.3) ---------------------------------------------


def node_worker_fields(node_ids: set[str], live: dict) -> dict[str, dict]:
    """``sessionHost``, ``workerSlots`` and ``issues`` of node rows, from the declaration of each node's
    live connection (one query per catalog; a declaration of an earlier connection is stale)."""
    if not node_ids:
        return {}
    fields: dict[str, dict] = {}
    for host in NodeWorkerHost.objects.filter(node_id__in=node_ids):
        connection = live.get(host.node_id)
        if connection is None or str(connection.conn_id) != host.conn_id:
            continue
        worker_host = host.worker_host or {}
        row: dict[str, Any] = {"sessionHost": bool(worker_host.get("enabled"))}
        if worker_host.get("enabled"):
            row["workerSlots"] = dict(worker_host["capacity"])
        if host.update_required:
            row["issues"] = [dict(UPDATE_REQUIRED_ISSUE)]
        bundle = worker_bundle_projection(host)
        if bundle is not None:
            row["workerBundle"] = bundle
        fields[host.node_id] = row
    return fields


def session_keys_of(session_ids: set[str]) -> dict[str, str]:
    """The key of each session named by its transcript id (an environment's ``attachedSessionIds``), one query;
    an id no session holds any more is left out."""
    if not session_ids:
        return {}
    return dict(Session.objects.filter(session_id__in=session_ids).values_list("session_id", "key"))


def environments_on_nodes(node_ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    """The environments each node hosts that are not torn down, newest first, with the keys of the sessions attached
    to them: the nodes page's links to the environments and sessions (two queries whatever the number of nodes)."""
    if not node_ids:
        return {}
    environments = list(
        WorkerEnvironment.objects.filter(node_device_id__in=node_ids)
        .exclude(state=EnvironmentState.DESTROYED)
        .order_by("-created_at_ms", "environment_id")
        .values("environment_id", "node_device_id", "state", "attached_session_ids")
    )
    keys = session_keys_of({sid for row in environments for sid in row["attached_session_ids"] or []})
    hosted: dict[str, list[dict[str, Any]]] = {}
    for row in environments:
        attached = sorted(set(row["attached_session_ids"] or []))
        session_keys = [keys[session_id] for session_id in attached if session_id in keys]
        hosted.setdefault(row["node_device_id"], []).append(
            {"id": row["environment_id"], "state": row["state"], "sessionKeys": session_keys}
        )
    return hosted


# --- for /metrics (operations_app.metrics) ------------------------------------------------------------------


def placement_counts_by_state() -> dict[str, int]:
    """Placements per state, every state present (0 when none); ``placement_reconcile_idx`` leads with state."""
    counts = dict.fromkeys(PlacementState.values, 0)
    for state, count in Placement.objects.values_list("state").annotate(count=Count("pk")).order_by("state"):
        counts[state] = count
    return counts


def worker_slot_totals() -> dict[str, int]:
    """Worker slots the connected session-host nodes declare, ``busy`` and ``free`` (a declaration counts while
    the connection that sent it is live, as in :func:`node_worker_fields`)."""
    live = {
        str(conn_id)
        for conn_id in gateway_selectors.live_connections().filter(role="node").values_list("conn_id", flat=True)
    }
    totals = {"busy": 0, "free": 0}
    if not live:
        return totals
    for worker_host in NodeWorkerHost.objects.filter(conn_id__in=live).values_list("worker_host", flat=True):
        if not worker_host or not worker_host.get("enabled"):
            continue
        capacity = worker_host.get("capacity") or {}
        total, available = int(capacity.get("total") or 0), int(capacity.get("available") or 0)
        totals["free"] += max(available, 0)
        totals["busy"] += max(total - available, 0)
    return totals
