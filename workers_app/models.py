"""Placements of sessions on workers, the worker environments they run in, and the placements' history.

The shape rules of each state are database CHECK constraints (both vendors), not only Python
checks: a writer that bypasses the services still cannot store an impossible placement. Every
constraint names the rule of ``../shared/spec/reference/workers.md`` it enforces.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Length
from django.db.models.lookups import LessThanOrEqual

from sessions_app.models import Session

RECOVERY_ERROR_LIMIT = 1024


class PlacementState(models.TextChoices):
    LOCAL = "local"
    REQUESTED = "requested"
    PROVISIONING = "provisioning"
    SYNCING = "syncing"
    STARTING = "starting"
    ACTIVE = "active"
    DRAINING = "draining"
    RECONCILING = "reconciling"
    RECLAIMED = "reclaimed"
    FAILED = "failed"


class ExecutionMode(models.TextChoices):
    WORKER_TURN = "worker-turn"
    REMOTE_EXEC = "remote-exec"


class TurnClaimOwner(models.TextChoices):
    LOCAL = "local"
    WORKER = "worker"


S = PlacementState
# Which state may follow which (workers.md §1.3, newest). ``failed`` is entered through ``fail``.
TRANSITIONS: dict[str, frozenset[str]] = {
    S.LOCAL: frozenset({S.REQUESTED, S.FAILED}),
    S.REQUESTED: frozenset({S.PROVISIONING, S.FAILED}),
    S.PROVISIONING: frozenset({S.SYNCING, S.FAILED}),
    S.SYNCING: frozenset({S.STARTING, S.FAILED}),
    S.STARTING: frozenset({S.ACTIVE, S.FAILED}),
    S.ACTIVE: frozenset({S.DRAINING}),
    S.DRAINING: frozenset({S.RECONCILING}),
    S.RECONCILING: frozenset({S.LOCAL, S.RECLAIMED, S.FAILED}),
    S.RECLAIMED: frozenset({S.REQUESTED}),
    S.FAILED: frozenset({S.LOCAL, S.REQUESTED}),
}
TERMINAL_STATES = frozenset({S.RECLAIMED, S.FAILED})
DISPATCH_BARRIER_STATES = frozenset({S.REQUESTED, S.PROVISIONING, S.SYNCING, S.STARTING, S.DRAINING, S.RECONCILING})
OWNED_STATES = (S.ACTIVE, S.DRAINING, S.RECONCILING, S.RECLAIMED)

# The facts a placement holds about its worker; cleared whenever the session leaves one.
WORKER_FIELDS = (
    "environment_id",
    "active_owner_epoch",
    "workspace_base_manifest_ref",
    "remote_workspace_dir",
    "worker_bundle_hash",
    "last_transcript_ack_cursor",
    "last_live_event_ack_cursor",
)


def _bounded(field: str) -> LessThanOrEqual:
    return LessThanOrEqual(Length(field), RECOVERY_ERROR_LIMIT)


def _null(*fields: str) -> Q:
    return Q(**{f"{field}__isnull": True for field in fields})


def _set(*fields: str) -> Q:
    return Q(**{f"{field}__isnull": False for field in fields})


def _shape_rules() -> Q:
    """workers.md §1.2: what each state must and must not carry."""
    no_recovery = _null("recovery_error")
    ownership = _set(
        "environment_id",
        "active_owner_epoch",
        "workspace_base_manifest_ref",
        "remote_workspace_dir",
        "worker_bundle_hash",
    )
    return (
        (Q(state__in=[S.LOCAL, S.REQUESTED]) & _null(*WORKER_FIELDS) & no_recovery)
        | (Q(state=S.PROVISIONING) & _null(*(f for f in WORKER_FIELDS if f != "environment_id")) & no_recovery)
        | (
            Q(state=S.SYNCING)
            & _set("environment_id", "worker_bundle_hash")
            & _null("active_owner_epoch", "workspace_base_manifest_ref", "remote_workspace_dir")
            & no_recovery
        )
        | (
            Q(state=S.STARTING)
            & _set("environment_id", "worker_bundle_hash", "workspace_base_manifest_ref", "remote_workspace_dir")
            & _null("active_owner_epoch")
            & no_recovery
        )
        | (Q(state__in=OWNED_STATES) & ownership & no_recovery)
        | (Q(state=S.FAILED) & _set("recovery_error") & ~Q(recovery_error=""))
    )


def _turn_claim_rules() -> Q:
    """workers.md §1.2: no claim, a local claim where local work may run, or the worker owner's claim."""
    claim = ("turn_claim_id", "turn_claim_run_id", "turn_claim_generation")
    none = _null("turn_claim_owner", *claim, "turn_claim_owner_epoch")
    local = (
        Q(turn_claim_owner=TurnClaimOwner.LOCAL)
        & _set(*claim)
        & _null("turn_claim_owner_epoch")
        & (
            Q(state__in=[S.LOCAL, S.REQUESTED, S.FAILED])
            | Q(state__in=[S.ACTIVE, S.DRAINING], execution_mode=ExecutionMode.REMOTE_EXEC)
        )
    )
    worker = (
        Q(turn_claim_owner=TurnClaimOwner.WORKER)
        & _set(*claim, "turn_claim_owner_epoch")
        & Q(turn_claim_owner_epoch=models.F("active_owner_epoch"))
        & Q(state__in=[S.ACTIVE, S.DRAINING], execution_mode=ExecutionMode.WORKER_TURN)
    )
    return none | local | worker


