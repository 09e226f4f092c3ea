"""The static-ssh provider believes what a host says of its node host only as far as the host's public key proves it:
a device id is the hash of the key, so a host whose ``device.json`` names another node's id gets no other node (it is
enrolled under its own key's id) and, when its node host then does not connect, only its own enrollment is removed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from devices_app.models import PairedDevice
from devices_app.services import pairing
from gateway.audit import Actor
from openclaw_client.identity import DeviceIdentity
from workers_app.nodes import ssh
from workers_app.providers import WorkerProviderError

pytestmark = pytest.mark.django_db


@pytest.fixture
def host(monkeypatch):
    """An SSH host whose probe answers what the test says; the install does nothing (no node host ever connects)."""
    answers: dict = {}
    target = SimpleNamespace(work_dir="/srv/worker", user="ops", host="box", address="ops@box:22")
    monkeypatch.setattr(ssh, "profile_for_environment", lambda *args: object())
    monkeypatch.setattr(ssh, "ssh_target", lambda profile: target)
    monkeypatch.setattr(
        ssh, "ssh_run", lambda target, command, **kwargs: json.dumps(answers) if "-c" not in command else ""
    )
    monkeypatch.setattr(ssh, "CONNECT_TIMEOUT_S", 0.3)
    return answers


def environment():
    return SimpleNamespace(provider_id="ssh", profile_id="box", profile_snapshot={})


def test_a_host_naming_another_nodes_id_is_enrolled_under_its_own_key_and_the_victim_is_untouched(host):
    victim_identity, host_identity = DeviceIdentity.generate(), DeviceIdentity.generate()
    victim, _token = pairing.node_enroll(
        public_key=victim_identity.public_key, display_name="victim", commands=[], caps=[], actor=Actor.system("test")
    )
    host.update(deviceId=victim.device_id, publicKey=host_identity.public_key, running=True)

    with pytest.raises(WorkerProviderError, match="did not connect"):
        ssh.ensure_ssh_node(environment())

    assert PairedDevice.objects.filter(device_id=victim.device_id).exists()
    # The host's own enrollment (under its key's id) was withdrawn when its node host did not connect.
    assert not PairedDevice.objects.filter(device_id=host_identity.device_id).exists()


def test_a_host_whose_file_holds_no_valid_key_gets_a_fresh_identity(host):
    host.update(deviceId="f" * 64, publicKey="not a key", running=True)

    with pytest.raises(WorkerProviderError, match="did not connect"):
        ssh.ensure_ssh_node(environment())

    assert not PairedDevice.objects.exists()
