"""The static-ssh worker provider (workers.md §6) against a real sshd, and the profile checks at start."""

from __future__ import annotations

import json
import time

import asyncssh
import pytest

from openclaw_site.env import SettingsError
from tests.support.processes import manage_check
from workers_app.profiles import parse_profiles
from workers_app.providers import ProviderRegistry, WorkerProfile, WorkerProviderError, providers
from workers_app.providers.static_ssh import StaticSshProvider

PROVIDER = StaticSshProvider()
HOST_KEY = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()
GOOD = {
    "host": "127.0.0.1",
    "port": 2222,
    "user": "worker",
    "hostKey": HOST_KEY,
    "keyRef": {"source": "file", "id": "/nonexistent/key"},
    "connectTimeoutMs": 2000,
}


def profile(**settings) -> WorkerProfile:
    return WorkerProfile(id="dev", provider_id="static-ssh", settings=settings)


def refused(error: pytest.ExceptionInfo[WorkerProviderError], code: str) -> str:
    assert error.value.code == code, error.value.message
    return error.value.message


# --- settings ----------------------------------------------------------------------------------


def test_good_settings_and_a_partial_profile_pass_validation():
    PROVIDER.validate_settings(GOOD)
    PROVIDER.validate_settings({})
    PROVIDER.validate_settings({"keyRef": {"source": "env", "id": "WORKER_KEY", "provider": "default"}})
    PROVIDER.validate_settings({"hostKey": f"{HOST_KEY} root@worker", "port": 1})


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"host": ""}, "host"),
        ({"host": "  "}, "host"),
        ({"host": 7}, "host"),
        ({"user": ""}, "user"),
        ({"user": None}, "user"),
        ({"port": 0}, "port"),
        ({"port": 65536}, "port"),
        ({"port": "22"}, "port"),
        ({"port": True}, "port"),
        ({"port": 22.0}, "port"),
        ({"connectTimeoutMs": 99}, "connectTimeoutMs"),
        ({"connectTimeoutMs": 120001}, "connectTimeoutMs"),
        ({"connectTimeoutMs": False}, "connectTimeoutMs"),
        ({"hostKey": ""}, "hostKey"),
        ({"hostKey": "ssh-ed25519"}, "hostKey"),
        ({"hostKey": "ssh-ed25519 not-base64!"}, "hostKey"),
        ({"hostKey": f"{HOST_KEY}\n{HOST_KEY}"}, "hostKey"),
        ({"hostKey": f"ssh-rsa {HOST_KEY.split()[1]}"}, "hostKey"),
        ({"hostKey": "ssh-ed25519 AAAA"}, "hostKey"),
        ({"hostKey": f"[127.0.0.1]:2222 {HOST_KEY}"}, "hostKey"),
        ({"keyRef": "/path/to/key"}, "keyRef"),
        ({"keyRef": {"source": "exec", "id": "x"}}, "keyRef.source"),
        ({"keyRef": {"id": "x"}}, "keyRef.source"),
        ({"keyRef": {"source": "file", "id": ""}}, "keyRef.id"),
        ({"keyRef": {"source": "env"}}, "keyRef.id"),
        ({"keyRef": {"source": "env", "id": "K", "provider": 3}}, "keyRef.provider"),
        ({"keyRef": {"source": "env", "id": "K", "value": "secret"}}, "keyRef.value"),
        ({"password": "hunter2"}, "password"),
    ],
)
def test_each_bad_field_is_named(bad, field):
    with pytest.raises(WorkerProviderError) as error:
        PROVIDER.validate_settings({**GOOD, **bad})
    assert error.value.code == "invalid_profile"
    assert error.value.field == field


# --- provision ---------------------------------------------------------------------------------


def test_provision_logs_in_and_returns_the_logical_lease(sshd):
    settings = sshd.profile_settings()
    lease = PROVIDER.provision(profile(**settings), "op-1")
    assert lease.lease_id == "static-ssh:op-1"
    assert lease.shared_host is True
    assert lease.ssh is not None
    assert (lease.ssh.host, lease.ssh.port, lease.ssh.user) == ("127.0.0.1", sshd.port, sshd.user)
    assert lease.ssh.host_key == sshd.host_key
    assert lease.ssh.key_ref == {"source": "file", "id": str(sshd.client_key_path)}
    # A retry of the same operation (after a restart, say) gets the same lease.
    assert PROVIDER.provision(profile(**settings), "op-1") == lease
    assert PROVIDER.provision(profile(**settings), "op-2").lease_id == "static-ssh:op-2"
    assert "Accepted publickey" in sshd.log()


def test_provision_reads_the_key_from_an_environment_variable(sshd, monkeypatch):
    monkeypatch.setenv("STATIC_SSH_TEST_KEY", sshd.client_key_path.read_text())
    settings = sshd.profile_settings(keyRef={"source": "env", "id": "STATIC_SSH_TEST_KEY"})
    assert PROVIDER.provision(profile(**settings), "op-env").lease_id == "static-ssh:op-env"


