"""config.get (the effective configuration in OpenClaw's config shape, every secret redacted, no host path) and
system-presence (the presence list, read now)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from devices_app.services import connections as device_connections
from gateway import conf
from gateway import scopes as sc
from gateway.effective_config import REDACTED, config_snapshot, shown_url
from gateway.models import GatewayConnection
from gateway.registry import registry
from gateway.rpc import system_presence_rpc
from gateway.selectors import presence_entries
from gateway.services import connections
from tests.support.connections import connection_record, dispatched
from tests.support.processes import ROOT

OPENCLAW = json.loads((ROOT / "tests" / "fixtures" / "openclaw_startup_reads.json").read_text())
TOKEN = "gateway-token-do-not-show-0123456789"
PASSWORD = "gateway-password-do-not-show"
API_KEY = "sk-provider-key-do-not-show-0123456789"


def call(method: str, params: dict | None = None, scopes: list[str] | None = None) -> dict:
    return dispatched(method, params, scopes=scopes if scopes is not None else [sc.READ])


@pytest.fixture
def configured(settings):
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "TOKEN": TOKEN, "PASSWORD": PASSWORD, "PORT": 18801}
    settings.OPENCLAW_MODEL = {
        **settings.OPENCLAW_MODEL,
        "PROVIDER": "openai",
        "BASE_URL": f"https://user:{PASSWORD}@models.example/v1?api_key={API_KEY}",
        "API_KEY": API_KEY,
        "MODEL": "gpt-test",
    }
    conf.shared_token.cache_clear()
    yield settings
    conf.shared_token.cache_clear()


def test_config_get_shows_the_effective_settings_under_openclaws_names_with_secrets_redacted(configured):
    response = call("config.get")
    assert response["ok"] is True, response
    snapshot = response["payload"]
    config = snapshot["config"]
    assert config == {
        "gateway": {
            "mode": "local",
            "port": 18801,
            "bind": "loopback",
            "auth": {"mode": "token", "token": REDACTED, "password": REDACTED},
        },
        "agents": {
            "defaults": {
                "model": {"primary": "openai/gpt-test"},
                "timeoutSeconds": configured.OPENCLAW_AGENT["TURN_TIMEOUT_S"],
            }
        },
        "models": {
            "providers": {
                "openai": {
                    "baseUrl": f"https://user:{REDACTED}@models.example/v1?api_key={REDACTED}",
                    "apiKey": REDACTED,
                    "api": "openai-completions",
                    "models": [{"id": "gpt-test", "name": "gpt-test"}],
                }
            }
        },
        "tools": {"exec": {"timeoutSeconds": configured.OPENCLAW_AGENT["EXEC_TIMEOUT_S"]}},
    }
    assert json.loads(snapshot["raw"]) == config
    for view in ("parsed", "sourceConfig", "resolved", "runtimeConfig"):
        assert snapshot[view] == config
    assert snapshot["valid"] is True and snapshot["exists"] is True
    assert snapshot["issues"] == snapshot["warnings"] == snapshot["legacyIssues"] == []
    assert snapshot["hash"] == snapshot["configRevisionHash"] == snapshot["appliedConfigHash"]
    assert snapshot["hash"].startswith("sha256:")
    # OpenClaw's keys, without the config file's path (the configuration is the environment here).
    assert snapshot.keys() == OPENCLAW["config.get {} (views of the configuration elided)"].keys() - {"path"}
    text = json.dumps(snapshot)
    for secret in (TOKEN, PASSWORD, API_KEY):
        assert secret not in text
    assert str(configured.STATE_DIR) not in text


def test_config_get_without_a_provider_key_or_with_echo_names_no_key(settings):
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "BIND": "0.0.0.0"}
    settings.OPENCLAW_MODEL = {**settings.OPENCLAW_MODEL, "PROVIDER": "echo", "MODEL": "echo"}
    config = config_snapshot()["config"]
    assert config["gateway"]["bind"] == "lan"
    assert config["agents"]["defaults"]["model"] == {"primary": "echo/echo"}
    assert "models" not in config
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "BIND": "10.0.0.5"}
    settings.OPENCLAW_MODEL = {
        **settings.OPENCLAW_MODEL,
        "PROVIDER": "openai",
        "BASE_URL": "http://127.0.0.1:9/v1",
        "API_KEY": "",
    }
    config = config_snapshot()["config"]
    assert config["gateway"] | {"auth": None} == {
        "mode": "local",
        "port": settings.OPENCLAW_GATEWAY["PORT"],
        "bind": "custom",
        "customBindHost": "10.0.0.5",
        "auth": None,
    }
    assert config["models"]["providers"]["openai"].keys() == {"baseUrl", "api", "models"}


def test_a_provider_url_keeps_its_meaning_but_not_its_credentials():
    assert shown_url("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/v1"
    assert shown_url("https://bob@host/v1") == "https://bob@host/v1"
    assert shown_url("https://bob:pw@host:8443/v1") == f"https://bob:{REDACTED}@host:8443/v1"
    assert shown_url("https://host/v1?token=abc&x=1") == f"https://host/v1?token={REDACTED}&x=1"
    assert shown_url("https://host/sk-abcdefghijklmnop/v1") == f"https://host/sk-{REDACTED}/v1"


def test_config_get_takes_no_params_and_needs_operator_read():
    assert registry.methods["config.get"].scope == sc.READ and "config.get" in registry.method_names()
    assert call("config.get", {"path": "gateway"})["error"]["message"] == (
        "invalid config.get params: at /path: unexpected property"
    )
    assert call("config.get", scopes=[sc.PAIRING])["error"]["message"] == "missing scope: operator.read"


@pytest.mark.django_db
def test_system_presence_is_the_presence_list():
    boot_id = str(uuid.uuid4())
    connections.process_register(boot_id=boot_id)
    for n, host in enumerate(("older-host", "newer-host")):
        device_connections.connection_register(
            record=connection_record(
                boot_id=boot_id, channel_name=f"channel.{n}", role="operator", scopes=[sc.READ], display_name=host
            )
        )
        GatewayConnection.objects.filter(channel_name=f"channel.{n}").update(
            connected_at=timezone.now() - timedelta(seconds=10 - n)
        )
    entries = system_presence_rpc(None, None)
    assert entries == presence_entries()
    assert [entry["host"] for entry in entries] == ["newer-host", "older-host"]
    assert entries[0].keys() <= {
        *OPENCLAW["system-presence {}"][0].keys(),
        "deviceId",
        "roles",
        "scopes",
        "onlineSince",
    }
    assert registry.methods["system-presence"].scope == sc.READ
    assert call("system-presence", {"all": True})["error"]["message"] == (
        "invalid system-presence params: at /all: unexpected property"
    )
