"""The `pairing` management command: the same services as the device.pair.* methods."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from devices_app.models import DevicePairingRequest, PairedDevice
from devices_app.services import pairing
from gateway.models import AuditLog


def _request(device_id: str = "c" * 64) -> DevicePairingRequest:
    request, _ = pairing.pairing_request_ensure(
        claim=pairing.PairingClaim(
            device_id=device_id,
            public_key="pk",
            role="node",
            scopes=[],
            reason="not-paired",
            is_repair=False,
            commands=["echo"],
        )
    )
    return request


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_pairing_list_approve_and_remove():
    request = _request()
    listed = json.loads(run("pairing", "list"))
    assert [p["requestId"] for p in listed["pending"]] == [str(request.pk)]
    approved = json.loads(run("pairing", "approve", str(request.pk)))
    assert approved == {"requestId": str(request.pk), "deviceId": "c" * 64, "roles": ["node"]}
    assert PairedDevice.objects.get().approved_commands == ["echo"]
    assert AuditLog.objects.get().actor == "cli:manage.py pairing"
    assert json.loads(run("pairing", "remove", "c" * 64)) == {"deviceId": "c" * 64, "removed": True}
    assert not PairedDevice.objects.exists()


@pytest.mark.django_db
def test_pairing_errors_are_command_errors_and_change_nothing():
    request = _request()
    run("pairing", "reject", str(request.pk))
    with pytest.raises(CommandError, match="INVALID_REQUEST: unknown requestId"):
        run("pairing", "approve", str(request.pk))
    with pytest.raises(CommandError, match="INVALID_REQUEST: unknown deviceId"):
        run("pairing", "remove", "nope")
    assert not PairedDevice.objects.exists()