@pytest.mark.parametrize("operation_id", ["", "   "])
def test_provision_needs_an_operation_id(operation_id):
    with pytest.raises(WorkerProviderError, match="static-ssh provision needs an operation id"):
        PROVIDER.provision(profile(**GOOD), operation_id)


@pytest.mark.parametrize("missing", ["host", "user", "hostKey", "keyRef"])
def test_provision_needs_the_connection_fields(missing):
    settings = {key: value for key, value in GOOD.items() if key != missing}
    with pytest.raises(WorkerProviderError) as error:
        PROVIDER.provision(profile(**settings), "op-1")
    refused(error, "invalid_profile")
    assert error.value.field == missing


def test_an_unreadable_key_names_the_profile_s_key_ref_and_never_its_path_or_content(sshd, monkeypatch, tmp_path):
    with pytest.raises(WorkerProviderError) as error:
        PROVIDER.provision(profile(**sshd.profile_settings(keyRef={"source": "file", "id": "/nonexistent/key"})), "o")
    message = refused(error, "invalid_profile")
    assert message == "the keyRef key file of profile dev cannot be read: No such file or directory"
    assert error.value.field == "keyRef"

    with pytest.raises(WorkerProviderError) as error:
        PROVIDER.provision(profile(**sshd.profile_settings(keyRef={"source": "env", "id": "STATIC_SSH_UNSET"})), "o")
    message = refused(error, "invalid_profile")
    assert message == "the keyRef environment variable STATIC_SSH_UNSET of profile dev holds no key"

    secret = "-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LWtleS1tYXRlcmlhbA==\n-----END OPENSSH PRIVATE KEY-----\n"
    monkeypatch.setenv("STATIC_SSH_BAD_KEY", secret)
    (tmp_path / "bad_key").write_text(secret)
    for key_ref in ({"source": "env", "id": "STATIC_SSH_BAD_KEY"}, {"source": "file", "id": str(tmp_path / "bad_key")}):
        with pytest.raises(WorkerProviderError) as error:
            PROVIDER.provision(profile(**sshd.profile_settings(keyRef=key_ref)), "o")
        message = refused(error, "invalid_profile")
        assert error.value.field == "keyRef"
        assert "c2VjcmV0" not in message and "BEGIN" not in message and str(tmp_path) not in message
        assert message.endswith("of profile dev is not an unencrypted private key (OpenSSH or PEM)")


def test_a_host_presenting_another_host_key_is_refused(sshd):
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()
    with pytest.raises(WorkerProviderError) as error:
        PROVIDER.provision(profile(**sshd.profile_settings(hostKey=other)), "op-1")
    message = refused(error, "transient")
    assert message == f"static-ssh host 127.0.0.1:{sshd.port} did not present the host key of the profile's hostKey"
    # Refused at key exchange: the client never offered its key.
    assert "Accepted publickey" not in sshd.log()


def test_a_client_key_the_host_does_not_accept_is_refused(sshd, tmp_path):
    stranger = tmp_path / "stranger"
    stranger.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key("openssh"))
    settings = sshd.profile_settings(keyRef={"source": "file", "id": str(stranger)})
    with pytest.raises(WorkerProviderError) as error:
        PROVIDER.provision(profile(**settings), "op-1")
    message = refused(error, "transient")
    assert message == f"static-ssh host 127.0.0.1:{sshd.port} refused the keyRef key for user {sshd.user}"
    assert "PRIVATE KEY" not in message


def test_a_stopped_host_is_a_transient_failure_naming_it(sshd):
    sshd.stop()
    with pytest.raises(WorkerProviderError) as error:
        PROVIDER.provision(profile(**sshd.profile_settings()), "op-1")
    message = refused(error, "transient")
    assert message == f"static-ssh host 127.0.0.1:{sshd.port} is unreachable: Connection refused"


def test_a_host_that_never_answers_times_out_within_connect_timeout(hanging_listener, sshd):
    settings = sshd.profile_settings(port=hanging_listener.port, connectTimeoutMs=500)
    started = time.monotonic()
    with pytest.raises(WorkerProviderError) as error:
        PROVIDER.provision(profile(**settings), "op-1")
    assert time.monotonic() - started < 30
    message = refused(error, "transient")
    assert message == f"static-ssh host 127.0.0.1:{hanging_listener.port} is unreachable: no answer within 500 ms"
    assert hanging_listener.accepted, "the probe never reached the listener"


# --- inspect and destroy -----------------------------------------------------------------------


