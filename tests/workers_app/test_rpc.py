"""The worker RPCs called in-process (workers.md §2.3, §4): sessions.dispatch, sessions.move,
sessions.reclaim and environments.list/status/destroy.

Every refusal is checked for its exact message and for leaving everything as it was: placements,
their history, environments and move intents (:func:`refused`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection
from django.utils import timezone
from pydantic import ValidationError

from devices_app.models import PairedDevice
from gateway import events as gateway_events
from gateway import scopes as sc
from gateway import state
from gateway.context import RpcContext
from gateway.dispatch import run_request
from gateway.exceptions import Conflict, InvalidRequest, NotFound, PermissionDenied, Unavailable
from gateway.models import GatewayConnection, GatewayProcess
from gateway.protocol import RequestFrame
from gateway.services import connections as connection_services
from sessions_app.models import Session
from sessions_app.services.sessions import session_patch
from tests.support.processes import free_port
from workers_app import profiles, rpc, selectors
from workers_app.bundle import current_bundle
from workers_app.models import (
    MoveTargetKind,
    Placement,
    PlacementHistory,
    PlacementMove,
    PlacementState,
    WorkerEnvironment,
)
from workers_app.profiles import parse_profiles
from workers_app.providers import Inspection, WorkerLease, WorkerProviderError, providers
from workers_app.schemas import (
    EnvironmentsDestroyParams,
    EnvironmentsListParams,
    EnvironmentsStatusParams,
    SessionsDispatchParams,
    SessionsMoveParams,
    SessionsReclaimParams,
)
from workers_app.services import dispatch as dispatch_service
from workers_app.services import environments as envs
from workers_app.services import placements as store
from workers_app.services.placements import FORCED_WORKER_ABANDONMENT_ERROR, Actor
from workers_app.services.recovery import workers_recover_startup

from .test_placement_store import DISPATCH_STEPS, ENV, attached_environment, dispatch_to_active, make_session, walk

pytestmark = pytest.mark.django_db

S = PlacementState
NODE = "d" * 64
KEY_PATH = "/secret/worker_key"


# --- helpers ----------------------------------------------------------------------------------


def ctx(*scopes: str) -> RpcContext:
    """An operator connection with these scopes (default: operator.admin)."""
    return RpcContext(
        conn_id="c1",
        channel_name="inmemory!c1",
        role=sc.ROLE_OPERATOR,
        scopes=list(scopes or [sc.ADMIN]),
        auth_method="token",
        client_id="test",
        client_mode="test",
    )


def world() -> dict:
    """Everything a worker RPC may change."""
    return {
        "placements": list(Placement.objects.order_by("pk").values()),
        "history": PlacementHistory.objects.count(),
        "environments": list(WorkerEnvironment.objects.order_by("pk").values()),
        "moves": list(PlacementMove.objects.order_by("pk").values()),
    }


@contextmanager
def refused(error: type[Exception], message: str, *, code: str = "INVALID_REQUEST") -> Iterator[None]:
    """The block raises ``error`` with exactly ``message`` and ``code``, and changes nothing."""
    before = world()
    with pytest.raises(error) as caught:
        yield
    assert caught.value.message == message
    assert caught.value.code == code
    assert world() == before


def dispatch(context: RpcContext, key: str, **target) -> dict:
    return asyncio.run(rpc.sessions_dispatch_rpc(context, SessionsDispatchParams(key=key, **target)))


def move(session, *, generation: int = 5, environment_id: str = ENV, epoch: int = 1, context=None, **extra) -> dict:
    params = SessionsMoveParams(
        key=session.key,
        expected={"generation": generation, "environmentId": environment_id, "ownerEpoch": epoch},
        target=extra.pop("target", {"kind": "gateway"}),
        **extra,
    )
    return asyncio.run(rpc.sessions_move_rpc(context or ctx(sc.WRITE), params))


def reclaim(session, **extra) -> dict:
    return asyncio.run(rpc.sessions_reclaim_rpc(ctx(sc.WRITE), SessionsReclaimParams(key=session.key, **extra)))


def destroy(context: RpcContext, params: EnvironmentsDestroyParams) -> dict:
    return asyncio.run(rpc.environments_destroy_rpc(context, params))


def wire(context: RpcContext, method: str, params: dict) -> dict:
    """A request through the gateway's own path: scope check, params validation, handler."""
    frame = RequestFrame(type="req", id="r1", method=method, params=params)
    return asyncio.run(run_request(context, frame))


def steps(session, *, since: int = 0) -> list[tuple[str, str, str]]:
    rows = PlacementHistory.objects.filter(session=session).order_by("pk")
    return [(row.from_state, row.to_state, row.reason) for row in rows][since:]


def archive(session) -> None:
    session_patch(key=session.key, changes={"archived": True})


@pytest.fixture
def use_profiles():
    """Install worker profiles (``OPENCLAW_WORKER_PROFILES`` entries) for one test; the previous come back."""
    saved = profiles._profiles.loaded

    def install(raw: dict) -> None:
        profiles._profiles.loaded = parse_profiles(raw, providers)

    yield install
    profiles._profiles.loaded = saved


@pytest.fixture
def dev_profile(use_profiles):
    use_profiles({"dev": {"provider": "static-ssh"}, "other": {"provider": "static-ssh"}})


def wait_for_tasks() -> None:
    for thread in threading.enumerate():
        if thread.name.startswith(state.IN_PROCESS_THREAD_PREFIX):
            thread.join(timeout=30)


