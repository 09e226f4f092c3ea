"""Connection records as a gateway process registers them, for tests of the connection services."""

from __future__ import annotations

import uuid
from typing import Any

from gateway import scopes as sc
from gateway.context import RpcContext
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


def admin_operator_context() -> RpcContext:
    """What an operator connection with a shared token and ``operator.admin`` hands a method (in-process dispatch)."""
    return RpcContext(
        conn_id="c",
        channel_name="inmemory!c",
        role=sc.ROLE_OPERATOR,
        scopes=[sc.ADMIN],
        auth_method="token",
        client_id="test",
        client_mode="test",
    )
