"""Port of seed 002 (``cloud-worker-disappearance-proof.ts``): a vanished worker fails exactly its own session,
durably. Step by step against the seed in docs/seeds.md (``## Seed 002``).

The steps, in the seed's order: the static-ssh fixture lease ``static-ssh:`` inspects as ``unknown``; a gateway
(mock OpenAI provider in a process of its own, a ``development`` static-ssh profile) gets a turn from each of two
senders, and each session is the one that ``sessions.list`` shows after the turn and not before (the gateway
chooses the keys: ``sessions.create`` without ``key``), so "the two sessions differ" is a real check; the gateway
stops and the state is seeded directly in its database — an ``orphaned`` static-ssh environment whose provider no
longer recognizes the lease, an active placement (epoch 1) for session A and, **on the same environment**, a
placement for session B failed with ``independent session failure``; the gateway starts: the very first read
already shows A ``failed`` with a terminal reason starting ``cloud worker disappeared:`` (≤1024 characters) and B
with its own (reconcile before serving), and waiting for both to be failed, as the seed does, gives the same
facts; after each of two more restarts the first read and the wait show neither reason nor either
``terminalAtMs`` changed; ``environments.list`` still shows the environment ``orphaned`` with its error.

As the seed, the test writes ``cloud-worker-disappearance-verdict.json``, the evidence summary, its log and the
gateway's log under ``test-artifacts/cloud-worker-disappearance/<database vendor>/`` — a ``fail`` verdict with the
error when anything failed — and a gateway or mock model that does not stop cleanly at the end fails the test,
together with the proof's own error when there is one (the seed's aggregated clean-up, lines 353–370).
Real Daphne processes, stopped and started by the test (PostgreSQL in CI, SQLite on the embedded profile).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.db import connection

from sessions_app.models import Session
from tests.support.clients import call_once, operator
from tests.support.evidence import ScenarioEvidence
from tests.support.processes import (
    GatewayLaunch,
    GatewayServer,
    MockOpenAIProcess,
    free_port,
    gateway_settings_for_tests,
    start_mock_openai,
)
from workers_app.models import WorkerEnvironment
from workers_app.providers import WorkerProfile
from workers_app.providers.static_ssh import StaticSshProvider
from workers_app.services import placements as store

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SCENARIO_ID = "cloud-worker-disappearance"
VERDICT_FILE = "cloud-worker-disappearance-verdict.json"
ENVIRONMENT_ID = "qa-static-worker-loss"
INDEPENDENT_REASON = "independent session failure"
BUNDLE_HASH = "a" * 64
MANIFEST_REF = "sha256:" + "b" * 64
PROFILES = {"development": {"provider": "static-ssh", "install": "bundle", "settings": {}}}
PROVIDER_MODE = "mock-openai"
PRIMARY_MODEL = "mock-openai/gpt-5.6-luna"
# The seed's turns arrive over its qa-channel plugin; this project has no such channel, and a turn reaches a
# session through the operator protocol (sessions.create with a first message).
CHANNEL = "operator-rpc"
WORKER_PROVIDER = "static-ssh"


def create_session(server: GatewayServer, sender: str, marker: str) -> Session:
    """The seed's ``createQaSession``: a turn from ``sender`` whose reply carries ``marker`` makes the gateway create
    a session under a key of its own choosing, and the session is the one row of ``sessions.list`` that was not
    there before the turn (``sender`` is its label, as the seed's sender becomes its display name)."""

    async def scenario() -> tuple[dict, dict, dict, dict]:
        client = operator(server)
        await client.connect()
        try:
            before = await client.request("sessions.list", {"limit": 100})
            created = await client.request(
                "sessions.create",
                {"label": sender, "message": f"Reply exactly: {marker}", "idempotencyKey": f"{sender}:baseline"},
            )
            waited = await client.request("agent.wait", {"runId": created["runId"], "timeoutMs": 60_000})
            after = await client.request("sessions.list", {"limit": 100})
            return before, created, waited, after
        finally:
            await client.close()

    before, created, waited, after = asyncio.run(scenario())
    assert waited["status"] == "ok", waited
    assert marker in json.dumps(waited), f"the turn did not deliver {marker}"
    before_ids = {row["sessionId"] for row in before["sessions"]}
    new_rows = [row for row in after["sessions"] if row["sessionId"] not in before_ids]
    assert len(new_rows) == 1, f"sessions.list did not resolve the session for {sender}: {new_rows}"
    (row,) = new_rows
    assert row["label"] == sender, row
    assert (row["key"], row["sessionId"]) == (created["key"], created["sessionId"]), (row, created)
    return Session.objects.get(key=row["key"], session_id=row["sessionId"])


def seed_placement(session: Session) -> None:
    """The seed's ``seedPlacement``: a first dispatch walked to active (epoch 1) through the store."""
    placement = store.placement_start_dispatch(session=session)
    steps = [
        ("requested", "provisioning", {"environment_id": ENVIRONMENT_ID}),
        ("provisioning", "syncing", {"worker_bundle_hash": BUNDLE_HASH}),
        ("syncing", "starting", {"workspace_base_manifest_ref": MANIFEST_REF, "remote_workspace_dir": "/qa/workspace"}),
        ("starting", "active", {"active_owner_epoch": 1}),
    ]
    for from_state, to_state, patch in steps:
        placement = store.placement_transition(
            session=session,
            from_state=from_state,
            to_state=to_state,
            expected_generation=placement.generation,
            patch=patch,
        )


def seed_unknown_worker_state(lost: Session, isolated: Session) -> None:
    """Written straight into the stopped gateway's database, as the seed writes its SQLite file."""
    environment = WorkerEnvironment.objects.create(
        environment_id=ENVIRONMENT_ID,
        provider_id="static-ssh",
        profile_id="development",
        profile_snapshot={},
        provision_operation_id=f"qa:{ENVIRONMENT_ID}",
        lease_id="static-ssh:",
        shared_host=True,
        ssh_host="127.0.0.1",
        ssh_port=22,
        ssh_user="qa",
        ssh_host_key="ssh-ed25519 AAAA",
        ssh_key_ref={"source": "file", "provider": "qa", "id": "/tmp/qa-key"},
        bootstrap_bundle_hash=BUNDLE_HASH,
        bootstrap_openclaw_version="qa",
        bootstrap_protocol_features=["worker-launch-v2"],
        owner_epoch=1,
        attached_session_ids=[lost.session_id],
        state="attached",
        created_at_ms=1,
        updated_at_ms=1,
        state_changed_at_ms=1,
    )
    seed_placement(lost)
    # What the seed's row says: the machine is gone, nobody is attached any more.
    WorkerEnvironment.objects.filter(pk=environment.pk).update(
        state="orphaned", attached_session_ids=[], last_error="Worker provider no longer recognizes lease"
    )
    other = store.placement_start_dispatch(session=isolated)
    other = store.placement_transition(
        session=isolated,
        from_state="requested",
        to_state="provisioning",
        expected_generation=other.generation,
        patch={"environment_id": ENVIRONMENT_ID},
    )
    store.placement_fail(session=isolated, expected_generation=other.generation, recovery_error=INDEPENDENT_REASON)


def describe_placement(server: GatewayServer, session: Session) -> dict:
    described = call_once(server, "sessions.describe", {"key": session.key})
    return described["session"]["placement"]


def wait_for_failed_placement(server: GatewayServer, session: Session) -> dict:
    deadline = time.monotonic() + 60
    latest: dict = {}
    while time.monotonic() < deadline:
        latest = describe_placement(server, session)
        if latest["state"] == "failed":
            return latest
        time.sleep(0.1)
    raise AssertionError(f"placement did not fail: {latest}")


def terminal_facts(placement: dict) -> tuple:
    return placement["state"], placement.get("terminalReason"), placement.get("terminalAtMs")


@dataclass
class GatewayChild:
    """The seed's gateway child: one launch (port, state folder, databases) started again after each stop, every
    run's logs kept in the evidence. A gateway that does not stop cleanly fails the proof."""

    launch: GatewayLaunch
    evidence: ScenarioEvidence
    server: GatewayServer | None = None
    runs: int = 0

    def start(self) -> GatewayServer:
        self.server = self.launch.start()
        self.runs += 1
        return self.server

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is None:
            return
        try:
            server.stop_checked()
        finally:
            self.evidence.append_process_log(f"gateway run {self.runs}", server.log())
            if server.worker_log_path is not None:
                self.evidence.append_process_log(f"celery worker of gateway run {self.runs}", server.worker_log())

    def restart_after_state_mutation(self, mutate: Callable[[], None]) -> GatewayServer:
        self.stop()
        mutate()
        return self.start()

    @property
    def replacement_count(self) -> int:
        return self.runs - 1


def run_proof(child: GatewayChild) -> dict:
    """The seed's ``runProof`` between starting its helpers and cleaning up: the verdict when every check holds."""
    inspection = StaticSshProvider().inspect("static-ssh:", WorkerProfile(id="development", provider_id="static-ssh"))
    assert inspection.status == "unknown", f"static-ssh disappearance fixture returned {inspection.status}"

    gateway = child.start()
    lost = create_session(gateway, "qa-worker-loss", "WORKER-LOSS-BASELINE")
    isolated = create_session(gateway, "qa-worker-isolated", "WORKER-ISOLATION-BASELINE")
    assert lost.session_id != isolated.session_id, "the baseline did not create two isolated sessions"
    assert lost.key != isolated.key, "the baseline did not create two isolated sessions"

    gateway = child.restart_after_state_mutation(lambda: seed_unknown_worker_state(lost, isolated))
    # Read at once, before any waiting: startup recovery has already run for the first answer.
    at_once, independent_at_once = describe_placement(gateway, lost), describe_placement(gateway, isolated)
    assert at_once["state"] == "failed", f"the first read after the restart showed {at_once}"
    assert independent_at_once["state"] == "failed", f"the first read after the restart showed {independent_at_once}"
    first = wait_for_failed_placement(gateway, lost)
    independent = wait_for_failed_placement(gateway, isolated)
    first_reason = first.get("terminalReason", "")
    assert first_reason.startswith("cloud worker disappeared:"), first_reason
    assert len(first_reason) <= 1024
    assert first["environmentId"] == ENVIRONMENT_ID
    assert independent["terminalReason"] == INDEPENDENT_REASON
    assert first_reason != INDEPENDENT_REASON, "sessions sharing an environment leaked terminal reasons"
    assert (terminal_facts(at_once), terminal_facts(independent_at_once)) == (
        terminal_facts(first),
        terminal_facts(independent),
    ), "the first read and the wait disagree"
    terminal_at_ms = first["terminalAtMs"]
    isolated_terminal_at_ms = independent["terminalAtMs"]
    expected = (("failed", first_reason, terminal_at_ms), ("failed", INDEPENDENT_REASON, isolated_terminal_at_ms))

    for restart in range(2):
        gateway = child.restart_after_state_mutation(lambda: None)
        at_once = (
            terminal_facts(describe_placement(gateway, lost)),
            terminal_facts(describe_placement(gateway, isolated)),
        )
        assert at_once == expected, f"the first read after restart {restart + 1} showed other terminal facts"
        recovered = wait_for_failed_placement(gateway, lost)
        recovered_independent = wait_for_failed_placement(gateway, isolated)
        assert (terminal_facts(recovered), terminal_facts(recovered_independent)) == expected, (
            f"terminal facts changed after restart {restart + 1}"
        )

    listed = call_once(gateway, "environments.list", {})
    environment = next((row for row in listed["environments"] if row["id"] == ENVIRONMENT_ID), None)
    assert environment is not None, f"environments.list has no {ENVIRONMENT_ID}"
    worker = environment["worker"]
    assert worker["state"] == "orphaned", "environment-level orphaned diagnostic was not preserved"
    assert isinstance(worker["error"], str), "environment-level orphaned diagnostic was not preserved"
    assert "sshKeyRef" not in json.dumps(environment) and "/tmp/qa-key" not in json.dumps(environment)

    return {
        "status": "pass",
        "providerMode": PROVIDER_MODE,
        "channel": CHANNEL,
        "workerProvider": WORKER_PROVIDER,
        "gatewayReplacementCount": child.replacement_count,
        "disappearance": {
            "sessionId": lost.session_id,
            "terminalReason": first_reason,
            "terminalAtMs": terminal_at_ms,
            "durableAcrossRestarts": True,
        },
        "isolation": {
            "sharedEnvironmentId": ENVIRONMENT_ID,
            "otherSessionId": isolated.session_id,
            "otherTerminalReason": independent["terminalReason"],
            "reasonsDistinct": True,
        },
        "environment": {"state": worker["state"], "error": worker["error"]},
    }


def clean_up(child: GatewayChild, mock: MockOpenAIProcess) -> list[Exception]:
    """Every helper stopped and the gateway's state folder removed, each tried whatever the others did (the seed's
    ``Promise.allSettled``); the failures, for the test to raise."""
    failures: list[Exception] = []
    for step in (child.stop, mock.stop_checked, child.launch.remove_state):
        try:
            step()
        except Exception as failure:  # collected and raised together: none is swallowed
            failures.append(failure)
    return failures


def test_a_vanished_worker_fails_exactly_its_own_session_durably():
    evidence = ScenarioEvidence.begin(
        scenario_id=SCENARIO_ID,
        subfolder=connection.vendor,
        title="Cloud worker disappearance recovery",
        source_path="tests/e2e/test_seed_002_cloud_worker_disappearance.py",
        verdict_file=VERDICT_FILE,
        provider_mode=PROVIDER_MODE,
        primary_model=PRIMARY_MODEL,
    )
    mock = start_mock_openai()
    port = free_port()
    launch = GatewayLaunch.prepare(
        port=port,
        settings={
            **gateway_settings_for_tests(port),
            "OPENCLAW_MODEL_BASE_URL": mock.base_url,
            "OPENCLAW_MODEL_API_KEY": "sk-test",
            "OPENCLAW_MODEL": PRIMARY_MODEL,
            "OPENCLAW_WORKER_PROFILES": json.dumps(PROFILES),
        },
    )
    child = GatewayChild(launch, evidence)
    verdict: dict | None = None
    proof_error: Exception | None = None
    try:
        verdict = run_proof(child)
    except Exception as error:  # raised below, after the clean-up and the fail verdict
        proof_error = error
    cleanup_failures = clean_up(child, mock)
    error: Exception | None = proof_error
    if cleanup_failures:
        error = ExceptionGroup(
            "cloud worker disappearance cleanup failed",
            [proof_error, *cleanup_failures] if proof_error else cleanup_failures,
        )
    evidence.finish(verdict, error)
    if error is not None:
        raise error