@pytest.fixture
def in_process(settings, monkeypatch):
    """Dispatch tasks run in a thread of the test process; the test waits for them before the flush.

    The test process registers itself as a live gateway, as a gateway running in-process tasks is: a
    test gateway sharing this database (its recovery sweep runs every 15 s on the embedded profile)
    must see the dispatch's driver alive, not fail it as interrupted."""
    settings.OPENCLAW_TASK_MODE = "inprocess"
    settings.OPENCLAW_WORKERS = {**settings.OPENCLAW_WORKERS, "DISPATCH_WAIT_MS": 30_000, "PROVIDER_TIMEOUT_MS": 15_000}
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)
    connection_services.process_register(boot_id=state.BOOT_ID)
    yield
    wait_for_tasks()


@pytest.fixture
def published(monkeypatch) -> list[tuple[str, dict]]:
    """Events as they leave the process (after commit), from any thread."""
    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(
        gateway_events, "publish_rollback_unsafe", lambda event, payload, **_: sent.append((event, payload))
    )
    return sent


def paired_node(*, connected: bool) -> PairedDevice:
    device = PairedDevice.objects.create(
        device_id=NODE,
        public_key="pk-node",
        display_name="Node",
        platform="linux",
        roles=[sc.ROLE_NODE],
        approved_scopes=[],
        approved_at=timezone.now(),
    )
    if connected:
        now = timezone.now()
        process = GatewayProcess.objects.create(
            boot_id=uuid.uuid4(), hostname="gw-test", pid=4242, started_at=now, heartbeat_at=now
        )
        GatewayConnection.objects.create(
            conn_id=uuid.uuid4(),
            process=process,
            channel_name="inmemory!node",
            role=sc.ROLE_NODE,
            scopes=[],
            auth_method="device-token",
            device_id=NODE,
            node_id=NODE,
            client_id="node-host",
            client_mode="node",
            connected_at=now,
        )
    return device


# --- sessions.dispatch: refusals ----------------------------------------------------------------

dispatch_db = pytest.mark.django_db(transaction=True)


@dispatch_db
def test_dispatch_of_an_unknown_session_is_refused(dev_profile):
    with refused(NotFound, "session not found: agent:main:nope"):
        dispatch(ctx(), "agent:main:nope", profileId="dev")


@dispatch_db
def test_dispatch_of_an_archived_session_is_refused(dev_profile):
    session = make_session()
    archive(session)
    with refused(InvalidRequest, "cannot dispatch an archived session"):
        dispatch(ctx(), session.key, profileId="dev")


@dispatch_db
@pytest.mark.parametrize("target", [{"profileId": "dev"}, {"deviceId": NODE}])
def test_an_archived_session_is_refused_for_its_state_before_any_target_check(use_profiles, target):
    """Without cloud profiles (or with an unknown node) the session's own state still answers first."""
    use_profiles({})
    session = make_session()
    archive(session)
    before = world()
    with refused(InvalidRequest, "cannot dispatch an archived session"):
        dispatch(ctx(), session.key, **target)
    assert world() == before


@dispatch_db
def test_a_session_run_by_an_agent_harness_cannot_be_placed_on_a_worker(dev_profile):
    session = make_session()
    Session.objects.filter(pk=session.pk).update(agent_harness_id="native")
    with refused(InvalidRequest, "runtime native lacks cloud placement support"):
        dispatch(ctx(), session.key, profileId="dev")


@dispatch_db
def test_a_session_run_by_an_agent_harness_cannot_move_to_a_worker(dev_profile):
    session = make_session()
    dispatch_to_active(session)
    Session.objects.filter(pk=session.pk).update(agent_harness_id="native")
    with refused(InvalidRequest, "runtime native lacks cloud placement support"):
        move(session, target={"kind": "profile", "profileId": "dev"}, context=ctx())


TWO_TARGETS = "choose exactly one dispatch target: autoDevice, deviceId, or profileId"


def test_the_schema_refuses_a_device_and_a_profile_target_together():
    with pytest.raises(ValidationError, match=TWO_TARGETS):
        SessionsDispatchParams(key="agent:main:placed", profileId="dev", deviceId=NODE)
    response = wire(ctx(), "sessions.dispatch", {"key": "agent:main:placed", "profileId": "dev", "deviceId": NODE})
    assert response["error"] == {
        "code": "INVALID_REQUEST",
        "message": f"invalid sessions.dispatch params: at /: {TWO_TARGETS}",
    }


@pytest.mark.parametrize("target", [{"deviceId": NODE}, {"profileId": "dev"}])
def test_mixing_auto_device_with_a_target_gets_the_bare_message_on_the_wire(dev_profile, target):
    session = make_session()
    before = world()
    response = wire(ctx(), "sessions.dispatch", {"key": session.key, "autoDevice": True, **target})
    assert response["error"] == {"code": "INVALID_REQUEST", "message": TWO_TARGETS}
    assert world() == before


@dispatch_db
def test_dispatch_without_profiles_is_not_configured(use_profiles):
    use_profiles({})
    session = make_session()
    with refused(InvalidRequest, "cloud worker dispatch is not configured"):
        dispatch(ctx(), session.key, profileId="dev")


@dispatch_db
def test_dispatch_to_an_unknown_profile_is_refused(dev_profile):
    session = make_session()
    with refused(NotFound, "worker profile not found: nope"):
        dispatch(ctx(), session.key, profileId="nope")


@dispatch_db
def test_dispatch_without_a_target_is_refused(dev_profile):
    session = make_session()
    with refused(InvalidRequest, "worker dispatch target is missing"):
        dispatch(ctx(), session.key)


