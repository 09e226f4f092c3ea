"""Factories of devices, pairing requests, tokens and connections for the tests of the gateway core, devices_app
and the apps above them (loaded for every test by the root conftest)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from django.utils import timezone

from devices_app.models import DevicePairingRequest, DeviceToken, PairedDevice
from devices_app.services import pairing
from gateway import scopes as sc
from gateway.auth import hash_device_token
from gateway.models import GatewayConnection, GatewayProcess


def _device_id(n: int) -> str:
    return f"{n:064x}"


@pytest.fixture
def make_pairing_request() -> Callable[..., DevicePairingRequest]:
    """An open pairing request, recorded the way a connecting device records it."""

    def make(n: int = 1, *, role: str = sc.ROLE_OPERATOR, scopes: list[str] | None = None) -> DevicePairingRequest:
        claim = pairing.PairingClaim(
            device_id=_device_id(n),
            public_key=f"pk-{n}",
            role=role,
            scopes=[sc.READ, sc.WRITE] if scopes is None else scopes,
            reason="not-paired",
            is_repair=False,
            display_name=f"Laptop {n}",
            platform="linux",
            client_id="cli",
            client_mode="cli",
        )
        request, created = pairing.pairing_request_ensure(claim=claim)
        assert created
        return request

    return make


@pytest.fixture
def make_device() -> Callable[..., PairedDevice]:
    def make(n: int = 1, *, roles: list[str] | None = None) -> PairedDevice:
        return PairedDevice.objects.create(
            device_id=_device_id(n),
            public_key=f"pk-{n}",
            display_name=f"Device {n}",
            platform="linux",
            roles=roles or [sc.ROLE_OPERATOR],
            approved_scopes=[sc.READ, sc.WRITE],
            approved_at=timezone.now(),
            last_seen_at=timezone.now(),
            last_seen_reason="connect",
        )

    return make


@pytest.fixture
def make_token() -> Callable[..., DeviceToken]:
    """A device token whose secret is ``secret-<device>-<role>``; only its hash is stored."""

    def make(device: PairedDevice, role: str = sc.ROLE_OPERATOR, *, revoked: bool = False) -> DeviceToken:
        return DeviceToken.objects.create(
            device=device,
            role=role,
            token_hash=hash_device_token(f"secret-{device.device_id}-{role}"),
            scopes=[sc.READ] if role == sc.ROLE_OPERATOR else [],
            revoked_at=timezone.now() if revoked else None,
        )

    return make


@pytest.fixture
def gateway_process() -> GatewayProcess:
    now = timezone.now()
    return GatewayProcess.objects.create(
        boot_id=uuid.uuid4(), hostname="gw-test", pid=4242, started_at=now, heartbeat_at=now
    )


@pytest.fixture
def make_connection(gateway_process: GatewayProcess) -> Callable[..., GatewayConnection]:
    def make(device: PairedDevice, role: str = sc.ROLE_OPERATOR) -> GatewayConnection:
        conn_id = uuid.uuid4()
        return GatewayConnection.objects.create(
            conn_id=conn_id,
            process=gateway_process,
            channel_name=f"inmemory!{conn_id.hex}",
            role=role,
            scopes=[sc.READ],
            auth_method="device-token",
            device_id=device.device_id,
            node_id=device.device_id if role == sc.ROLE_NODE else "",
            client_id="cli",
            client_mode="cli",
            connected_at=timezone.now(),
        )

    return make
