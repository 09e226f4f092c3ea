"""Recovery (workers.md §3): at gateway start and periodically, environments are reconciled through their
providers, then placements against their environments.

Isolation is by construction: each placement is judged by its **own** ``environment_id`` and only
its own row is written, so one session's failure reason can never land in another's placement, and
a placement whose environment is healthy is never touched. Terminal facts are written once
(``placement_fail`` keeps the first ``terminal_reason``/``terminal_at_ms``), so repeated recoveries
after restarts change nothing. Work is read in pages with the environments of a page in one query.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from django.conf import settings

from gateway import metrics
from gateway import selectors as gateway_selectors
from gateway.background import executor_label
from gateway.exceptions import GatewayError
from sessions_app.models import Session

from ..models import (
    TERMINAL_ENVIRONMENT_STATES,
    EnvironmentState,
    Placement,
    PlacementState,
    WorkerEnvironment,
)
from ..nodes.retention import workspace_manifests_prune
from ..providers import WorkerProviderError
from . import environments as envs
from . import moves
from . import placements as store
from .placements import FORCED_WORKER_ABANDONMENT_ERROR, Actor, now_ms
from .teardown import (
    DESTROY_ERROR_SEPARATOR,
    UNAVAILABLE_STATES,
    disappearance_error,
    fail_in_flight,
    inspect_environment,
    is_exact_owner,
    reclaim_active,
    teardown_environment,
)

logger = logging.getLogger(__name__)

S = PlacementState
E = EnvironmentState
PAGE_SIZE = 500
IN_FLIGHT_STATES = (S.REQUESTED, S.PROVISIONING, S.SYNCING, S.STARTING, S.DRAINING, S.RECONCILING)
# Outcomes of a pass that change nothing (what it found was fine, or is another pass's to decide): not transitions.
UNCHANGED_OUTCOMES = frozenset(
    {"healthy", "terminal", "settled", "in-flight", "unleased", "active", "dormant", "raced"}
)
TURN_CLAIM_LOST_ERROR = "Active worker turn claim cannot be proven live after gateway restart"
OWNER_MISMATCH_ERROR = "Active worker placement does not match its environment owner"


@dataclass
class RecoveryReport:
    environments_seen: int = 0
    placements_seen: int = 0
    outcomes: Counter = field(default_factory=Counter)

    def transitions(self) -> list[tuple[str, int]]:
        """What the pass changed, as ``(kind:outcome, count)``: the reasons of ``openclaw_recovery_transitions``."""
        return [
            (outcome, count)
            for outcome, count in sorted(self.outcomes.items())
            if outcome.partition(":")[2] not in UNCHANGED_OUTCOMES
        ]

    def as_dict(self) -> dict:
        return {
            "environmentsSeen": self.environments_seen,
            "placementsSeen": self.placements_seen,
            **dict(sorted(self.outcomes.items())),
        }


def _actor(phase: str) -> Actor:
    return Actor(f"recovery:{phase}:{executor_label()}")


# --- environments -----------------------------------------------------------------------------------


def reconcile_environment(environment: WorkerEnvironment) -> str:
    """One environment against its provider; returns what happened (for the report)."""
    if environment.state in TERMINAL_ENVIRONMENT_STATES:
        return "terminal"  # orphaned stays orphaned, with its error: never resurrected
    if environment.destroy_requested_at_ms is not None:
        errors = teardown_environment(environment.pk, terminal_state=environment.teardown_terminal_state or "failed")
        return "teardown-failed" if errors else "torn-down"
    if environment.lease_id is None:
        return "unleased"  # requested/provisioning: their placement's recovery decides
    try:
        inspection = inspect_environment(environment)
    except WorkerProviderError as failure:
        envs.environment_record_error(environment_id=environment.pk, error=f"inspect: {failure.message}")
        return "inspect-failed"
    if inspection.status == "unknown":
        teardown_environment(environment.pk, terminal_state="failed", error=envs.PROVIDER_LOST_LEASE_ERROR)
        return "lease-unknown"
    if inspection.status == "destroyed":
        teardown_environment(environment.pk, terminal_state="failed", error=envs.DISAPPEARED_BEFORE_TEARDOWN_ERROR)
        return "disappeared"
    if inspection.status == "active" and environment.state == E.DRAINING:
        envs.environment_orphan(environment_id=environment.pk, error="Worker environment drained without a teardown")
        return "orphaned"
    return inspection.status


def reconcile_environments(report: RecoveryReport) -> None:
    after = ""
    while True:
        page = list(
            WorkerEnvironment.objects.exclude(state__in=TERMINAL_ENVIRONMENT_STATES)
            .filter(environment_id__gt=after)
            .order_by("environment_id")[:PAGE_SIZE]
        )
        if not page:
            return
        for environment in page:
            report.environments_seen += 1
            try:
                report.outcomes[f"environment:{reconcile_environment(environment)}"] += 1
            except GatewayError as conflict:
                # Another writer moved it meanwhile; the next round sees the new state.
                logger.info("environment %s changed during recovery: %s", environment.pk, conflict)
                report.outcomes["environment:raced"] += 1
        after = page[-1].environment_id


# --- placements -------------------------------------------------------------------------------------


def _driver_gone(placement: Placement, live_boot_ids: set[str], *, startup: bool) -> bool:
    """Whether the dispatch or move of ``placement`` lost its driver: a gateway process that is no longer
    live, or a stage silent past its deadline (a hung or killed Celery worker). A row with no recorded
    driver was left by a predecessor: interrupted at start, otherwise given until the deadline."""
    if now_ms() - placement.updated_at_ms > settings.OPENCLAW_WORKERS["STAGE_DEADLINE_MS"]:
        return True
    owner = placement.dispatch_owner or ""
    if owner.startswith("gateway:"):
        return owner.removeprefix("gateway:") not in live_boot_ids
    return startup and not owner


def recover_placement(
    session: Session,
    placement: Placement,
    environment: WorkerEnvironment | None,
    *,
    startup: bool,
    live_boot_ids: set[str],
    actor: Actor,
) -> str:
    if placement.state == S.ACTIVE:
        if startup and placement.turn_claim_owner == "worker":
            fail_in_flight(session, placement, TURN_CLAIM_LOST_ERROR, actor=actor)
            return "failed-turn-claim"
        error = disappearance_error(environment)
        if error is None and environment.destroy_requested_at_ms is not None:
            # The environment pass found the worker lost and could not finish tearing it down yet.
            lost = environment.teardown_terminal_state == "failed" and environment.last_error
            error = (
                f"cloud worker disappeared: {environment.last_error}"
                if lost
                else "Active worker environment is being torn down"
            )
        if error is None and environment.state in UNAVAILABLE_STATES:
            error = f"Active worker environment is {environment.state}"
        if error is None and not is_exact_owner(session, placement, environment):
            error = OWNER_MISMATCH_ERROR
        if error is None:
            return "healthy"
        outcome = reclaim_active(session, placement, environment, error, actor=actor)
        return f"active-{outcome.state}"
    if placement.state in IN_FLIGHT_STATES:
        if not _driver_gone(placement, live_boot_ids, startup=startup):
            return "in-flight"
        if placement.state in (S.DRAINING, S.RECONCILING) and moves.move_pending(session):
            recovered = moves.move_recover(session, actor=actor)
            return "in-flight" if recovered is None else f"move-{recovered.state}"
        fail_in_flight(session, placement, f"Worker dispatch interrupted in {placement.state}", actor=actor)
        return "interrupted"
    if placement.state == S.FAILED and not startup:
        return _retry_failed_teardown(session, placement, environment, actor=actor)
    return "settled"


def _retry_failed_teardown(
    session: Session, placement: Placement, environment: WorkerEnvironment | None, *, actor: Actor
) -> str:
    """A failed placement whose environment still awaits teardown: the environment pass just retried it;
    a new error is recorded as the placement's ``recovery_error`` only (its terminal facts stay)."""
    if environment is None or environment.state in TERMINAL_ENVIRONMENT_STATES:
        return "settled"
    if environment.destroy_requested_at_ms is None or not environment.last_error:
        return "settled"
    if placement.recovery_error == FORCED_WORKER_ABANDONMENT_ERROR:
        return "settled"
    _cause, separator, destroy_error = environment.last_error.partition(DESTROY_ERROR_SEPARATOR)
    if not separator:
        return "settled"
    retry_error = f"{placement.terminal_reason or placement.recovery_error}{separator}{destroy_error}"
    if store.bounded_worker_error(retry_error) == placement.recovery_error:
        return "settled"
    store.placement_fail(session=session, recovery_error=retry_error, actor=actor)
    return "teardown-retry-failed"