@dispatch_db
@pytest.mark.parametrize("target", [{"profileId": "dev"}, {}])
def test_a_profile_target_needs_operator_admin(dev_profile, target):
    session = make_session()
    with refused(PermissionDenied, "Your operator role cannot dispatch to this Cloud profile.", code="FORBIDDEN"):
        dispatch(ctx(sc.WRITE), session.key, **target)


@dispatch_db
def test_dispatch_to_a_device_that_is_not_a_paired_node_is_refused(dev_profile):
    session = make_session()
    PairedDevice.objects.create(device_id=NODE, public_key="pk", roles=[sc.ROLE_OPERATOR], approved_at=timezone.now())
    with refused(InvalidRequest, f"device worker is not a paired node host: {NODE}"):
        dispatch(ctx(sc.WRITE), session.key, deviceId=NODE)


@dispatch_db
def test_dispatch_to_a_disconnected_node_is_refused(dev_profile):
    session = make_session()
    paired_node(connected=False)
    with refused(InvalidRequest, f"device worker node is not connected: {NODE}; reconnect it before retrying"):
        dispatch(ctx(sc.WRITE), session.key, deviceId=NODE)


@dispatch_db
def test_dispatch_to_a_connected_node_that_cannot_host_is_refused(dev_profile):
    session = make_session()
    paired_node(connected=True)
    message = (
        f"device node {NODE} is connected but cannot host sessions; enable session hosting "
        "(nodeHost.workerRuns.enabled), update the node if needed, then reconnect it"
    )
    with refused(InvalidRequest, message):
        dispatch(ctx(sc.WRITE), session.key, deviceId=NODE)


def drain(session, placement):
    return store.placement_start_drain(
        session=session, environment_id=ENV, owner_epoch=1, expected_generation=placement.generation
    )


def start_reconcile(session, placement):
    return store.placement_start_reconcile(
        session=session, environment_id=ENV, owner_epoch=1, expected_generation=placement.generation
    )


@dispatch_db
@pytest.mark.parametrize("placed", ["active", "draining", "reconciling"])
def test_a_session_owned_by_a_worker_cannot_dispatch(dev_profile, placed):
    session = make_session()
    placement = dispatch_to_active(session)
    if placed in ("draining", "reconciling"):
        placement = drain(session, placement)
    if placed == "reconciling":
        start_reconcile(session, placement)
    with refused(InvalidRequest, f"session cannot dispatch from placement {placed}"):
        dispatch(ctx(), session.key, profileId="dev")


@dispatch_db
def test_a_failed_placement_whose_environment_lives_must_be_stopped_first(dev_profile):
    session = make_session()
    attached_environment(session)
    walk(session, DISPATCH_STEPS[:1])
    store.placement_fail(session=session, recovery_error="bootstrap failed")
    with refused(InvalidRequest, "cloud worker environment must be stopped before redispatch; use Stop cloud worker"):
        dispatch(ctx(), session.key, profileId="dev")


@dispatch_db
def test_an_identical_retry_joins_the_dispatch_in_flight_and_another_target_is_refused(dev_profile, settings):
    settings.OPENCLAW_WORKERS = {**settings.OPENCLAW_WORKERS, "DISPATCH_WAIT_MS": 200}
    session = make_session()
    started, _ = dispatch_service.dispatch_start(session=session, target="profile:dev", actor=Actor("first"))
    before = world()

    joined = dispatch(ctx(), session.key, profileId="dev")

    assert joined["placement"]["state"] == S.PROVISIONING
    assert joined["placement"]["generation"] == started.generation == 2
    assert world() == before  # no new generation, no history, no second environment, no task
    with refused(InvalidRequest, "session cannot dispatch from placement provisioning"):
        dispatch(ctx(), session.key, profileId="other")


# --- sessions.dispatch: a real host ---------------------------------------------------------------


def placement_states(published: list[tuple[str, dict]], session) -> list[str]:
    return [
        payload["placement"]["state"]
        for event, payload in published
        if event == "sessions.changed" and payload["reason"] == "placement" and payload["sessionKey"] == session.key
    ]


@dispatch_db
def test_a_dispatch_leases_the_host_over_ssh_then_fails_at_bootstrap_and_releases_it(
    sshd, use_profiles, in_process, published, monkeypatch, settings, tmp_path
):
    """The host is leased, but its node host cannot reach the gateway for the bundle: the bootstrap fails
    with the host's own reason, the enrollment made for it is withdrawn and the lease released."""
    work_dir = tmp_path / "worker-home"
    use_profiles({"dev": {"provider": "static-ssh", "settings": sshd.profile_settings(workDir=str(work_dir))}})
    closed_port = free_port()
    settings.OPENCLAW_WORKERS = {**settings.OPENCLAW_WORKERS, "GATEWAY_URL": f"ws://127.0.0.1:{closed_port}"}
    leases = []
    record_lease = envs.environment_record_lease
    monkeypatch.setattr(envs, "environment_record_lease", lambda **kw: leases.append(record_lease(**kw)) or leases[-1])
    session = make_session()
    environment_id = envs.environment_id_for(envs.dispatch_idempotency_key(session.session_id, 1))
    bundle = current_bundle()
    message = (
        f"Worker dispatch failed in provisioning: static-ssh host 127.0.0.1:{sshd.port} failed (exit status 1): "
        f"the gateway's worker bundle could not be fetched from "
        f"http://127.0.0.1:{closed_port}/api/workers/bundle/{bundle.sha256}: [Errno 111] Connection refused"
    )

    with pytest.raises(Unavailable) as failed:
        dispatch(ctx(), session.key, profileId="dev")

    assert (failed.value.code, failed.value.message) == ("UNAVAILABLE", message)
    assert not PairedDevice.objects.exists()  # the enrollment was withdrawn
    assert (work_dir / "state" / "identity" / "device.json").exists()  # the host keeps its identity for next time
    assert failed.value.details == {"code": "WORKER_DISPATCH_FAILED"}
    assert [(lease.state, lease.lease_id) for lease in leases] == [
        ("bootstrapping", f"static-ssh:provision:{environment_id}")
    ]
    assert "Accepted publickey" in sshd.log()
    placement = Placement.objects.get(pk=session.pk)
    assert (placement.state, placement.recovery_error, placement.terminal_reason) == (S.FAILED, message, message)
    assert placement.environment_id == environment_id
    environment = WorkerEnvironment.objects.get(pk=environment_id)
    # The lease is released: the environment failed (it never became ready), with the dispatch's error.
    assert (environment.state, environment.lease_id, environment.teardown_terminal_state) == ("failed", None, "failed")
    assert environment.last_error == message
    assert [(a, b) for a, b, _ in steps(session)] == [
        ("", S.LOCAL),
        (S.LOCAL, S.REQUESTED),
        (S.REQUESTED, S.PROVISIONING),
        (S.PROVISIONING, S.FAILED),
    ]
    assert placement_states(published, session) == [S.LOCAL, S.REQUESTED, S.PROVISIONING, S.FAILED]


