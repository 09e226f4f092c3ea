"""Provisioning on OpenClaw's own node host (node-worker-dialect.md §1.2, §1.3, §1.10): the bundle install in
OpenClaw's shapes with a single-use download token, the retain snapshot and its result, the environment stop,
and where the device path branches on the dialect (eligibility, the retain trigger, the teardown)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from gateway.invoke import NodeCommandFailed
from gateway.models import GatewayConnection
from sessions_app.services.sessions import session_reset
from tests.support.connections import node_context
from workers_app import rpc as workers_rpc
from workers_app import selectors
from workers_app.models import NodeWorkerHost, Placement, WorkerEnvironment
from workers_app.nodes import hosts as node_hosts
from workers_app.nodes import retention as project_retention
from workers_app.nodes.device_provider import DeviceProvider, device_profile
from workers_app.nodes.inventory import Declaration
from workers_app.nodes.openclaw import provisioning, retention
from workers_app.nodes.openclaw.bundle import openclaw_bundle
from workers_app.nodes.openclaw.bundle_http import bundle_transfer_path
from workers_app.nodes.openclaw.dialect import gateway_namespace
from workers_app.nodes.openclaw.retention import parse_retain_result, retain_entries
from workers_app.nodes.openclaw.turns import LaunchRefused, launch_facts
from workers_app.nodes.runtime import node_runtime
from workers_app.providers import WorkerProviderError
from workers_app.runtimes import worker_runtimes
from workers_app.schemas import RunnerInventoryParams
from workers_app.services import dispatch
from workers_app.services.recovery import workers_recovery_sweep

from .test_openclaw_bundle import request
from .test_placement_store import ENV, MANIFEST, attached_environment, dispatch_to_active, make_session
from .test_rpc import NODE, paired_node

pytestmark = pytest.mark.django_db

OPENCLAW_HOST = {
    "enabled": True,
    "capacity": {"total": 2, "available": 2},
    "bundlePrewarm": 1,
    "bundleRetention": 1,
    "bundleStatus": 1,
    "environmentSession": 1,
    "capturedExecPolicy": True,
}


def declare(worker_host: dict | None = OPENCLAW_HOST) -> GatewayConnection:
    connection = GatewayConnection.objects.get(node_id=NODE)
    declaration = Declaration(["node-worker-supervisor-v6"], worker_host)
    node_hosts.node_host_declare(node_id=NODE, conn_id=str(connection.conn_id), declaration=declaration)
    return connection


@pytest.fixture
def openclaw_node() -> GatewayConnection:
    """A connected paired node as OpenClaw's node host connects (``node-host``, no private commands), declared."""
    paired_node(connected=True)
    return declare()


class FakeNode:
    """``call_openclaw`` as a node answers: every call recorded, each answered by ``answer(command, params)``."""

    def __init__(self, answer):
        self.answer = answer
        self.calls: list[dict[str, Any]] = []

    def __call__(self, node_id, command, params, *, timeout_ms=30_000, idempotency_key=None):
        self.calls.append({"node": node_id, "command": command, "params": params, "idempotencyKey": idempotency_key})
        return self.answer(command, params)


def fake_node(monkeypatch, answer) -> FakeNode:
    node = FakeNode(answer)
    monkeypatch.setattr(provisioning, "call_openclaw", node)
    monkeypatch.setattr(retention, "call_openclaw", node)
    return node


def node_environment(session, *, epoch: int = 1, environment_id: str = ENV) -> WorkerEnvironment:
    environment = attached_environment(session, epoch=epoch, environment_id=environment_id)
    WorkerEnvironment.objects.filter(pk=environment.pk).update(
        provider_id="device",
        profile_id=f"device:{NODE}",
        lease_id=f"device:{environment_id}",
        node_device_id=NODE,
    )
    environment.refresh_from_db()
    return environment


# --- install ---------------------------------------------------------------------------------------