@pytest.mark.parametrize("lease_id", ["static-ssh:", "", "cbx_0123456789ab", "static-ssh", "device:abc"])
def test_a_bare_or_foreign_lease_is_unknown_without_any_network(lease_id, hanging_listener, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("inspect connected")

    monkeypatch.setattr(asyncssh, "connect", no_network)
    settings = {**GOOD, "port": hanging_listener.port, "connectTimeoutMs": 120000}
    assert PROVIDER.inspect(lease_id, profile(**settings)).status == "unknown"
    assert hanging_listener.accepted == []


def test_inspect_is_active_while_the_host_answers(sshd):
    inspection = PROVIDER.inspect("static-ssh:op-1", profile(**sshd.profile_settings()))
    assert (inspection.status, inspection.shared_host) == ("active", True)
    assert "Accepted publickey" in sshd.log()


def test_inspect_without_a_host_is_active_as_the_dev_provider():
    inspection = PROVIDER.inspect("static-ssh:op-1", profile())
    assert (inspection.status, inspection.shared_host) == ("active", True)


def test_inspect_raises_while_the_host_is_down(sshd, hanging_listener):
    sshd.stop()
    with pytest.raises(WorkerProviderError) as error:
        PROVIDER.inspect("static-ssh:op-1", profile(**sshd.profile_settings()))
    assert refused(error, "transient").endswith("is unreachable: Connection refused")
    # A hanging host is no more "gone" than a stopped one.
    with pytest.raises(WorkerProviderError) as error:
        PROVIDER.inspect(
            "static-ssh:op-1", profile(**sshd.profile_settings(port=hanging_listener.port, connectTimeoutMs=300))
        )
    assert "no answer within 300 ms" in refused(error, "transient")


def test_destroy_releases_the_logical_lease_idempotently(sshd):
    sshd.stop()
    for lease_id in ("static-ssh:op-1", "static-ssh:op-1", "static-ssh:", "cbx_0123456789ab"):
        assert PROVIDER.destroy(lease_id, profile(**sshd.profile_settings())) is None


# --- profiles ----------------------------------------------------------------------------------


@pytest.fixture
def registry() -> ProviderRegistry:
    registry = ProviderRegistry()
    registry.register(StaticSshProvider())
    return registry


def test_the_app_registers_the_provider():
    assert isinstance(providers.get("static-ssh"), StaticSshProvider)


def test_good_profiles_parse(registry):
    parsed = parse_profiles({"dev": {"provider": "static-ssh", "install": "local", "settings": GOOD}}, registry)
    assert parsed["dev"] == WorkerProfile(id="dev", provider_id="static-ssh", install="local", settings=GOOD)
    assert parse_profiles({"bare": {"provider": "static-ssh"}}, registry)["bare"].install == "bundle"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"provider": "crabbox"},
            "OPENCLAW_WORKER_PROFILES: profile 'dev': field 'provider' names an unknown provider 'crabbox' "
            "(registered: static-ssh)",
        ),
        (
            {"provider": "static-ssh", "install": "docker"},
            "OPENCLAW_WORKER_PROFILES: profile 'dev': field 'install' must be 'bundle' or 'local', not 'docker'",
        ),
        (
            {"provider": "static-ssh", "region": "eu"},
            "OPENCLAW_WORKER_PROFILES: profile 'dev': unknown field 'region'",
        ),
        (
            {"provider": "static-ssh", "settings": {**GOOD, "port": 70000}},
            "OPENCLAW_WORKER_PROFILES: profile 'dev': field 'settings.port': must be a whole number from 1 to 65535",
        ),
        (
            {"provider": "static-ssh", "settings": {**GOOD, "hostKey": "nope"}},
            "OPENCLAW_WORKER_PROFILES: profile 'dev': field 'settings.hostKey'",
        ),
        (
            {"provider": "static-ssh", "settings": {**GOOD, "keyRef": {"source": "vault", "id": "k"}}},
            "OPENCLAW_WORKER_PROFILES: profile 'dev': field 'settings.keyRef.source'",
        ),
        (
            {"provider": "static-ssh", "settings": {**GOOD, "hostname": "x"}},
            "OPENCLAW_WORKER_PROFILES: profile 'dev': field 'settings.hostname': unknown field",
        ),
    ],
)
def test_a_bad_profile_names_the_profile_and_the_field(registry, entry, message):
    with pytest.raises(SettingsError) as error:
        parse_profiles({"dev": entry}, registry)
    assert str(error.value).startswith(message)


def test_a_bad_profile_stops_the_start_with_one_line_naming_it(tmp_path):
    profiles = {"dev": {"provider": "static-ssh", "settings": {**GOOD, "port": 0}}}
    result = manage_check(tmp_path, OPENCLAW_WORKER_PROFILES=json.dumps(profiles))
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: OPENCLAW_WORKER_PROFILES: profile 'dev': field 'settings.port': must be a whole number from 1 to 65535"
    )
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_a_good_profile_passes_the_check(tmp_path):
    profiles = {"dev": {"provider": "static-ssh", "settings": GOOD}}
    result = manage_check(tmp_path, OPENCLAW_WORKER_PROFILES=json.dumps(profiles))
    assert result.returncode == 0, result.stderr
