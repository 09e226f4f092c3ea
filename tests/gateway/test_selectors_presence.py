"""The presence list every hello-ok and presence broadcast carries."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from devices_app.models import PairedDevice
from devices_app.services import connections as device_connections
from gateway.models import GatewayConnection
from gateway.selectors import PRESENCE_MAX_ENTRIES, presence_entries, to_ms
from gateway.services import connections
from tests.support.connections import connection_record

BOOT_ID = str(uuid.uuid4())

pytestmark = pytest.mark.django_db


def _connect(n: int, *, role: str = "operator", device_id: str = "", seconds_ago: int = 0) -> None:
    device_connections.connection_register(
        record=connection_record(
            boot_id=BOOT_ID,
            channel_name=f"channel.{n}",
            role=role,
            scopes=["operator.read"] if role == "operator" else [],
            device_id=device_id,
            node_id=device_id if role == "node" else "",
            display_name=f"host {n}",
        )
    )
    connected_at = timezone.now() - timedelta(seconds=seconds_ago)
    GatewayConnection.objects.filter(channel_name=f"channel.{n}").update(connected_at=connected_at)


@pytest.fixture(autouse=True)
def live_process():
    connections.process_register(boot_id=BOOT_ID)


def test_it_lists_devices_newest_first_with_every_role_of_a_device():
    PairedDevice.objects.create(
        device_id="a" * 64, public_key="pk", roles=["operator", "node"], approved_at=timezone.now()
    )
    _connect(1, device_id="a" * 64, seconds_ago=30)
    _connect(2, role="node", device_id="a" * 64, seconds_ago=20)
    _connect(3, seconds_ago=10)  # no device: an entry per connection

    first, second = presence_entries()

    assert first == {
        "host": "host 3",
        "ip": "127.0.0.1",
        "version": "1",
        "platform": "linux",
        "mode": "cli",
        "reason": "connect",
        "roles": ["operator"],
        "scopes": ["operator.read"],
        "onlineSince": to_ms(GatewayConnection.objects.get(channel_name="channel.3").connected_at),
        "ts": first["onlineSince"],
    }
    assert second["deviceId"] == "a" * 64
    assert second["roles"] == ["node", "operator"]
    assert second["host"] == "host 2"


def test_it_is_capped_to_the_newest_entries():
    for n in range(PRESENCE_MAX_ENTRIES + 5):
        _connect(n, seconds_ago=1000 - n)

    entries = presence_entries()

    assert len(entries) == PRESENCE_MAX_ENTRIES
    assert entries[0]["host"] == f"host {PRESENCE_MAX_ENTRIES + 4}"
    assert entries[-1]["host"] == "host 5"
