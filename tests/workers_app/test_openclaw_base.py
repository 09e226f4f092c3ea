"""The base of OpenClaw's node-worker dialect: the capabilities a node reads in hello-ok, which connections speak
the dialect, the gateway's namespace, private commands sent to a node that does not list them, and the transfer
tokens (docs/node-worker-protocol.md, "Two dialects")."""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from typing import Any

import pytest

from gateway.invoke import NodeCommandFailed, invoke_private
from gateway.models import GatewayConnection
from tests.e2e.test_private_invokes import InProcessNode
from tests.support.clients import operator
from workers_app.models import NodeWorkerHost
from workers_app.nodes.openclaw.calls import openclaw_failure
from workers_app.nodes.openclaw.dialect import gateway_namespace, speaks_openclaw
from workers_app.nodes.openclaw.tokens import (
    TOKEN_LENGTH,
    transfer_token_mint,
    transfer_token_revoke,
    transfer_token_take,
)

V6_HOST = {"enabled": True, "capacity": {"total": 2, "available": 2}, "environmentSession": 1}


def connection(**fields: Any) -> GatewayConnection:
    values = {"conn_id": uuid.uuid4(), "client_id": "node-host", "client_mode": "node", "commands": ["system.run"]}
    values.update(fields)
    return GatewayConnection(**values)


def declaration(conn: GatewayConnection, **fields: Any) -> NodeWorkerHost:
    values = {
        "node_id": "n1",
        "conn_id": str(conn.conn_id),
        "protocol_features": ["node-worker-supervisor-v6"],
        "worker_host": V6_HOST,
        "updated_at_ms": 0,
    }
    values.update(fields)
    return NodeWorkerHost(**values)


def test_openclaw_s_node_host_with_a_current_v6_declaration_speaks_openclaw():
    conn = connection()
    assert speaks_openclaw(conn, declaration(conn))
    mac = connection(client_id="openclaw-macos")
    assert speaks_openclaw(mac, declaration(mac))


@pytest.mark.parametrize(
    "conn_fields, host_fields",
    [
        ({"client_id": "openclaw-python"}, {}),  # the project's client id
        ({"client_mode": "cli"}, {}),
        ({"commands": ["system.run", "worker.launch.v1"]}, {}),  # lists private commands: the project's dialect
        ({}, {"conn_id": "another-connection"}),  # a declaration of an earlier connection is stale
        ({}, {"protocol_features": []}),
        ({}, {"worker_host": {"enabled": False}}),
        ({}, {"worker_host": None}),
    ],
)
def test_anything_else_does_not_speak_openclaw(conn_fields, host_fields):
    conn = connection(**conn_fields)
    assert not speaks_openclaw(conn, declaration(conn, **host_fields))


def test_a_node_without_a_declaration_does_not_speak_openclaw():
    assert not speaks_openclaw(connection(), None)


def test_the_gateway_namespace_is_stable_and_has_openclaw_s_shape(settings):
    first = gateway_namespace()
    assert re.fullmatch(r"gateway-[0-9a-f]{32}", first)
    assert gateway_namespace() == first
    settings.SECRET_KEY = "another deployment's key"
    assert gateway_namespace() != first


def test_a_single_use_token_is_taken_once_even_by_concurrent_takers():
    token = transfer_token_mint("bundle", "abc", ttl_s=60, single_use=True)
    assert len(token) == TOKEN_LENGTH and re.fullmatch(r"[A-Za-z0-9_-]+", token)
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def take() -> None:
        barrier.wait()
        results.append(transfer_token_take(token, "bundle", "abc"))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 7 + [True]
    assert not transfer_token_take(token, "bundle", "abc")


def test_a_token_serves_only_its_purpose_and_subject_until_revoked():
    token = transfer_token_mint("workspace-download", "env-1", ttl_s=60, single_use=False)
    assert not transfer_token_take(token, "bundle", "env-1")
    assert not transfer_token_take(token, "workspace-download", "env-2")
    assert not transfer_token_take("x" * TOKEN_LENGTH, "workspace-download", "env-1")
    assert not transfer_token_take(token[:-1], "workspace-download", "env-1")
    assert transfer_token_take(token, "workspace-download", "env-1")
    assert transfer_token_take(token, "workspace-download", "env-1")  # per operation, not single use
    transfer_token_revoke(token)
    assert not transfer_token_take(token, "workspace-download", "env-1")


@pytest.mark.parametrize(
    "code, message, expected",
    [
        ("NOT_CONNECTED", "gone", "device worker node is not connected: n1; reconnect it before retrying"),
        ("PAIRING_CHANGED", "x", "device worker node is not connected: n1; reconnect it before retrying"),
        (
            "WORKER_BUNDLE_INSTALL_FAILED",
            "worker-bundle-install-failed: gateway transfer is unavailable",
            "Device worker bundle installation failed: worker-bundle-install-failed: gateway transfer is "
            "unavailable (WORKER_BUNDLE_INSTALL_FAILED)",
        ),
        (
            "INVALID_REQUEST",
            "invalid node worker bundle install request",
            "Device worker bundle installation failed: INVALID_REQUEST: invalid node worker bundle install request "
            "(INVALID_REQUEST)",
        ),
        (
            "UNAVAILABLE",
            "",
            "Device worker bundle installation failed: node worker supervisor command failed (UNAVAILABLE)",
        ),
    ],
)
def test_openclaw_failures_read_as_operator_text(code, message, expected):
    error = openclaw_failure("n1", NodeCommandFailed(code, message), "Device worker bundle installation failed")
    assert error.message == expected


@pytest.mark.django_db(transaction=True)
def test_a_declared_worker_host_is_sent_private_commands_it_does_not_list_with_the_callers_idempotency_key():
    frames: list[dict] = []

    async def script(node, invoke_id: str, command: str, params: Any) -> Any:
        return {"command": command, "params": params}

    async def scenario():
        node = InProcessNode(uuid.uuid4().hex * 2, ["system.run"], script)
        await node.open()
        deliver = node._deliver

        async def capture(frame: dict) -> None:
            frames.append(frame["payload"])
            await deliver(frame)

        node._deliver = capture
        try:
            with pytest.raises(NodeCommandFailed) as undeclared:
                await invoke_private(node.node_id, "worker.status.v1", {"launchId": "l1"}, timeout_ms=10_000)
            with pytest.raises(NodeCommandFailed) as public:
                await invoke_private(node.node_id, "camera.snap", {}, timeout_ms=10_000, declared_worker_host=True)
            answer = await invoke_private(
                node.node_id,
                "worker.status.v1",
                {"launchId": "l1"},
                timeout_ms=10_000,
                declared_worker_host=True,
                idempotency_key="gateway-x:abc",
            )
        finally:
            await node.disconnect()
        return undeclared.value, public.value, answer

    undeclared, public, answer = asyncio.run(scenario())
    assert (undeclared.code, public.code) == ("UNSUPPORTED", "UNSUPPORTED")
    assert answer == {"command": "worker.status.v1", "params": {"launchId": "l1"}}
    assert [frame["idempotencyKey"] for frame in frames] == ["gateway-x:abc"]


@pytest.mark.django_db(transaction=True)
def test_hello_ok_lists_the_worker_capabilities_a_node_reads(gateway):
    async def scenario():
        client = operator(gateway)
        hello = await client.connect()
        await client.close()
        return hello

    hello = asyncio.run(scenario())
    assert hello["features"]["capabilities"] == [
        "node-worker-bundle-retention-v1",
        "node-worker-bundle-status-v1",
        "node-worker-captured-exec-policy",
        "node-worker-environment-session-v1",
    ]
