"""Connection records as a gateway process registers them, for tests of the connection services, and the context
and dispatch of one request of an operator connection."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.dispatch import run_request
from gateway.protocol import RequestFrame
from gateway.registry import registry
from gateway.services.connections import ConnectionRecord


def connection_record(*, boot_id: str, channel_name: str, **fields: Any) -> ConnectionRecord:
    """An operator connection with a shared token unless ``fields`` say otherwise (role, device, …)."""
    defaults: dict[str, Any] = {
        "conn_id": str(uuid.uuid4()),
        "role": "operator",
        "scopes": [],
        "auth_method": "token",
        "device_id": "",
        "node_id": "",
        "client_id": "cli",
        "client_mode": "cli",
        "client_version": "1",
        "display_name": "",
        "platform": "linux",
        "device_family": "",
        "model_identifier": "",
        "instance_id": "",
        "remote_ip": "127.0.0.1",
        "caps": [],
        "commands": [],
        "permissions": {},
        "path_env": "",
    }
    return ConnectionRecord(boot_id=boot_id, channel_name=channel_name, **{**defaults, **fields})


def operator_context(scopes: list[str]) -> RpcContext:
    """What an operator connection with a shared token and ``scopes`` hands a method (in-process dispatch)."""
    return RpcContext(
        conn_id="c",
        channel_name="inmemory!c",
        role=sc.ROLE_OPERATOR,
        scopes=scopes,
        auth_method="token",
        client_id="test",
        client_mode="test",
    )


def node_context(node_id: str, *, conn_id: str, commands: list[str]) -> RpcContext:
    """What a paired node's connection (OpenClaw's node host client id, device token) hands a method."""
    return RpcContext(
        conn_id=conn_id,
        channel_name="inmemory!node",
        role=sc.ROLE_NODE,
        scopes=[],
        auth_method="device-token",
        client_id="node-host",
        client_mode="node",
        device_id=node_id,
        node_id=node_id,
        commands=commands,
    )


def admin_operator_context() -> RpcContext:
    return operator_context([sc.ADMIN])


def dispatched(method: str, params: dict | None = None, *, scopes: list[str]) -> dict:
    """The ``res`` frame of one request through the dispatcher (authorization, params, the handler's database hop,
    the error shape), as an operator with ``scopes``."""
    frame = RequestFrame(type="req", id="r1", method=method, params=params if params is not None else {})
    return asyncio.run(run_request(operator_context(scopes), frame))


def handled(method: str, params: dict | None = None, *, scopes: list[str]) -> Any:
    """The method's answer to validated params, its handler run on this thread: unlike the dispatcher's hop (another
    thread, another connection) it sees the rows a test made in its still open transaction."""
    spec = registry.methods[method]
    result = spec.handler(operator_context(scopes), spec.params.model_validate(params if params is not None else {}))
    return asyncio.run(result) if spec.is_async else result