class Placement(models.Model):
    """Where a session's turns run (``worker_session_placements``); one row per session, created at first dispatch.

    ``generation`` rises by one on every state change; every change is a compare-and-set on
    ``(state, generation)`` (``workers_app.services.placements``). ``environment_id`` is a plain
    reference, not a foreign key: a placement must outlive its environment's record to say the
    worker disappeared.
    """

    session = models.OneToOneField(Session, primary_key=True, on_delete=models.CASCADE, related_name="placement")
    # Copied at creation; a placement never moves to another session.
    agent_id = models.CharField(max_length=100)
    session_key = models.CharField(max_length=300)
    execution_mode = models.CharField(max_length=16, choices=ExecutionMode.choices, default=ExecutionMode.WORKER_TURN)
    state = models.CharField(max_length=16, choices=PlacementState.choices, default=PlacementState.LOCAL)
    generation = models.BigIntegerField(default=0)
    environment_id = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001 (NULL is a state rule)
    active_owner_epoch = models.BigIntegerField(null=True, blank=True)
    workspace_base_manifest_ref = models.CharField(max_length=80, null=True, blank=True)  # noqa: DJ001
    remote_workspace_dir = models.TextField(null=True, blank=True)  # noqa: DJ001
    worker_bundle_hash = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    last_transcript_ack_cursor = models.BigIntegerField(null=True, blank=True)
    last_live_event_ack_cursor = models.BigIntegerField(null=True, blank=True)
    recovery_error = models.TextField(null=True, blank=True)  # noqa: DJ001
    # The first failure's reason and time: written once, never recomputed (the seed's durability proof).
    terminal_reason = models.TextField(null=True, blank=True)  # noqa: DJ001
    terminal_at_ms = models.BigIntegerField(null=True, blank=True)
    turn_claim_owner = models.CharField(  # noqa: DJ001
        max_length=8, choices=TurnClaimOwner.choices, null=True, blank=True
    )
    turn_claim_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    turn_claim_run_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    turn_claim_generation = models.BigIntegerField(null=True, blank=True)
    turn_claim_owner_epoch = models.BigIntegerField(null=True, blank=True)
    # The dispatch in flight: its target ("profile:<id>" / "device:<id>", an identical retry joins it)
    # and who drives it ("gateway:<boot id>" or "celery:<host>:<pid>"; recovery fails the stage of a
    # driver that is gone). Kept after the dispatch as provenance.
    dispatch_target = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    dispatch_owner = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    created_at_ms = models.BigIntegerField()
    updated_at_ms = models.BigIntegerField()
    state_changed_at_ms = models.BigIntegerField()

    class Meta:
        indexes = [
            # Placements by session key (sessions.list pages, the dispatch barrier).
            models.Index(fields=["agent_id", "session_key"], name="placement_session_key_idx"),
            # The recovery sweep: placements to reconcile, oldest change first.
            models.Index(fields=["state", "updated_at_ms"], name="placement_reconcile_idx"),
            # Placements on one environment (disappearance, node removal).
            models.Index(fields=["environment_id"], name="placement_environment_idx"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=PlacementState.values), name="placement_state_known"),
            models.CheckConstraint(
                condition=Q(execution_mode__in=ExecutionMode.values), name="placement_execution_mode_known"
            ),
            models.CheckConstraint(condition=Q(generation__gte=0), name="placement_generation_non_negative"),
            models.CheckConstraint(
                condition=Q(active_owner_epoch__isnull=True) | Q(active_owner_epoch__gte=1),
                name="placement_owner_epoch_positive",
            ),
            models.CheckConstraint(
                condition=(Q(last_transcript_ack_cursor__isnull=True) | Q(last_transcript_ack_cursor__gte=0))
                & (Q(last_live_event_ack_cursor__isnull=True) | Q(last_live_event_ack_cursor__gte=0)),
                name="placement_cursors_non_negative",
            ),
            models.CheckConstraint(condition=_shape_rules(), name="placement_state_shape"),
            # workers.md §1.2 "terminal facts": only failed keeps a reason; only reclaimed/failed a time.
            models.CheckConstraint(
                condition=Q(terminal_reason__isnull=True) | Q(state=S.FAILED), name="placement_terminal_reason_failed"
            ),
            models.CheckConstraint(
                condition=Q(terminal_at_ms__isnull=True) | Q(state__in=[S.RECLAIMED, S.FAILED]),
                name="placement_terminal_time_terminal",
            ),
            models.CheckConstraint(
                condition=Q(state=S.RECLAIMED, turn_claim_owner__isnull=True) | ~Q(state=S.RECLAIMED),
                name="placement_reclaimed_unclaimed",
            ),
            models.CheckConstraint(condition=_turn_claim_rules(), name="placement_turn_claim_shape"),
            models.CheckConstraint(
                condition=(Q(recovery_error__isnull=True) | Q(_bounded("recovery_error")))
                & (Q(terminal_reason__isnull=True) | Q(_bounded("terminal_reason"))),
                name="placement_errors_bounded",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.session_key} {self.state}@{self.generation}"


