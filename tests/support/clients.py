"""Client helpers for end-to-end tests: operators, nodes, and raw sockets."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import websockets

from openclaw_client.client import ClientOptions, GatewayClient
from openclaw_client.identity import DeviceIdentity
from tests.support.processes import make_scratch_dir, remove_scratch_dir

# The identity folders ``node()`` made in this process (no ``state_dir`` given), oldest first: each test removes
# those made while it ran (``remove_identity_dirs_made_after``, an autouse fixture of tests/conftest.py).
IDENTITY_DIRS: list[str] = []
ALL_SCOPES = ["operator.admin", "operator.read", "operator.write", "operator.approvals", "operator.pairing"]


def operator(server, *, scopes: list[str] | None = None, **overrides: Any) -> GatewayClient:
    """An operator client with a fresh device identity (pass ``identity=None`` for none)."""
    options = ClientOptions(
        url=server.url,
        token=server.token,
        scopes=ALL_SCOPES if scopes is None else scopes,
        identity=DeviceIdentity.generate(),
    )
    for key, value in overrides.items():
        setattr(options, key, value)
    return GatewayClient(options)


def move_back_params(key: str, placement: dict[str, Any]) -> dict[str, Any]:
    """``sessions.move`` of ``key`` back to the gateway, naming the exact source its ``placement`` projection shows."""
    return {
        "key": key,
        "expected": {
            "generation": placement["generation"],
            "environmentId": placement["environmentId"],
            "ownerEpoch": placement["activeOwnerEpoch"],
        },
        "target": {"kind": "gateway"},
    }


def node(
    server,
    *,
    commands: list[str] | None = None,
    state_dir: str | None = None,
    token: str | None = "shared",
    invoke_handler=None,
    **overrides: Any,
) -> GatewayClient:
    if not state_dir:
        state_dir = make_scratch_dir("node-identity-")
        IDENTITY_DIRS.append(state_dir)
    options = ClientOptions(
        url=server.url,
        token=server.token if token == "shared" else token,
        role="node",
        client_id="node-host",
        client_mode="node",
        display_name="test-node",
        commands=commands if commands is not None else ["echo", "fail", "sleep"],
        caps=["system"],
        state_dir=state_dir,
    )
    for key, value in overrides.items():
        setattr(options, key, value)
    return GatewayClient(options, invoke_handler=invoke_handler)


def remove_identity_dirs_made_after(count: int) -> None:
    """Remove the identity folders ``node()`` made after the first ``count``."""
    made = IDENTITY_DIRS[count:]
    del IDENTITY_DIRS[count:]
    for folder in made:
        remove_scratch_dir(folder)


async def paired_node(server, admin: GatewayClient, **kwargs: Any) -> GatewayClient:
    """A node that asked for pairing, was approved by ``admin``, and is connected."""
    from openclaw_client.client import ConnectError

    client = node(server, **kwargs)
    try:
        await client.connect()
        raise AssertionError("an unpaired node must not connect")
    except ConnectError as error:
        request_id = error.details["requestId"]
    await admin.request("node.pair.approve", {"requestId": request_id})
    client = node(server, state_dir=client.options.state_dir, **{k: v for k, v in kwargs.items() if k != "state_dir"})
    await client.connect()
    return client


async def raw_socket(server):
    """A bare WebSocket that has read the challenge; returns (ws, nonce)."""
    ws = await websockets.connect(server.url, max_size=None)
    challenge = json.loads(await ws.recv())
    return ws, challenge["payload"]["nonce"]


async def recv_json(ws, timeout: float = 10) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


def signed_connect_params(
    identity: DeviceIdentity,
    nonce: str,
    *,
    token: str,
    role: str = "operator",
    scopes: list[str] | None = None,
    client_id: str = "cli",
    client_mode: str = "cli",
    platform: str = "linux",
    signed_at: int | None = None,
) -> dict:
    import time

    from openclaw_client.identity import build_device_auth_payload

    scopes = ALL_SCOPES if scopes is None else scopes
    signed_at = signed_at if signed_at is not None else int(time.time() * 1000)
    payload = build_device_auth_payload(
        version="v3",
        device_id=identity.device_id,
        client_id=client_id,
        client_mode=client_mode,
        role=role,
        scopes=scopes,
        signed_at_ms=signed_at,
        token=token,
        nonce=nonce,
        platform=platform,
    )
    return {
        "minProtocol": 3,
        "maxProtocol": 4,
        "client": {"id": client_id, "version": "test/1", "platform": platform, "mode": client_mode},
        "role": role,
        "scopes": scopes,
        "auth": {"token": token},
        "device": {
            "id": identity.device_id,
            "publicKey": identity.public_key,
            "signature": identity.sign(payload),
            "signedAt": signed_at,
            "nonce": nonce,
        },
    }


def call_once(server, method: str, params: dict | None = None) -> Any:
    """One request on a fresh operator connection (from synchronous test code)."""

    async def once() -> Any:
        client = operator(server)
        await client.connect()
        try:
            return await client.request(method, params or {})
        finally:
            await client.close()

    return asyncio.run(once())