def test_bootstrap_installs_the_bundle_in_openclaw_s_shape_and_the_node_downloads_it_once(monkeypatch, openclaw_node):
    built = openclaw_bundle()
    downloads: list[dict] = []

    def answer(command, params):
        token = params["archive"]["token"]
        # The node downloads during the install, with the install's token: served once.
        downloads.append(request(bundle_transfer_path(built.bundle_hash), token=token))
        downloads.append(request(bundle_transfer_path(built.bundle_hash), token=token))
        return dict(params["build"])

    node = fake_node(monkeypatch, answer)
    receipt = node_runtime.bootstrap(node_environment(make_session()))

    [call] = node.calls
    params = call["params"]
    assert call["command"] == "worker.bundle.install.v1"
    assert call["idempotencyKey"] == f"{gateway_namespace()}:{built.bundle_hash}"
    assert list(params) == ["gatewayNamespace", "bundlePrewarm", "build", "archive"]  # no `version`
    assert params["gatewayNamespace"] == gateway_namespace()
    assert params["bundlePrewarm"] == 1
    assert params["build"] == {
        "bundleHash": built.bundle_hash,
        "openclawVersion": built.openclaw_version,
        "protocolFeatures": ["worker-execution-context-v2", "worker-execution-authority-v1"],
    }
    assert set(params["archive"]) == {"token", "sha256", "bytes"}
    assert len(params["archive"]["token"]) == 43
    assert (params["archive"]["sha256"], params["archive"]["bytes"]) == (built.tarball_sha256, built.tarball_bytes)
    assert [download["status"] for download in downloads] == [200, 404]
    assert downloads[0]["body"] == built.path.read_bytes()
    assert (receipt.bundle_hash, receipt.openclaw_version, receipt.protocol_features, receipt.install_kind) == (
        built.bundle_hash,
        built.openclaw_version,
        ["worker-execution-context-v2", "worker-execution-authority-v1"],
        "bundle",
    )
    host = NodeWorkerHost.objects.get(node_id=NODE)
    assert (host.bundle_hash, host.bundle_status) == (built.bundle_hash, "installed")
    assert selectors.worker_bundle_projection(host) == {"status": "installed", "version": built.openclaw_version}


def test_the_install_token_dies_with_the_install_whatever_its_outcome(monkeypatch, openclaw_node):
    built = openclaw_bundle()
    tokens: list[str] = []

    def answer(command, params):
        tokens.append(params["archive"]["token"])
        raise NodeCommandFailed(
            "WORKER_BUNDLE_INSTALL_FAILED", "worker-bundle-install-failed: gateway transfer is unavailable"
        )

    fake_node(monkeypatch, answer)
    with pytest.raises(WorkerProviderError) as failed:
        node_runtime.bootstrap(node_environment(make_session()))
    assert failed.value.message == (
        "Device worker bundle installation failed: worker-bundle-install-failed: gateway transfer is unavailable "
        "(WORKER_BUNDLE_INSTALL_FAILED)"
    )
    assert request(bundle_transfer_path(built.bundle_hash), token=tokens[0])["status"] == 404
    assert NodeWorkerHost.objects.get(node_id=NODE).bundle_status == ""  # nothing recorded installed


def test_bundle_prewarm_is_sent_only_to_a_node_that_declared_it(monkeypatch, openclaw_node):
    declare({key: value for key, value in OPENCLAW_HOST.items() if key != "bundlePrewarm"})
    node = fake_node(monkeypatch, lambda command, params: dict(params["build"]))
    node_runtime.bootstrap(node_environment(make_session()))
    assert "bundlePrewarm" not in node.calls[0]["params"]


@pytest.mark.parametrize(
    "receipt",
    [
        None,
        "installed",
        {"bundleHash": "f" * 64},
        {"installKind": "bundle"},
        "other hash",
        "other version",
        "fewer features",
        "duplicate features",
        "extra key",
    ],
)
def test_a_receipt_that_is_not_the_build_sent_fails_the_bootstrap(monkeypatch, openclaw_node, receipt):
    def answer(command, params):
        build = dict(params["build"])
        if receipt == "other hash":
            return {**build, "bundleHash": "f" * 64}
        if receipt == "other version":
            return {**build, "openclawVersion": "2026.9.6"}
        if receipt == "fewer features":
            return {**build, "protocolFeatures": build["protocolFeatures"][:1]}
        if receipt == "duplicate features":
            return {**build, "protocolFeatures": build["protocolFeatures"] * 2}
        if receipt == "extra key":
            return {**build, "installKind": "bundle"}
        return receipt

    fake_node(monkeypatch, answer)
    with pytest.raises(WorkerProviderError) as failed:
        node_runtime.bootstrap(node_environment(make_session()))
    assert failed.value.message == "Device worker bundle installer returned a mismatched build receipt"