@dispatch_db
def test_a_dispatch_to_a_stopped_host_fails_unreachable_and_leaves_nothing_leased(
    sshd, use_profiles, in_process, published
):
    use_profiles({"dev": {"provider": "static-ssh", "settings": sshd.profile_settings()}})
    sshd.stop()
    session = make_session()
    message = (
        "Worker dispatch failed in provisioning: "
        f"static-ssh host 127.0.0.1:{sshd.port} is unreachable: Connection refused"
    )

    with pytest.raises(Unavailable) as failed:
        dispatch(ctx(), session.key, profileId="dev")

    assert failed.value.message == message
    placement = Placement.objects.get(pk=session.pk)
    assert (placement.state, placement.recovery_error) == (S.FAILED, message)
    environment = WorkerEnvironment.objects.get(pk=placement.environment_id)
    assert (environment.state, environment.lease_id, environment.last_error) == ("failed", None, message)
    assert not WorkerEnvironment.objects.filter(lease_id__isnull=False).exists()
    assert placement_states(published, session)[-1] == S.FAILED
    # The failure is terminal but recoverable: the environment is gone, so the placement says restart.
    assert selectors.placement_projection(placement, environment)["recoveryAction"] == "restart"


@dispatch_db
def test_dispatch_to_a_profile_s_paired_node_that_is_not_connected_is_refused_and_writes_nothing(
    use_profiles, in_process, published
):
    """Point 5 of issue 26 on the provisioning path: a profile whose provider is ``device`` names a paired node;
    when that node is not connected, the dispatch is refused on the node's facts before anything is written —
    no placement, no environment, no event."""
    use_profiles({"node": {"provider": "device", "settings": {"deviceId": NODE}}})
    paired_node(connected=False)
    session = make_session()

    with refused(InvalidRequest, f"device worker node is not connected: {NODE}; reconnect it before retrying"):
        dispatch(ctx(), session.key, profileId="node")

    assert not Placement.objects.filter(pk=session.pk).exists()
    assert not WorkerEnvironment.objects.exists()
    assert placement_states(published, session) == []


@dispatch_db
def test_moving_onto_a_profile_s_paired_node_that_is_not_connected_is_refused_and_writes_nothing(
    use_profiles, in_process, published
):
    """The same refusal for ``sessions.move`` of a placed session onto such a profile: the placement, its
    environment and history stay as they were (``refused`` compares the whole world before and after)."""
    session = make_session()
    dispatch_to_active(session)
    use_profiles({"node": {"provider": "device", "settings": {"deviceId": NODE}}})
    paired_node(connected=False)

    with refused(InvalidRequest, f"device worker node is not connected: {NODE}; reconnect it before retrying"):
        move(session, target={"kind": "profile", "profileId": "node"}, context=ctx())


class GatedProvider:
    """A provider whose ``provision`` waits until the test opens the gate (a slow cloud API)."""

    id = "gated"

    def __init__(self) -> None:
        self.provisioning = threading.Event()
        self.gate = threading.Event()
        self.destroyed: list[str] = []

    def validate_settings(self, settings) -> None:
        return None

    def provision(self, profile, operation_id) -> WorkerLease:
        self.provisioning.set()
        self.gate.wait(10)
        return WorkerLease(lease_id=f"gated:{operation_id}", shared_host=False)

    def inspect(self, lease_id, profile) -> Inspection:
        return Inspection("active")

    def destroy(self, lease_id, profile) -> None:
        self.destroyed.append(lease_id)


@pytest.fixture
def gated():
    provider = GatedProvider()
    providers.register(provider)
    yield provider
    provider.gate.set()
    providers.unregister(provider.id)


@dispatch_db
def test_a_dispatch_canceled_while_the_provider_leases_releases_the_lease_it_got(
    use_profiles, in_process, gated, settings
):
    use_profiles({"gated": {"provider": "gated"}})
    settings.OPENCLAW_WORKERS = {**settings.OPENCLAW_WORKERS, "DISPATCH_WAIT_MS": 100}
    session = make_session()
    environment_id = envs.environment_id_for(envs.dispatch_idempotency_key(session.session_id, 1))

    assert dispatch(ctx(), session.key, profileId="gated")["placement"]["state"] == S.PROVISIONING
    assert gated.provisioning.wait(10)
    assert reclaim(session)["placement"]["state"] == S.LOCAL  # canceled while the provider works
    gated.gate.set()
    wait_for_tasks()

    assert gated.destroyed == [f"gated:provision:{environment_id}"]
    environment = WorkerEnvironment.objects.get(pk=environment_id)
    assert (environment.state, environment.lease_id) == ("failed", None)
    assert Placement.objects.get(pk=session.pk).state == S.LOCAL