class PlacementHistory(models.Model):
    """Every change of a placement, append-only: who moved it from which state to which, and why."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="placement_history")
    session_key = models.CharField(max_length=300)
    from_state = models.CharField(max_length=16, blank=True)  # "" for the row's creation
    to_state = models.CharField(max_length=16)
    generation = models.BigIntegerField()
    environment_id = models.CharField(max_length=128, blank=True)
    actor = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    at_ms = models.BigIntegerField()

    class Meta:
        verbose_name_plural = "placement histories"
        ordering = ["session_id", "id"]
        indexes = [
            # One placement's history, in order (admin inline, operator view).
            models.Index(fields=["session", "id"], name="placement_history_session_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.session_key}: {self.from_state or '-'} -> {self.to_state}@{self.generation}"


class MoveTargetKind(models.TextChoices):
    GATEWAY = "gateway"
    PROFILE = "profile"
    DEVICE = "device"


class PlacementMove(models.Model):
    """A persisted ``sessions.move`` intent (``worker_session_placement_moves``): a restart mid-move
    finds it and finishes or fails the move; an identical request joins it (waits for its driver)."""

    operation_id = models.CharField(max_length=80, unique=True)
    session = models.OneToOneField(Session, on_delete=models.CASCADE, related_name="placement_move")
    source_generation = models.BigIntegerField()
    source_environment_id = models.CharField(max_length=128)
    source_owner_epoch = models.BigIntegerField()
    target_kind = models.CharField(max_length=16, choices=MoveTargetKind.choices)
    target_id = models.CharField(max_length=200, blank=True)
    abandon_source = models.BooleanField(default=False)
    last_error = models.TextField(null=True, blank=True)  # noqa: DJ001
    # The call driving the move now (``<process label>/<token>``; "" between attempts): only it tears the source
    # down, an identical request waits for its outcome. ``updated_at_ms`` is its last sign of life.
    driver = models.CharField(max_length=200, blank=True, default="")
    created_at_ms = models.BigIntegerField()
    updated_at_ms = models.BigIntegerField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(target_kind__in=MoveTargetKind.values), name="move_target_kind_known"),
            models.CheckConstraint(
                condition=Q(abandon_source=False) | Q(target_kind=MoveTargetKind.GATEWAY),
                name="move_abandon_only_to_gateway",
            ),
            models.CheckConstraint(
                condition=Q(last_error__isnull=True) | Q(_bounded("last_error")), name="move_error_bounded"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id} -> {self.target_kind}:{self.target_id}"


class EnvironmentState(models.TextChoices):
    REQUESTED = "requested"
    PROVISIONING = "provisioning"
    BOOTSTRAPPING = "bootstrapping"
    READY = "ready"
    ATTACHED = "attached"
    IDLE = "idle"
    DRAINING = "draining"
    DESTROYING = "destroying"
    DESTROYED = "destroyed"
    FAILED = "failed"
    ORPHANED = "orphaned"


E = EnvironmentState
# workers.md §2.2.
ENVIRONMENT_TRANSITIONS: dict[str, frozenset[str]] = {
    E.REQUESTED: frozenset({E.PROVISIONING, E.FAILED}),
    E.PROVISIONING: frozenset({E.BOOTSTRAPPING, E.FAILED}),
    E.BOOTSTRAPPING: frozenset({E.READY, E.DRAINING, E.ORPHANED}),
    E.READY: frozenset({E.ATTACHED, E.IDLE, E.DRAINING, E.ORPHANED}),
    E.ATTACHED: frozenset({E.IDLE, E.DRAINING, E.ORPHANED}),
    E.IDLE: frozenset({E.ATTACHED, E.DRAINING, E.ORPHANED}),
    E.DRAINING: frozenset({E.DESTROYING, E.ORPHANED}),
    E.DESTROYING: frozenset({E.DESTROYED, E.ORPHANED}),
    E.DESTROYED: frozenset(),
    E.FAILED: frozenset(),
    E.ORPHANED: frozenset(),
}
TERMINAL_ENVIRONMENT_STATES = frozenset({E.DESTROYED, E.FAILED, E.ORPHANED})
UNLEASED_ENVIRONMENT_STATES = (E.REQUESTED, E.PROVISIONING, E.FAILED)


class TeardownTerminalState(models.TextChoices):
    DESTROYED = "destroyed"
    FAILED = "failed"


class WorkerEnvironment(models.Model):
    """A machine (or a paired node's slot) a provider leased for workers (``worker_environments``).

    ``owner_epoch`` is the fencing token of "who owns this box": a placement copies it into its
    ``active_owner_epoch``, and it changes whenever ownership does.
    """

    environment_id = models.CharField(max_length=128, primary_key=True)
    provider_id = models.CharField(max_length=64)
    profile_id = models.CharField(max_length=128)
    profile_snapshot = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=EnvironmentState.choices, default=EnvironmentState.REQUESTED)
    lease_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 (NULL is a state rule)
    provision_operation_id = models.CharField(max_length=200, null=True, blank=True, unique=True)
    node_device_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    ssh_host = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    ssh_port = models.IntegerField(null=True, blank=True)
    ssh_user = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    ssh_host_key = models.TextField(null=True, blank=True)  # noqa: DJ001
    # A reference to where the private key is kept, never the key; never shown to clients.
    ssh_key_ref = models.JSONField(null=True, blank=True)
    shared_host = models.BooleanField(null=True, blank=True)
    bootstrap_bundle_hash = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    bootstrap_openclaw_version = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    bootstrap_protocol_features = models.JSONField(null=True, blank=True)
    bootstrap_install_kind = models.CharField(max_length=16, null=True, blank=True)  # noqa: DJ001
    owner_epoch = models.BigIntegerField(default=0)
    teardown_terminal_state = models.CharField(  # noqa: DJ001
        max_length=16, choices=TeardownTerminalState.choices, null=True, blank=True
    )
    attached_session_ids = models.JSONField(default=list)
    # The session id the environment was attached under: a node keeps the session's workspace by it (OpenClaw's
    # node: a digest of it names the workspace directory, and every command is checked against it). A reset
    # (``sessions.reset``) moves ``attached_session_ids`` to the session's new id but not this.
    workspace_session_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    last_error = models.TextField(null=True, blank=True)  # noqa: DJ001
    created_at_ms = models.BigIntegerField()
    updated_at_ms = models.BigIntegerField()
    state_changed_at_ms = models.BigIntegerField()
    last_activated_at_ms = models.BigIntegerField(null=True, blank=True)
    idle_since_at_ms = models.BigIntegerField(null=True, blank=True)
    destroy_requested_at_ms = models.BigIntegerField(null=True, blank=True)

    class Meta:
        indexes = [
            # The reconcile sweep: environments in a state, oldest change first.
            models.Index(fields=["state", "state_changed_at_ms"], name="environment_reconcile_idx"),
            models.Index(fields=["node_device_id"], name="environment_node_idx"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=EnvironmentState.values), name="environment_state_known"),
            # workers.md §2.2: requested/provisioning/failed hold no lease; every other state does.
            models.CheckConstraint(
                condition=(Q(state__in=UNLEASED_ENVIRONMENT_STATES) & Q(lease_id__isnull=True))
                | (~Q(state__in=UNLEASED_ENVIRONMENT_STATES) & Q(lease_id__isnull=False)),
                name="environment_lease_by_state",
            ),
            models.UniqueConstraint(
                fields=["provider_id", "lease_id"],
                condition=Q(lease_id__isnull=False),
                name="environment_provider_lease_unique",
            ),
            models.CheckConstraint(condition=Q(owner_epoch__gte=0), name="environment_owner_epoch_non_negative"),
            models.CheckConstraint(
                condition=Q(ssh_port__isnull=True) | Q(ssh_port__gte=1, ssh_port__lte=65535),
                name="environment_ssh_port_range",
            ),
            models.CheckConstraint(
                condition=Q(teardown_terminal_state__isnull=True)
                | Q(teardown_terminal_state__in=TeardownTerminalState.values),
                name="environment_teardown_state_known",
            ),
            models.CheckConstraint(
                condition=Q(last_error__isnull=True) | Q(_bounded("last_error")),
                name="environment_error_bounded",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.environment_id} ({self.provider_id}, {self.state})"


class NodeWorkerHost(models.Model):
    """What a paired node last declared about hosting workers (``node.runnerInventory.update``).

    Scoped to the connection that declared it (``conn_id``): once that connection is gone the
    declaration is stale and the node shows no worker host until it declares again.
    """

    node_id = models.CharField(max_length=128, primary_key=True)
    conn_id = models.CharField(max_length=64)
    protocol_features = models.JSONField(default=list)
    # {enabled, capacity: {total, available, reclaimableIdle?}, flags…}; None when not offered.
    worker_host = models.JSONField(null=True, blank=True)
    update_required = models.BooleanField(default=False)
    # Whether this connection's node holds the worker bundle ``bundle_hash`` (from its retain answer or
    # an install receipt): "installed" | "missing", "" while unknown. Shown only as {status, version}.
    bundle_hash = models.CharField(max_length=64, blank=True, default="")
    bundle_status = models.CharField(max_length=16, blank=True, default="")
    updated_at_ms = models.BigIntegerField()

    def __str__(self) -> str:
        hosting = bool(self.worker_host and self.worker_host.get("enabled"))
        return f"{self.node_id} ({'hosting' if hosting else 'not hosting'})"


class WorkspaceManifest(models.Model):
    """A synced workspace as it was sent (docs/node-worker-protocol.md), by its content address: the base
    the node's changes are told apart from when the session comes back. Immutable; kept while a
    placement names it."""

    ref = models.CharField(max_length=71, primary_key=True)  # sha256:<64 hex>
    manifest = models.JSONField()
    created_at_ms = models.BigIntegerField()

    def __str__(self) -> str:
        return self.ref


__all__ = [
    "DISPATCH_BARRIER_STATES",
    "ENVIRONMENT_TRANSITIONS",
    "RECOVERY_ERROR_LIMIT",
    "TERMINAL_ENVIRONMENT_STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "EnvironmentState",
    "ExecutionMode",
    "NodeWorkerHost",
    "Placement",
    "PlacementHistory",
    "PlacementMove",
    "PlacementState",
    "TeardownTerminalState",
    "TurnClaimOwner",
    "WorkerEnvironment",
    "WorkspaceManifest",
]