def test_a_receipt_may_list_the_features_in_another_order_and_echo_the_prewarm(monkeypatch, openclaw_node):
    def answer(command, params):
        build = params["build"]
        return {**build, "protocolFeatures": list(reversed(build["protocolFeatures"])), "bundlePrewarm": 1}

    fake_node(monkeypatch, answer)
    assert node_runtime.bootstrap(node_environment(make_session())).install_kind == "bundle"


def test_activation_asks_nothing_of_openclaw_s_node(monkeypatch, openclaw_node):
    node = fake_node(monkeypatch, lambda command, params: pytest.fail("no node command at start"))
    session = make_session()
    node_runtime.start(session, None, node_environment(session))
    assert node.calls == []


# --- retain ----------------------------------------------------------------------------------------


def test_the_retain_lists_only_environments_with_one_attached_session(openclaw_node):
    settled = make_session("agent:main:settled")
    dispatch_to_active(settled)
    WorkerEnvironment.objects.filter(pk=ENV).update(node_device_id=NODE)
    unattached = node_environment(make_session("agent:main:gone"), environment_id="worker:unattached")
    WorkerEnvironment.objects.filter(pk=unattached.pk).update(attached_session_ids=[])
    shared = node_environment(make_session("agent:main:shared"), environment_id="worker:shared")
    WorkerEnvironment.objects.filter(pk=shared.pk).update(attached_session_ids=["s1", "s2"])
    tearing_down = node_environment(make_session("agent:main:down"), environment_id="worker:down")
    WorkerEnvironment.objects.filter(pk=tearing_down.pk).update(destroy_requested_at_ms=5)
    busy = make_session("agent:main:busy")
    node_environment(busy, environment_id="worker:busy", epoch=3)

    assert retain_entries(NODE) == [
        {"environmentId": "worker:busy", "sessionId": busy.session_id, "generation": 3, "manifestRefs": None},
        {"environmentId": ENV, "sessionId": settled.session_id, "generation": 1, "manifestRefs": [MANIFEST]},
    ]


def test_a_settled_placement_in_a_turn_keeps_every_generation(openclaw_node):
    session = make_session()
    dispatch_to_active(session)
    WorkerEnvironment.objects.filter(pk=ENV).update(node_device_id=NODE)
    Placement.objects.filter(pk=session.pk).update(
        turn_claim_owner="worker",
        turn_claim_id="claim-1",
        turn_claim_run_id="run-1",
        turn_claim_generation=1,
        turn_claim_owner_epoch=1,
    )
    [entry] = retain_entries(NODE)
    assert entry["manifestRefs"] is None


def retain_answer(**fields) -> dict:
    return {"applied": True, "deleted": 0, "hasMore": False, **fields}


def test_the_retain_loops_while_the_node_has_more_and_records_the_bundle_status(monkeypatch, openclaw_node):
    built = openclaw_bundle()
    answers = [
        retain_answer(deleted=256, hasMore=True, bundleGeneration=4),
        retain_answer(
            deleted=3, bundleGeneration=5, bundleStatus={"bundleHash": built.bundle_hash, "status": "missing"}
        ),
    ]
    node = fake_node(monkeypatch, lambda command, params: answers.pop(0))

    status = retention.openclaw_retain(node_id=NODE, conn_id=str(openclaw_node.conn_id))

    assert status == "missing"
    first, second = (call["params"] for call in node.calls)
    assert first == second  # a continuation repeats the snapshot
    assert first["version"] == 1
    assert first["gatewayNamespace"] == gateway_namespace()
    assert first["bundleHashes"] == [built.bundle_hash] and first["bundleStatusHash"] == built.bundle_hash
    assert "acknowledgedBundleGeneration" not in first
    host = NodeWorkerHost.objects.get(node_id=NODE)
    assert (host.bundle_hash, host.bundle_status) == (built.bundle_hash, "missing")
    assert selectors.worker_bundle_projection(host) == {"status": "missing"}

    answers.append(retain_answer(bundleStatus={"bundleHash": built.bundle_hash, "status": "installed"}))
    assert retention.openclaw_retain(node_id=NODE, conn_id=str(openclaw_node.conn_id)) == "installed"
    third = node.calls[-1]["params"]
    assert third["acknowledgedBundleGeneration"] == 5  # the node's generation, sent back on this connection
    assert third["sequence"] > first["sequence"] and third["controllerId"] == first["controllerId"]