# --- sessions.move ----------------------------------------------------------------------------------


@dispatch_db
def test_a_session_without_a_worker_cannot_move():
    session = make_session()
    with refused(InvalidRequest, "session cannot move from placement local"):
        move(session)


@dispatch_db
@pytest.mark.parametrize("stale", [{"generation": 4}, {"environment_id": "worker:other"}, {"epoch": 2}])
def test_a_move_from_a_stale_source_is_refused(stale):
    session = make_session()
    dispatch_to_active(session)
    with refused(Conflict, f"Cannot move stale worker placement for session {session.session_id}"):
        move(session, **stale)


@dispatch_db
@pytest.mark.parametrize("attached", [[], ["other-session"], "both"])
def test_a_move_whose_environment_is_not_attached_to_exactly_this_session_is_refused(attached):
    session = make_session()
    dispatch_to_active(session)
    ids = [session.session_id, "other-session"] if attached == "both" else attached
    WorkerEnvironment.objects.filter(pk=ENV).update(attached_session_ids=ids)
    with refused(Conflict, f"Cannot move stale worker environment for session {session.session_id}"):
        move(session)


@dispatch_db
def test_an_archived_session_cannot_move():
    session = make_session()
    dispatch_to_active(session)
    archive(session)
    with refused(InvalidRequest, "cannot move an archived session"):
        move(session)


@dispatch_db
def test_a_move_to_the_gateway_drains_reconciles_and_ends_local_never_reclaimed():
    session = make_session()
    dispatch_to_active(session)
    history_before = PlacementHistory.objects.count()

    result = move(session)

    assert result["ok"] is True
    assert (result["key"], result["sessionId"]) == (session.key, session.session_id)
    assert (result["placement"]["state"], result["placement"]["generation"]) == (S.LOCAL, 8)
    assert [(a, b) for a, b, _ in steps(session, since=history_before)] == [
        (S.ACTIVE, S.DRAINING),
        (S.DRAINING, S.RECONCILING),
        (S.RECONCILING, S.LOCAL),
    ]
    assert not PlacementHistory.objects.filter(session=session, to_state=S.RECLAIMED).exists()
    environment = WorkerEnvironment.objects.get(pk=ENV)
    assert (environment.state, environment.attached_session_ids) == ("destroyed", [])
    assert not PlacementMove.objects.exists()
    placement = Placement.objects.get(pk=session.pk)
    assert (placement.environment_id, placement.active_owner_epoch, placement.recovery_error) == (None, None, None)
    # Repeating the same move afterwards finds nothing to move.
    with refused(InvalidRequest, "session cannot move from placement local"):
        move(session)


@dispatch_db
def test_a_move_conflicting_with_the_persisted_intent_is_refused():
    session = make_session()
    dispatch_to_active(session)
    PlacementMove.objects.create(
        operation_id="move:v1:earlier",
        session=session,
        source_generation=5,
        source_environment_id=ENV,
        source_owner_epoch=1,
        target_kind=MoveTargetKind.PROFILE,
        target_id="dev",
        created_at_ms=1,
        updated_at_ms=1,
    )
    with refused(Conflict, f"Session {session.session_id} already has a conflicting placement move"):
        move(session)


def test_abandon_source_is_only_valid_with_the_gateway_target():
    params = {
        "key": "agent:main:placed",
        "expected": {"generation": 5, "environmentId": ENV, "ownerEpoch": 1},
        "target": {"kind": "profile", "profileId": "dev"},
        "abandonSource": True,
    }
    with pytest.raises(ValidationError, match="abandonSource is only valid with the gateway target"):
        SessionsMoveParams(**params)
    response = wire(ctx(), "sessions.move", params)
    assert response["error"] == {
        "code": "INVALID_REQUEST",
        "message": "invalid sessions.move params: at /: abandonSource is only valid with the gateway target",
    }


@dispatch_db
def test_a_force_abandoned_placement_comes_back_to_the_gateway_with_abandon_source():
    session = make_session()
    dispatch_to_active(session)
    destroy(ctx(), EnvironmentsDestroyParams(environmentId=ENV, force=True))
    failed = Placement.objects.get(pk=session.pk)
    with refused(InvalidRequest, "session cannot move from placement failed"):
        move(session, generation=failed.generation)

    result = move(session, generation=failed.generation, abandonSource=True)

    assert result["placement"]["state"] == S.LOCAL
    assert steps(session)[-1][:2] == (S.FAILED, S.LOCAL)
    assert not PlacementMove.objects.exists()


# --- sessions.reclaim --------------------------------------------------------------------------------


@dispatch_db
def test_stopping_an_active_worker_reclaims_it_and_tears_its_environment_down():
    session = make_session()
    dispatch_to_active(session)

    result = reclaim(session)

    assert result["placement"]["state"] == S.RECLAIMED
    assert [(a, b) for a, b, _ in steps(session)[-3:]] == [
        (S.ACTIVE, S.DRAINING),
        (S.DRAINING, S.RECONCILING),
        (S.RECONCILING, S.RECLAIMED),
    ]
    assert steps(session)[-1][2] == "Cloud worker stopped by operator"
    environment = WorkerEnvironment.objects.get(pk=ENV)
    assert (environment.state, environment.teardown_terminal_state) == ("destroyed", "destroyed")
    placement = Placement.objects.get(pk=session.pk)
    assert (placement.terminal_reason, placement.recovery_error) == (None, None)
    assert placement.terminal_at_ms is not None