def recover_placements(report: RecoveryReport, *, startup: bool, actor: Actor) -> None:
    live_boot_ids = gateway_selectors.live_process_boot_ids()
    after = 0
    while True:
        page = list(
            Placement.objects.exclude(state__in=(S.LOCAL, S.RECLAIMED)).filter(pk__gt=after).order_by("pk")[:PAGE_SIZE]
        )
        if not page:
            return
        environments = WorkerEnvironment.objects.in_bulk({p.environment_id for p in page if p.environment_id})
        sessions = Session.objects.in_bulk([p.pk for p in page])
        for placement in page:
            report.placements_seen += 1
            try:
                outcome = recover_placement(
                    sessions[placement.pk],
                    placement,
                    environments.get(placement.environment_id),
                    startup=startup,
                    live_boot_ids=live_boot_ids,
                    actor=actor,
                )
            except GatewayError as conflict:
                logger.info("placement of session %s changed during recovery: %s", placement.pk, conflict)
                outcome = "raced"
            report.outcomes[f"placement:{outcome}"] += 1
        after = page[-1].pk


def workers_node_removed(node_id: str) -> RecoveryReport:
    """``node.pair.remove``: the node's environments lose their provider's recognition now (not at the next
    sweep), and the placements on them fail — before the method answers. Other sessions are untouched."""
    report = RecoveryReport()
    actor = _actor("node-removed")
    environments = list(WorkerEnvironment.objects.filter(node_device_id=node_id))
    for environment in environments:
        report.environments_seen += 1
        report.outcomes[f"environment:{reconcile_environment(environment)}"] += 1
    environment_ids = [environment.pk for environment in environments]
    placements = list(
        Placement.objects.filter(environment_id__in=environment_ids).exclude(state__in=(S.LOCAL, S.RECLAIMED))
    )
    current = WorkerEnvironment.objects.in_bulk(environment_ids)
    sessions = Session.objects.in_bulk([p.pk for p in placements])
    live_boot_ids = gateway_selectors.live_process_boot_ids()
    for placement in placements:
        report.placements_seen += 1
        outcome = recover_placement(
            sessions[placement.pk],
            placement,
            current.get(placement.environment_id),
            startup=False,
            live_boot_ids=live_boot_ids,
            actor=actor,
        )
        report.outcomes[f"placement:{outcome}"] += 1
    metrics.record_recovery_transitions("node-removed", report.transitions())
    return report


