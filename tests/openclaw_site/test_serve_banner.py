"""The start-up banner of ``manage.py serve``: the real URLs with the bound port, the admin login and where its
password is kept (never the password itself)."""

from __future__ import annotations

import pytest

from gateway.conf import shared_token
from openclaw_site.management.commands.serve import banner_for

PASSWORD = "not-to-be-printed-8d1f"


@pytest.fixture
def state(settings, tmp_path):
    settings.STATE_DIR = tmp_path
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "TOKEN": ""}
    settings.REDIS_URL = ""
    settings.OPENCLAW_TASK_MODE = "inprocess"
    settings.OPENCLAW_MODEL = {**settings.OPENCLAW_MODEL, "PROVIDER": "echo"}
    shared_token.cache_clear()
    yield tmp_path
    shared_token.cache_clear()


def test_the_banner_names_every_url_with_the_bound_port_and_the_password_file(state):
    (state / "admin-credentials").write_text(f"username=operator-1\npassword={PASSWORD}\n")
    text = "\n".join(banner_for("127.0.0.1", 43210).lines())
    assert text.splitlines()[0].startswith("OpenClaw gateway listening on ws://127.0.0.1:43210/ (database: ")
    assert "  console:         http://127.0.0.1:43210/ui/" in text
    assert "  admin:           http://127.0.0.1:43210/admin/" in text
    assert "  API docs:        http://127.0.0.1:43210/api/docs" in text
    assert f"  gateway socket:  ws://127.0.0.1:43210/  (token in {state / 'gateway-token'})" in text
    assert f"log in as operator-1, password in {state / 'admin-credentials'}" in text
    assert PASSWORD not in text
    assert "18789" not in text
    assert "live updates: in this process" in text
    assert "turns run:       in this process" in text
    assert "built-in echo" in text


def test_a_wildcard_bind_prints_this_hosts_urls_and_says_it_listens_everywhere(state):
    lines = banner_for("0.0.0.0", 40001).lines()
    assert "  console:         http://127.0.0.1:40001/ui/" in "\n".join(lines)
    assert lines[-1] == "  listening on every address of this host (0.0.0.0), not only 127.0.0.1"


def test_an_ipv6_address_is_bracketed(state):
    text = "\n".join(banner_for("::1", 40001).lines())
    assert "http://[::1]:40001/admin/" in text
    assert "ws://[::1]:40001/" in text


def test_without_a_credentials_file_the_banner_says_how_to_make_a_login(state):
    text = "\n".join(banner_for("127.0.0.1", 40001).lines())
    assert (
        f"no admin password kept in {state / 'admin-credentials'}: make a login with manage.py createsuperuser" in text
    )


def test_a_credentials_file_without_a_username_is_treated_as_missing(state):
    (state / "admin-credentials").write_text(f"password={PASSWORD}\n")
    text = "\n".join(banner_for("127.0.0.1", 40001).lines())
    assert "manage.py createsuperuser" in text
    assert PASSWORD not in text


def test_a_token_from_the_environment_is_named_as_such_and_not_printed(state, settings):
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "TOKEN": "env-token-value"}
    text = "\n".join(banner_for("127.0.0.1", 40001).lines())
    assert "(token from OPENCLAW_GATEWAY_TOKEN)" in text
    assert "env-token-value" not in text


def test_redis_and_celery_are_said_in_plain_words(state, settings):
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    settings.OPENCLAW_TASK_MODE = "celery"
    settings.OPENCLAW_MODEL = {
        **settings.OPENCLAW_MODEL,
        "PROVIDER": "openai",
        "MODEL": "m-1",
        "BASE_URL": "http://h/v1",
    }
    text = "\n".join(banner_for("127.0.0.1", 40001).lines())
    assert "live updates: through Redis" in text
    assert "turns run:       in Celery workers" in text
    assert "model provider:  m-1 at http://h/v1" in text
    assert "channel layer" not in text