def failed_without_environment(session) -> Placement:
    store.placement_start_dispatch(session=session)
    return store.placement_fail(session=session, recovery_error="cloud worker disappeared: environment record missing")


@dispatch_db
def test_stopping_a_failed_worker_whose_environment_is_gone_returns_the_session_local():
    session = make_session()
    failed_without_environment(session)

    result = reclaim(session)

    assert result["placement"]["state"] == S.LOCAL
    placement = Placement.objects.get(pk=session.pk)
    assert (placement.state, placement.recovery_error, placement.terminal_reason, placement.terminal_at_ms) == (
        S.LOCAL,
        None,
        None,
        None,
    )


@dispatch_db
def test_recover_to_gateway_needs_the_exact_failed_generation():
    session = make_session()
    failed = failed_without_environment(session)
    wrong = failed.generation + 1
    message = (
        f"Worker session placement {session.session_id} changed: "
        f"expected failed@{wrong}, found failed@{failed.generation}"
    )
    with refused(InvalidRequest, message):
        reclaim(session, recoverToGateway={"expectedGeneration": wrong})

    result = reclaim(session, recoverToGateway={"expectedGeneration": failed.generation})

    assert result["placement"]["state"] == S.LOCAL


@dispatch_db
def test_recover_to_gateway_tears_down_an_environment_the_failed_placement_still_holds():
    session = make_session()
    attached_environment(session)
    walk(session, DISPATCH_STEPS[:1])
    failed = store.placement_fail(session=session, recovery_error="bootstrap failed")

    reclaim(session, recoverToGateway={"expectedGeneration": failed.generation})

    environment = WorkerEnvironment.objects.get(pk=ENV)
    assert (environment.state, environment.lease_id, environment.last_error) == ("failed", None, "bootstrap failed")
    assert Placement.objects.get(pk=session.pk).state == S.LOCAL


@dispatch_db
@pytest.mark.parametrize("in_flight", [S.REQUESTED, S.PROVISIONING])
def test_stopping_a_dispatch_in_flight_cancels_it_and_returns_local(dev_profile, in_flight):
    session = make_session()
    if in_flight == S.REQUESTED:
        store.placement_start_dispatch(session=session)
    else:
        dispatch_service.dispatch_start(session=session, target="profile:dev", actor=Actor("first"))
    history_before = PlacementHistory.objects.count()

    result = reclaim(session)

    assert result["placement"]["state"] == S.LOCAL
    assert steps(session, since=history_before) == [
        (in_flight, S.FAILED, "Cloud worker provisioning canceled"),
        (S.FAILED, S.LOCAL, "Cloud worker provisioning canceled"),
    ]
    assert not WorkerEnvironment.objects.filter(lease_id__isnull=False).exists()
    assert set(WorkerEnvironment.objects.values_list("state", flat=True)) <= {"failed"}


@dispatch_db
@pytest.mark.parametrize("placed", ["local", S.SYNCING, S.STARTING, S.RECLAIMED])
def test_a_worker_that_is_not_active_failed_or_in_flight_cannot_be_stopped(placed):
    session = make_session()
    if placed == S.SYNCING:
        attached_environment(session)
        walk(session, DISPATCH_STEPS[:2])
    elif placed == S.STARTING:
        attached_environment(session)
        walk(session, DISPATCH_STEPS[:3])
    elif placed == S.RECLAIMED:
        dispatch_to_active(session)
        reclaim(session)
    with refused(InvalidRequest, f"Session {session.key} cannot stop cloud worker from placement {placed}"):
        reclaim(session)


# --- environments.list / status / destroy ------------------------------------------------------------

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDm0ZQkOB2NObOVW6IvXk2qbRsn8H6Y3jWbpNq4gZ7Ym"


def environment(environment_id: str, state: str, **fields) -> WorkerEnvironment:
    unleased = state in ("requested", "provisioning", "failed")
    now = store.now_ms()
    return WorkerEnvironment.objects.create(
        environment_id=environment_id,
        provider_id="static-ssh",
        profile_id="dev",
        state=state,
        lease_id=None if unleased else f"static-ssh:provision:{environment_id}",
        ssh_host=None if unleased else "127.0.0.1",
        ssh_port=None if unleased else 2222,
        ssh_user=None if unleased else "worker",
        ssh_host_key=None if unleased else HOST_KEY,
        ssh_key_ref=None if unleased else {"source": "file", "id": KEY_PATH},
        shared_host=None if unleased else True,
        created_at_ms=now - 5000,
        updated_at_ms=now,
        state_changed_at_ms=now,
        **fields,
    )


def status(environment_id: str, **extra) -> dict:
    return rpc.environments_status_rpc(ctx(sc.READ), EnvironmentsStatusParams(environmentId=environment_id, **extra))


def test_the_public_row_of_an_attached_environment():
    environment("worker:a", "attached", attached_session_ids=["s-2", "s-1", "s-2"], owner_epoch=3)

    row = status("worker:a")

    assert 5000 <= row["worker"].pop("ageMs") < 60_000
    assert row == {
        "id": "worker:a",
        "type": "worker",
        "status": "available",
        "trust": "persistent",
        "worker": {
            "profileId": "dev",
            "providerId": "static-ssh",
            "leaseId": "static-ssh:provision:worker:a",
            "state": "attached",
            "attachedSessionIds": ["s-1", "s-2"],
            "tunnelStatus": "stopped",
        },
    }