@pytest.mark.parametrize(
    "dropped, expected_keys",
    [
        ("bundleStatus", {"bundleHashes"}),
        ("bundleRetention", set()),
    ],
)
def test_bundles_are_in_the_snapshot_only_as_far_as_the_node_declared_it_keeps_them(
    monkeypatch, openclaw_node, dropped, expected_keys
):
    flags = ("bundleRetention", "bundleStatus") if dropped == "bundleRetention" else ("bundleStatus",)
    declare({key: value for key, value in OPENCLAW_HOST.items() if key not in flags})
    node = fake_node(monkeypatch, lambda command, params: retain_answer())
    assert retention.openclaw_retain(node_id=NODE, conn_id=str(openclaw_node.conn_id)) is None
    params = node.calls[0]["params"]
    assert set(params) & {"bundleHashes", "bundleStatusHash", "acknowledgedBundleGeneration"} == expected_keys


def test_the_acknowledged_generation_belongs_to_the_connection_that_reported_it(monkeypatch, openclaw_node):
    answers = [retain_answer(bundleGeneration=7), retain_answer()]
    node = fake_node(monkeypatch, lambda command, params: answers.pop(0))
    retention.openclaw_retain(node_id=NODE, conn_id=str(openclaw_node.conn_id))
    retention.openclaw_retain(node_id=NODE, conn_id=str(uuid.uuid4()))
    assert "acknowledgedBundleGeneration" not in node.calls[-1]["params"]


@pytest.mark.parametrize(
    "answer",
    [
        retain_answer(applied=False, bundleStatus={"bundleHash": "HASH", "status": "installed"}),
        retain_answer(bundleStatus={"bundleHash": "f" * 64, "status": "installed"}),  # another build's status
        retain_answer(),  # no status
    ],
)
def test_a_status_not_about_this_gateway_s_bundle_or_not_applied_is_not_trusted(monkeypatch, openclaw_node, answer):
    built = openclaw_bundle()
    fake_node(monkeypatch, lambda command, params: _with_hash(answer, built.bundle_hash))
    assert retention.openclaw_retain(node_id=NODE, conn_id=str(openclaw_node.conn_id)) is None
    assert NodeWorkerHost.objects.get(node_id=NODE).bundle_status == ""


def _with_hash(answer: dict, bundle_hash: str) -> dict:
    status = answer.get("bundleStatus")
    if status and status["bundleHash"] == "HASH":
        return {**answer, "bundleStatus": {**status, "bundleHash": bundle_hash}}
    return answer


@pytest.mark.parametrize(
    "answer",
    [
        None,
        [],
        {"applied": True, "deleted": {"environments": 0, "bundles": 0}, "hasMore": False},  # the project's shape
        {**retain_answer(), "bundleStatus": "installed"},
        {**retain_answer(), "bundleStatus": None},
        {**retain_answer(), "bundleStatus": {"bundleHash": "f" * 64, "status": "unknown"}},
        {**retain_answer(), "bundleStatus": {"bundleHash": "F" * 64, "status": "installed"}},
        {**retain_answer(), "bundleStatus": {"bundleHash": "f" * 64, "status": "installed", "x": 1}},
        {**retain_answer(), "extra": True},
        {"applied": True, "deleted": 0},
        {**retain_answer(), "deleted": -1},
        {**retain_answer(), "deleted": 1.5},
        {**retain_answer(), "deleted": True},
        {**retain_answer(), "applied": 1},
        {**retain_answer(), "bundleGeneration": -1},
        {**retain_answer(), "bundleDeleted": 2**53},
    ],
)
def test_a_retain_result_outside_openclaw_s_shape_is_refused(answer):
    assert parse_retain_result(answer) is None


def test_a_retain_result_in_openclaw_s_shape_is_read():
    parsed = parse_retain_result(
        retain_answer(
            deleted=2, bundleDeleted=1, bundleGeneration=3, bundleStatus={"bundleHash": "a" * 64, "status": "installed"}
        )
    )
    assert (parsed.applied, parsed.deleted, parsed.has_more, parsed.bundle_generation, parsed.bundle_status) == (
        True,
        2,
        False,
        3,
        {"bundleHash": "a" * 64, "status": "installed"},
    )