def workers_recover_startup() -> RecoveryReport:
    """At gateway start (before serving placements): everything a dead predecessor left half-done."""
    return _recover(startup=True)


def workers_recovery_sweep() -> RecoveryReport:
    """Periodically (Celery beat; the gateway loop when embedded): providers' losses and failed teardowns."""
    return _recover(startup=False)


def _recover(*, startup: bool) -> RecoveryReport:
    started = time.monotonic()
    report = RecoveryReport()
    reconcile_environments(report)
    recover_placements(report, startup=startup, actor=_actor("startup" if startup else "sweep"))
    pruned = workspace_manifests_prune()
    if pruned:
        report.outcomes["manifests:pruned"] += pruned
    metrics.record_recovery_transitions("startup" if startup else "sweep", report.transitions())
    changed = {k: v for k, v in report.outcomes.items() if not k.endswith((":healthy", ":terminal", ":settled"))}
    if changed:
        logger.info(
            "worker recovery (%s) in %.0f ms: %s",
            "startup" if startup else "sweep",
            (time.monotonic() - started) * 1000,
            changed,
        )
    return report


__all__ = [
    "RecoveryReport",
    "reconcile_environment",
    "recover_placement",
    "workers_node_removed",
    "workers_recover_startup",
    "workers_recovery_sweep",
]