LATER = {"destroy_requested_at_ms": 1, "last_error": "environment destroy: provider timed out"}


@pytest.mark.parametrize(
    ("state", "fields", "expected_status", "shows_error"),
    [
        ("requested", {}, "starting", False),
        ("provisioning", {}, "starting", False),
        ("bootstrapping", {}, "starting", False),
        ("ready", {"last_error": "inspect: slow"}, "available", False),
        ("attached", {"last_error": "inspect: slow"}, "available", False),
        ("idle", {"idle_since_at_ms": 1}, "available", False),
        ("draining", {}, "stopping", False),
        ("destroying", {}, "stopping", False),
        ("destroyed", LATER, "unavailable", False),
        ("failed", {"last_error": "Worker provider no longer recognizes the lease"}, "error", True),
        ("orphaned", {"last_error": "Worker environment drained without a teardown"}, "error", True),
        ("attached", LATER, "error", True),  # cleanup pending: the error shows, and status follows
        ("draining", LATER, "error", True),
    ],
)
def test_the_public_status_of_each_state(state, fields, expected_status, shows_error):
    environment("worker:e", state, **fields)

    row = status("worker:e")

    assert row["status"] == expected_status
    assert row["worker"]["state"] == state
    assert row["worker"].get("error") == (fields["last_error"] if shows_error else None)
    assert ("idleMs" in row["worker"]) == (state == "idle")
    assert "destroyRequestedAtMs" not in row["worker"]


def test_list_shows_every_environment_and_never_its_ssh_key_or_host_key():
    environment("worker:a", "attached", attached_session_ids=["s-1"], owner_epoch=1)
    environment("worker:b", "failed", last_error="boom")
    environment("worker:c", "draining", **LATER)

    listed = rpc.environments_list_rpc(ctx(sc.READ), EnvironmentsListParams())
    detailed = rpc.environments_list_rpc(ctx(sc.READ), EnvironmentsListParams(includePreparedDetails=True))
    with_profiles = rpc.environments_list_rpc(ctx(sc.READ), EnvironmentsListParams(projection="profiles"))

    assert sorted(row["id"] for row in listed["environments"]) == ["worker:a", "worker:b", "worker:c"]
    assert "profiles" not in listed
    assert {row["id"]: row["worker"].get("destroyRequestedAtMs") for row in detailed["environments"]} == {
        "worker:a": None,
        "worker:b": None,
        "worker:c": 1,
    }
    assert isinstance(with_profiles["profiles"], list)
    text = json.dumps([listed, detailed, with_profiles])
    for secret in (KEY_PATH, HOST_KEY.split()[1], "keyRef", "hostKey", "sshHost", "127.0.0.1"):
        assert secret not in text


def test_status_of_an_unknown_environment_is_not_found():
    with refused(NotFound, "worker environment not found: worker:nope"):
        status("worker:nope")


@dispatch_db
def test_destroying_an_attached_environment_needs_force():
    session = make_session()
    dispatch_to_active(session)
    message = f"worker environment {ENV} is attached to a session; stop its cloud worker first or destroy with force"
    with refused(InvalidRequest, message):
        destroy(ctx(), EnvironmentsDestroyParams(environmentId=ENV))


@dispatch_db
def test_a_forced_destroy_abandons_the_session_result_and_destroys_the_environment():
    session = make_session()
    dispatch_to_active(session)

    result = destroy(ctx(), EnvironmentsDestroyParams(environmentId=ENV, force=True))

    assert result["ok"] is True
    assert (result["environment"]["status"], result["environment"]["worker"]["state"]) == ("unavailable", "destroyed")
    placement = Placement.objects.get(pk=session.pk)
    assert (placement.state, placement.recovery_error, placement.terminal_reason) == (
        S.FAILED,
        FORCED_WORKER_ABANDONMENT_ERROR,
        FORCED_WORKER_ABANDONMENT_ERROR,
    )
    assert [(a, b) for a, b, _ in steps(session)[-3:]] == [
        (S.ACTIVE, S.DRAINING),
        (S.DRAINING, S.RECONCILING),
        (S.RECONCILING, S.FAILED),
    ]
    environment = WorkerEnvironment.objects.get(pk=ENV)
    assert (environment.state, environment.attached_session_ids) == ("destroyed", [])


@dispatch_db
def test_destroy_of_an_unknown_environment_is_not_found():
    with refused(NotFound, "worker environment not found: worker:nope"):
        destroy(ctx(), EnvironmentsDestroyParams(environmentId="worker:nope"))


@dispatch_db
def test_destroy_needs_operator_admin_on_the_wire():
    session = make_session()
    dispatch_to_active(session)
    before = world()

    response = wire(ctx(sc.WRITE), "environments.destroy", {"environmentId": ENV, "force": True})

    assert response["error"] == {
        "code": "INVALID_REQUEST",
        "message": "missing scope: operator.admin",
        "details": {"code": "MISSING_SCOPE", "missingScope": sc.ADMIN, "requiredScopes": [sc.ADMIN]},
    }
    assert world() == before


@pytest.fixture
def destroy_fails(monkeypatch):
    """The static-ssh provider cannot release leases until the test says so (``destroy_fails.clear()``)."""
    failing = threading.Event()
    failing.set()
    provider = providers.get("static-ssh")
    release = provider.destroy

    def destroy(lease_id, profile):
        if failing.is_set():
            raise WorkerProviderError("provider API unreachable")
        return release(lease_id, profile)

    monkeypatch.setattr(provider, "destroy", destroy)
    return failing