def test_a_node_that_always_has_more_is_not_followed_for_ever(monkeypatch, openclaw_node):
    node = fake_node(monkeypatch, lambda command, params: retain_answer(hasMore=True))
    assert retention.openclaw_retain(node_id=NODE, conn_id=str(openclaw_node.conn_id)) is None
    assert len(node.calls) == retention.RETAIN_PASSES_MAX


def test_a_retain_the_node_refuses_records_nothing(monkeypatch, openclaw_node):
    def answer(command, params):
        raise NodeCommandFailed("INVALID_REQUEST", "INVALID_REQUEST: invalid node worker workspace retain request")

    fake_node(monkeypatch, answer)
    assert retention.openclaw_retain(node_id=NODE, conn_id=str(openclaw_node.conn_id)) is None


def test_the_project_retain_task_takes_openclaw_s_path_for_an_openclaw_connection(monkeypatch, openclaw_node):
    built = openclaw_bundle()
    node = fake_node(
        monkeypatch,
        lambda command, params: retain_answer(bundleStatus={"bundleHash": built.bundle_hash, "status": "installed"}),
    )
    monkeypatch.setattr(project_retention, "call_node", lambda *args, **kwargs: pytest.fail("project dialect used"))
    assert project_retention.node_retain(node_id=NODE, conn_id=str(openclaw_node.conn_id)) == "installed"
    assert [call["command"] for call in node.calls] == ["worker.workspace.retain.v1"]


def test_an_openclaw_node_s_declaration_triggers_the_retain(monkeypatch):
    paired_node(connected=True)
    connection = GatewayConnection.objects.get(node_id=NODE)
    scheduled: list[tuple] = []
    monkeypatch.setattr(workers_rpc, "dispatch_on_commit", lambda task, *args: scheduled.append((task, args)))
    ctx = node_context(NODE, conn_id=str(connection.conn_id), commands=["system.run"])
    params = RunnerInventoryParams.model_validate(
        {"protocolFeatures": ["node-worker-supervisor-v6"], "workerHost": OPENCLAW_HOST}
    )
    assert workers_rpc.node_runner_inventory_update_rpc(ctx, params) == {"nodeId": NODE}
    assert scheduled == [(workers_rpc.node_retain, (NODE, str(connection.conn_id)))]


# --- stop and teardown -----------------------------------------------------------------------------


def test_destroy_stops_the_environment_then_retains_without_it(monkeypatch, openclaw_node):
    session = make_session()
    environment = node_environment(session, epoch=2)
    WorkerEnvironment.objects.filter(pk=ENV).update(destroy_requested_at_ms=9)  # the teardown asked for it
    other = make_session("agent:main:other")
    node_environment(other, environment_id="worker:other")

    def answer(command, params):
        return None if command == "worker.environment.stop.v1" else retain_answer(deleted=1)

    node = fake_node(monkeypatch, answer)
    DeviceProvider().destroy(environment.lease_id, device_profile(NODE))

    stop, retain = node.calls
    assert stop["command"] == "worker.environment.stop.v1"
    assert stop["params"] == {
        "gatewayNamespace": gateway_namespace(),
        "environmentId": ENV,
        "sessionId": session.session_id,
        "ownerEpoch": 2,
    }
    assert retain["command"] == "worker.workspace.retain.v1"
    assert [entry["environmentId"] for entry in retain["params"]["retain"]] == ["worker:other"]


def test_an_environment_without_a_session_needs_no_stop_but_its_files_still_go(monkeypatch, openclaw_node):
    environment = node_environment(make_session())
    WorkerEnvironment.objects.filter(pk=ENV).update(attached_session_ids=[])
    node = fake_node(monkeypatch, lambda command, params: retain_answer())
    DeviceProvider().destroy(environment.lease_id, device_profile(NODE))
    assert [call["command"] for call in node.calls] == ["worker.workspace.retain.v1"]


