"""The dispatch stages after provisioning, through the worker runtime seam (``workers_app.runtimes``).

The node host registers the real runtime with the paired-node work; here a runtime written for the
test drives the seam, so the state machine is proven end to end: provisioning → syncing → starting →
active with a new owner epoch, and a runtime that crashes fails the placement with an error id only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sessions_app.models import Session
from workers_app import profiles, selectors
from workers_app.models import Placement, PlacementHistory, WorkerEnvironment
from workers_app.providers import Inspection, WorkerLease, WorkerProfile, providers
from workers_app.runtimes import BootstrapReceipt, WorkspaceSync, worker_runtimes
from workers_app.services import dispatch
from workers_app.services import placements as store
from workers_app.services.placements import Actor

from .test_placement_store import DISPATCH_STEPS, make_session, walk

pytestmark = pytest.mark.django_db

BUNDLE = "c" * 64
MANIFEST = "sha256:" + "d" * 64


@dataclass
class LeasingProvider:
    id: str = "leasing"
    leases: list[str] = field(default_factory=list)

    def validate_settings(self, settings):
        return None

    def provision(self, profile, operation_id):
        self.leases.append(operation_id)
        return WorkerLease(lease_id=f"leasing:{operation_id}", shared_host=False)

    def inspect(self, lease_id, profile):
        return Inspection("active")

    def destroy(self, lease_id, profile):
        return None


@dataclass
class ScriptedRuntime:
    crash: bool = False
    started: list[str] = field(default_factory=list)

    def bootstrap(self, environment):
        if self.crash:
            raise RuntimeError("password=hunter2 leaked from a runtime bug")
        return BootstrapReceipt(BUNDLE, "2026.9.6-django", ["worker-launch-v2"], "bundle")

    def sync_workspace(self, session, placement, environment):
        return WorkspaceSync(MANIFEST, f"/workers/{session.session_id}")

    def start(self, session, placement, environment):
        self.started.append(session.session_id)


@pytest.fixture
def runtime(monkeypatch):
    provider, runtime = LeasingProvider(), ScriptedRuntime()
    providers.register(provider)
    worker_runtimes.register(provider.id, runtime)
    monkeypatch.setattr(profiles._profiles, "loaded", {"lab": WorkerProfile(id="lab", provider_id=provider.id)})
    yield runtime
    worker_runtimes.unregister(provider.id)
    providers.unregister(provider.id)


def dispatched(session: Session) -> Placement:
    placement, started = dispatch.dispatch_start(session=session, target="profile:lab", actor=Actor("test"))
    assert started
    dispatch.dispatch_advance(session_pk=session.pk, generation=placement.generation)
    return Placement.objects.get(pk=session.pk)


def test_a_dispatch_walks_every_stage_to_active_under_a_new_owner_epoch(runtime):
    session = make_session()

    placement = dispatched(session)

    environment = WorkerEnvironment.objects.get(pk=placement.environment_id)
    assert (placement.state, placement.generation, placement.active_owner_epoch) == ("active", 5, 1)
    assert (placement.worker_bundle_hash, placement.workspace_base_manifest_ref) == (BUNDLE, MANIFEST)
    assert (environment.state, environment.owner_epoch, environment.attached_session_ids) == (
        "attached",
        1,
        [session.session_id],
    )
    assert environment.last_activated_at_ms is not None and environment.bootstrap_bundle_hash == BUNDLE
    assert runtime.started == [session.session_id]
    assert [h.to_state for h in PlacementHistory.objects.filter(session=session).order_by("id")] == [
        "local",
        "requested",
        "provisioning",
        "syncing",
        "starting",
        "active",
    ]
    # A duplicate (redelivered) task finds the dispatch done and changes nothing.
    assert dispatch.dispatch_advance(session_pk=session.pk, generation=2) == "stale"


def test_a_runtime_that_crashes_fails_the_placement_with_an_error_id_not_its_text(runtime):
    runtime.crash = True
    session = make_session()

    placement = dispatched(session)

    assert placement.state == "failed"
    assert placement.terminal_reason.startswith("Worker dispatch failed in provisioning: internal error (errorId=")
    assert "hunter2" not in placement.terminal_reason
    assert WorkerEnvironment.objects.get(pk=placement.environment_id).state == "failed"  # its lease released


# --- when each stage started --------------------------------------------------------------------

CLOCK_START_MS = 1_780_000_000_000


@pytest.fixture
def ticking_clock(monkeypatch):
    """Each placement write reads a time 1.5 s after the previous one, so each transition has its own."""
    ticks = iter(range(CLOCK_START_MS, CLOCK_START_MS + 1_000_000, 1500))
    monkeypatch.setattr(store, "now_ms", lambda: next(ticks))


def test_each_stage_carries_the_time_its_transition_committed_and_pending_stages_none(ticking_clock):
    session = make_session()
    placement = walk(session, DISPATCH_STEPS[:2])  # requested, provisioning, now syncing

    stages = selectors.dispatch_stages(placement)

    entered = {
        row.to_state: row.at_ms
        for row in PlacementHistory.objects.filter(session=session).exclude(to_state="local").order_by("id")
    }
    assert len(set(entered.values())) == 3  # the clock gave each transition its own time
    assert [(stage.state, stage.status, stage.entered_at_ms) for stage in stages] == [
        ("requested", "done", entered["requested"]),
        ("provisioning", "done", entered["provisioning"]),
        ("syncing", "current", entered["syncing"]),
        ("starting", "pending", None),
        ("active", "pending", None),
    ]
    assert [stage.seconds_after_request for stage in stages] == [0.0, 1.5, 3.0, None, None]


def test_a_redispatch_shows_the_times_of_the_latest_dispatch_not_the_earlier_one(ticking_clock):
    session = make_session()
    walk(session, DISPATCH_STEPS[:1])
    store.placement_fail(session=session, recovery_error="Worker dispatch failed in provisioning: gone")
    placement = walk(session, [])

    stages = selectors.dispatch_stages(placement)

    latest_request = PlacementHistory.objects.filter(session=session, to_state="requested").order_by("-id")[0]
    assert [(stage.state, stage.status, stage.entered_at_ms) for stage in stages][:2] == [
        ("requested", "current", latest_request.at_ms),
        ("provisioning", "pending", None),
    ]