MOVE_FAILED = "Worker move to the gateway failed; retry the move; environment destroy: provider API unreachable"


@dispatch_db
def test_a_move_whose_source_cannot_be_torn_down_is_an_error_and_the_same_move_can_be_retried(destroy_fails):
    session = make_session()
    dispatch_to_active(session)

    with pytest.raises(Unavailable) as failed:
        move(session)

    assert failed.value.message == MOVE_FAILED
    assert Placement.objects.get(pk=session.pk).recovery_error == MOVE_FAILED
    assert PlacementMove.objects.get(session=session).last_error == MOVE_FAILED
    destroy_fails.clear()

    result = move(session)

    assert result["placement"]["state"] == S.LOCAL
    assert not PlacementMove.objects.exists()
    assert WorkerEnvironment.objects.get(pk=ENV).state == "destroyed"


@dispatch_db
def test_stopping_the_worker_after_a_failed_move_drops_the_move_so_a_later_move_is_not_blocked(destroy_fails):
    session = make_session()
    dispatch_to_active(session)
    with pytest.raises(Unavailable):
        move(session)
    destroy_fails.clear()

    assert reclaim(session)["placement"]["state"] == S.LOCAL
    assert not PlacementMove.objects.exists()
    # Placed again on another environment, the session moves back without a conflict.
    attached_environment(session, environment_id="worker:second")
    onto_second = [
        (a, b, {**patch, "environment_id": "worker:second"} if a == S.REQUESTED else patch)
        for a, b, patch in DISPATCH_STEPS
    ]
    placement = walk(session, onto_second)
    assert (
        move(session, generation=placement.generation, environment_id="worker:second")["placement"]["state"] == S.LOCAL
    )


# --- sessions.move to a profile or device ----------------------------------------------------------


@dispatch_db
def test_a_move_to_a_profile_releases_the_source_then_dispatches_there(sshd, use_profiles, in_process, settings):
    use_profiles({"dev": {"provider": "static-ssh", "settings": sshd.profile_settings()}})
    closed_port = free_port()
    settings.OPENCLAW_WORKERS = {**settings.OPENCLAW_WORKERS, "GATEWAY_URL": f"ws://127.0.0.1:{closed_port}"}
    session = make_session()
    dispatch_to_active(session)
    history_before = PlacementHistory.objects.count()
    message = (
        f"Worker dispatch failed in provisioning: static-ssh host 127.0.0.1:{sshd.port} failed (exit status 1): "
        f"the gateway's worker bundle could not be fetched from "
        f"http://127.0.0.1:{closed_port}/api/workers/bundle/{current_bundle().sha256}: [Errno 111] Connection refused"
    )

    # The destination leases its host over real SSH; its node host cannot reach this (test) gateway, so
    # the dispatch fails at bootstrap.
    with pytest.raises(Unavailable) as failed:
        move(session, target={"kind": "profile", "profileId": "dev"}, context=ctx())

    assert failed.value.message == message
    assert [(a, b) for a, b, _ in steps(session, since=history_before)] == [
        (S.ACTIVE, S.DRAINING),
        (S.DRAINING, S.RECONCILING),
        (S.RECONCILING, S.LOCAL),
        (S.LOCAL, S.REQUESTED),
        (S.REQUESTED, S.PROVISIONING),
        (S.PROVISIONING, S.FAILED),
    ]
    assert WorkerEnvironment.objects.get(pk=ENV).state == "destroyed"  # the source
    assert not PlacementMove.objects.exists()
    assert Placement.objects.get(pk=session.pk).dispatch_target == "profile:dev"


@dispatch_db
def test_a_move_to_a_profile_needs_operator_admin_and_an_existing_profile(dev_profile):
    session = make_session()
    dispatch_to_active(session)
    params = SessionsMoveParams(
        key=session.key,
        expected={"generation": 5, "environmentId": ENV, "ownerEpoch": 1},
        target={"kind": "profile", "profileId": "dev"},
    )
    with refused(PermissionDenied, "Your operator role cannot dispatch to this Cloud profile.", code="FORBIDDEN"):
        asyncio.run(rpc.sessions_move_rpc(ctx(sc.WRITE), params))
    with refused(NotFound, "worker profile not found: nope"):
        move(session, target={"kind": "profile", "profileId": "nope"}, context=ctx())


@dispatch_db
def test_a_move_to_a_device_that_cannot_host_is_refused_before_anything_moves(dev_profile):
    session = make_session()
    dispatch_to_active(session)
    node = paired_node(connected=False)
    with refused(
        InvalidRequest, f"device worker node is not connected: {node.device_id}; reconnect it before retrying"
    ):
        move(session, target={"kind": "device", "deviceId": node.device_id})


def test_recovery_of_an_interrupted_move_to_a_profile_releases_the_source_and_asks_for_a_retry():
    session = make_session()
    placement = dispatch_to_active(session)
    PlacementMove.objects.create(
        operation_id="move:v1:x",
        session=session,
        source_generation=placement.generation,
        source_environment_id=ENV,
        source_owner_epoch=1,
        target_kind="profile",
        target_id="dev",
        created_at_ms=1,
        updated_at_ms=1,
    )
    drain(session, placement)  # the driver fenced the source, then the gateway stopped

    workers_recover_startup()

    failed = Placement.objects.get(pk=session.pk)
    assert (failed.state, failed.terminal_reason) == (
        S.FAILED,
        "Worker move to profile was interrupted; retry the move",
    )
    assert WorkerEnvironment.objects.get(pk=ENV).state == "failed"
    assert not PlacementMove.objects.exists()
