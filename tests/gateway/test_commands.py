"""Management commands: bootstrap and pairing (the same services as the RPC methods)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from openclaw_site.gateway.models import AuditLog, DevicePairingRequest, PairedDevice
from openclaw_site.gateway.services import pairing


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


@pytest.mark.django_db(databases=["default", "harness"])
def test_bootstrap_creates_the_admin_and_token_once(settings, tmp_path):
    from openclaw_site.gateway.conf import shared_token

    settings.STATE_DIR = tmp_path
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "TOKEN": ""}
    shared_token.cache_clear()
    first = run("bootstrap")
    token = (tmp_path / "gateway-token").read_text().strip()
    assert f"Gateway token (generated): {token}" in first
    assert "Admin login created: admin" in first
    assert get_user_model().objects.get(username="admin").is_superuser
    assert "password=" in (tmp_path / "admin-credentials").read_text()
    second = run("bootstrap")
    assert token not in second
    assert (tmp_path / "gateway-token").read_text().strip() == token
    shared_token.cache_clear()