@pytest.mark.parametrize(
    "failure, code, message",
    [
        (NodeCommandFailed("TIMEOUT", "timed out"), "cleanup_indeterminate", "device worker node is not connected"),
        (
            NodeCommandFailed("UNAVAILABLE", "node worker supervisor command failed"),
            "cleanup_indeterminate",
            f"device worker node {NODE} could not stop the environment: node worker supervisor command failed",
        ),
        (
            NodeCommandFailed("INVALID_RESPONSE", "node answered the environment stop with an unexpected payload"),
            "cleanup_indeterminate",
            f"device worker node {NODE} could not stop the environment: node answered the environment stop",
        ),
    ],
)
def test_a_stop_the_node_cannot_confirm_leaves_the_teardown_pending(monkeypatch, openclaw_node, failure, code, message):
    environment = node_environment(make_session())

    def answer(command, params):
        if failure.code == "INVALID_RESPONSE":
            return {"stopped": True}  # the project's shape: not OpenClaw's null
        raise failure

    node = fake_node(monkeypatch, answer)
    with pytest.raises(WorkerProviderError) as pending:
        DeviceProvider().destroy(environment.lease_id, device_profile(NODE))
    assert pending.value.code == code
    assert pending.value.message.startswith(message)
    assert [call["command"] for call in node.calls] == ["worker.environment.stop.v1"]  # no retain: not stopped


def test_the_runtime_stop_of_an_openclaw_node_sends_openclaw_s_stop(monkeypatch, openclaw_node):
    session = make_session()
    environment = node_environment(session)
    node = fake_node(monkeypatch, lambda command, params: None)
    node_runtime.stop(NODE, lease_id=environment.lease_id)
    assert [(call["command"], call["params"]["sessionId"]) for call in node.calls] == [
        ("worker.environment.stop.v1", session.session_id)
    ]


# --- eligibility -----------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["environmentSession", "capturedExecPolicy"])
def test_an_openclaw_node_without_environment_sessions_or_the_exec_policy_needs_an_update(
    monkeypatch, openclaw_node, missing
):
    monkeypatch.setattr(worker_runtimes, "_by_provider", {"device": object()})
    assert dispatch.device_ineligibility(NODE) is None
    declare({key: value for key, value in OPENCLAW_HOST.items() if key != missing})
    assert dispatch.device_ineligibility(NODE) == (
        f"device worker node {NODE} requires an update before it can host sessions; run openclaw update, then "
        "reconnect it (for a headless node, run openclaw node restart)"
    )


def test_the_project_s_node_host_needs_no_environment_session(monkeypatch):
    paired_node(connected=True)
    GatewayConnection.objects.filter(node_id=NODE).update(
        client_id="openclaw-python", commands=["worker.launch.v1", "worker.environment.stop.v1"]
    )
    declare({"enabled": True, "capacity": {"total": 2, "available": 2}, "capturedExecPolicy": True})
    monkeypatch.setattr(worker_runtimes, "_by_provider", {"device": object()})
    assert dispatch.device_ineligibility(NODE) is None


def test_the_bundle_status_of_the_project_s_bundle_still_projects(openclaw_node):
    host = NodeWorkerHost.objects.get(node_id=NODE)
    host.bundle_hash, host.bundle_status = "0" * 64, "installed"
    assert selectors.worker_bundle_projection(host) is None  # a build this gateway does not ship


# --- a node being removed ----------------------------------------------------------------------------


def test_a_node_being_removed_stops_its_environments_then_keeps_nothing_until_no_bundle_is_protected(
    monkeypatch, openclaw_node
):
    environment = node_environment(make_session())
    generations = iter([7, 7])

    def answer(command, params):
        if command == "worker.environment.stop.v1":
            return None
        return {"applied": True, "deleted": 1, "hasMore": False, "bundleGeneration": next(generations)}

    node = fake_node(monkeypatch, answer)
    retention.openclaw_node_forget(NODE)

    stop, first, second = node.calls
    assert stop["command"] == "worker.environment.stop.v1"
    assert stop["params"]["environmentId"] == environment.pk
    for call in (first, second):
        assert call["command"] == "worker.workspace.retain.v1"
        assert (call["params"]["retain"], call["params"]["bundleHashes"]) == ([], [])
        assert "bundleStatusHash" not in call["params"]
    # The first pass learns the node's bundle generation; the second acknowledges it, so nothing stays protected.
    assert "acknowledgedBundleGeneration" not in first["params"]
    assert second["params"]["acknowledgedBundleGeneration"] == 7
    assert second["params"]["sequence"] > first["params"]["sequence"]


