"""Port of seed 002 (``cloud-worker-disappearance-proof.ts``): a vanished worker fails exactly its own
session, durably.

Same steps and assertions, in order: the static-ssh fixture lease ``static-ssh:`` inspects as
``unknown``; a gateway (mock OpenAI provider, a ``development`` static-ssh profile) creates two real
sessions through a turn each; the gateway stops and the state is seeded directly in its database —
an ``orphaned`` static-ssh environment whose provider no longer recognizes the lease, an active
placement (epoch 1) for session A and, **on the same environment**, a placement for session B failed
with ``independent session failure``; the gateway starts: A becomes ``failed`` with a terminal reason
starting ``cloud worker disappeared:`` (≤1024 characters), B keeps its own; two more restarts change
neither reason nor either ``terminalAtMs``; ``environments.list`` still shows the environment
``orphaned`` with its error. Real Daphne processes, stopped and started by the test (PostgreSQL in CI).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from sessions_app.models import Session
from tests.support.clients import call_once, operator
from tests.support.processes import GatewayLaunch, GatewayServer, free_port, gateway_settings_for_tests
from workers_app.models import WorkerEnvironment
from workers_app.providers import WorkerProfile
from workers_app.providers.static_ssh import StaticSshProvider
from workers_app.services import placements as store

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ENVIRONMENT_ID = "qa-static-worker-loss"
INDEPENDENT_REASON = "independent session failure"
BUNDLE_HASH = "a" * 64
MANIFEST_REF = "sha256:" + "b" * 64
PROFILES = {"development": {"provider": "static-ssh", "install": "bundle", "settings": {}}}


def create_session(server: GatewayServer, sender: str, marker: str) -> Session:
    """A real session, created by a turn whose reply carries ``marker`` (the seed's inbound message)."""

    async def scenario() -> tuple[set[str], dict, dict]:
        client = operator(server)
        await client.connect()
        try:
            before = await client.request("sessions.list", {"limit": 100})
            created = await client.request(
                "sessions.create", {"key": sender, "message": f"Reply exactly: {marker}", "idempotencyKey": sender}
            )
            run_id = created["runId"]
            waited = await client.request("agent.wait", {"runId": run_id, "timeoutMs": 60_000})
            after = await client.request("sessions.list", {"limit": 100})
            return {row["sessionId"] for row in before["sessions"]}, waited, after
        finally:
            await client.close()

    before_ids, waited, after = asyncio.run(scenario())
    assert waited["status"] == "ok", waited
    assert marker in json.dumps(waited), f"the turn did not deliver {marker}"
    rows = [row for row in after["sessions"] if row["sessionId"] not in before_ids]
    assert len(rows) == 1, f"sessions.list did not resolve the session for {sender}"
    return Session.objects.get(key=rows[0]["key"])


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


def test_a_vanished_worker_fails_exactly_its_own_session_durably(mock_openai):
    inspection = StaticSshProvider().inspect("static-ssh:", WorkerProfile(id="development", provider_id="static-ssh"))
    assert inspection.status == "unknown", f"static-ssh disappearance fixture returned {inspection.status}"

    port = free_port()
    launch = GatewayLaunch.prepare(
        port=port,
        settings={
            **gateway_settings_for_tests(port),
            "OPENCLAW_MODEL_BASE_URL": mock_openai.base_url,
            "OPENCLAW_MODEL_API_KEY": "sk-test",
            "OPENCLAW_MODEL": "mock-openai/gpt-5.6-luna",
            "OPENCLAW_WORKER_PROFILES": json.dumps(PROFILES),
        },
    )
    gateway = launch.start()
    try:
        lost = create_session(gateway, "qa-worker-loss", "WORKER-LOSS-BASELINE")
        isolated = create_session(gateway, "qa-worker-isolated", "WORKER-ISOLATION-BASELINE")
        assert lost.session_id != isolated.session_id, "the baseline did not create two isolated sessions"

        gateway.stop()
        seed_unknown_worker_state(lost, isolated)
        gateway = launch.start()

        first = wait_for_failed_placement(gateway, lost)
        independent = wait_for_failed_placement(gateway, isolated)
        first_reason = first.get("terminalReason", "")
        assert first_reason.startswith("cloud worker disappeared:"), first_reason
        assert len(first_reason) <= 1024
        assert first["environmentId"] == ENVIRONMENT_ID
        assert independent["terminalReason"] == INDEPENDENT_REASON
        assert first_reason != INDEPENDENT_REASON, "sessions sharing an environment leaked terminal reasons"
        terminal_at_ms = first["terminalAtMs"]
        isolated_terminal_at_ms = independent["terminalAtMs"]

        for restart in range(2):
            gateway.stop()
            gateway = launch.start()
            recovered = wait_for_failed_placement(gateway, lost)
            recovered_independent = wait_for_failed_placement(gateway, isolated)
            assert (
                recovered["terminalReason"],
                recovered["terminalAtMs"],
                recovered_independent["terminalReason"],
                recovered_independent["terminalAtMs"],
            ) == (first_reason, terminal_at_ms, INDEPENDENT_REASON, isolated_terminal_at_ms), (
                f"terminal facts changed after restart {restart + 1}"
            )

        listed = call_once(gateway, "environments.list", {})
        environment = next((row for row in listed["environments"] if row["id"] == ENVIRONMENT_ID), None)
        assert environment is not None
        worker = environment["worker"]
        assert worker["state"] == "orphaned", "environment-level orphaned diagnostic was not preserved"
        assert isinstance(worker["error"], str)
        assert "sshKeyRef" not in json.dumps(environment) and "/tmp/qa-key" not in json.dumps(environment)
    finally:
        gateway.stop()
        launch.remove_state()
