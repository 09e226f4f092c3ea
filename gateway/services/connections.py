"""Gateway processes and the records of their live connections.

Who may connect, and what a connection's coming and going changes on its device, is decided by the
connection authority (``gateway.ports``, provided by devices_app), which writes connection rows with the
records defined here.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from django.utils import timezone

from .. import events
from ..models import GatewayConnection, GatewayProcess


def connections_close(connections: list[GatewayConnection], *, reason: str, code: int = 1008) -> None:
    by_channel = [c.channel_name for c in connections]
    GatewayConnection.objects.filter(pk__in=[c.pk for c in connections]).delete()
    events.send_to_channels_on_commit(by_channel, events.close_message(code, reason))


def process_register(*, boot_id: str) -> GatewayProcess:
    now = timezone.now()
    process, _ = GatewayProcess.objects.update_or_create(
        boot_id=boot_id,
        defaults={"hostname": socket.gethostname(), "pid": os.getpid(), "started_at": now, "heartbeat_at": now},
    )
    return process


def process_heartbeat(*, boot_id: str) -> None:
    if not GatewayProcess.objects.filter(boot_id=boot_id).update(heartbeat_at=timezone.now()):
        # Swept as dead after a long pause (debugger, overloaded host): come back.
        process_register(boot_id=boot_id)


@dataclass(frozen=True)
class ConnectionRecord:
    conn_id: str
    boot_id: str
    channel_name: str
    role: str
    scopes: list[str]
    auth_method: str
    device_id: str
    node_id: str | None
    client_id: str
    client_mode: str
    client_version: str
    display_name: str
    platform: str
    device_family: str
    model_identifier: str
    instance_id: str
    remote_ip: str
    caps: list[str]
    commands: list[str]
    permissions: dict[str, bool]
    path_env: str


@dataclass(frozen=True)
class Registered:
    """A registered connection, and the rows of the statements sent after its registration in the
    same round trip (``then``) when they could be (PostgreSQL operators), else None."""

    then_rows: list[list[tuple]] | None = None