def test_a_node_being_removed_that_does_not_answer_does_not_hold_up_its_removal(monkeypatch, openclaw_node):
    node_environment(make_session())

    def answer(command, params):
        raise NodeCommandFailed("TIMEOUT", "node did not answer")

    node = fake_node(monkeypatch, answer)
    retention.openclaw_node_forget(NODE)  # logs, never raises

    assert [call["command"] for call in node.calls] == ["worker.environment.stop.v1", "worker.workspace.retain.v1"]


def test_a_node_being_removed_whose_answer_breaks_the_contract_is_not_asked_again(monkeypatch, openclaw_node):
    node = fake_node(monkeypatch, lambda command, params: {"applied": True, "deleted": -1, "hasMore": True})
    retention.openclaw_node_forget(NODE)

    assert [call["command"] for call in node.calls] == ["worker.workspace.retain.v1"]


def test_a_node_that_keeps_answering_more_is_asked_a_bounded_number_of_times(monkeypatch, openclaw_node):
    node = fake_node(
        monkeypatch, lambda command, params: {"applied": True, "deleted": 16, "hasMore": True, "bundleGeneration": 1}
    )
    retention.openclaw_node_forget(NODE)

    assert len(node.calls) == retention.RETAIN_PASSES_MAX


# --- a session reset while placed ------------------------------------------------------------------


def reset_while_placed(**bootstrap) -> tuple[str, str]:
    """A session active on the OpenClaw node's environment, then ``sessions.reset``: its synced and new ids."""
    session = make_session()
    dispatch_to_active(session)
    WorkerEnvironment.objects.filter(pk=ENV).update(
        provider_id="device", lease_id=f"device:{ENV}", node_device_id=NODE, **bootstrap
    )
    renewed = session_reset(key=session.key)
    assert renewed.session_id != session.session_id
    assert WorkerEnvironment.objects.get(pk=ENV).attached_session_ids == [renewed.session_id]
    return session.session_id, renewed.session_id


def test_after_a_reset_the_retain_keeps_the_workspace_under_the_id_it_was_synced_with(openclaw_node):
    synced_id, _renewed_id = reset_while_placed()

    assert retain_entries(NODE) == [
        {"environmentId": ENV, "sessionId": synced_id, "generation": 1, "manifestRefs": [MANIFEST]}
    ]


def test_after_a_reset_the_stop_names_the_id_the_node_knows(monkeypatch, openclaw_node):
    synced_id, _renewed_id = reset_while_placed()
    node = fake_node(monkeypatch, lambda command, params: None if command == "worker.environment.stop.v1" else 0)

    node_runtime.stop(NODE, lease_id=f"device:{ENV}")

    assert node.calls[0]["params"] == {
        "gatewayNamespace": gateway_namespace(),
        "environmentId": ENV,
        "sessionId": synced_id,
        "ownerEpoch": 1,
    }


def test_after_a_reset_the_launch_admits_the_session_under_the_id_it_was_synced_with(openclaw_node):
    synced_id, _renewed_id = reset_while_placed(
        bootstrap_bundle_hash="d" * 64, bootstrap_openclaw_version="2026.9.6-django+1", bootstrap_protocol_features=[]
    )
    placement = Placement.objects.get(environment_id=ENV)

    facts = launch_facts(placement.pk, ENV)

    assert (facts.session_id, facts.owner_epoch, facts.workspace_dir) == (synced_id, 1, "/work/s")


def test_a_launch_on_an_environment_without_one_attached_session_is_refused(openclaw_node):
    reset_while_placed(bootstrap_bundle_hash="d" * 64, bootstrap_openclaw_version="2026.9.6-django+1")
    WorkerEnvironment.objects.filter(pk=ENV).update(attached_session_ids=["s1", "s2"])

    with pytest.raises(LaunchRefused):
        launch_facts(Placement.objects.get(environment_id=ENV).pk, ENV)


def test_after_a_reset_recovery_keeps_the_placement_and_its_environment(openclaw_node):
    reset_while_placed()

    report = workers_recovery_sweep()

    assert report.outcomes.get("placement:healthy") == 1
    environment = WorkerEnvironment.objects.get(pk=ENV)
    assert (environment.state, environment.owner_epoch, environment.destroy_requested_at_ms) == ("attached", 1, None)
    assert Placement.objects.get(environment_id=ENV).state == "active"
