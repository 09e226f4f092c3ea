"""The project's `bootstrap` management command (migrations, the gateway token, the first admin login)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
import uuid
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from psycopg import sql

from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
POSTGRES_URL = os.environ.get("DATABASE_URL", "")


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(databases=["default", "harness"])
def test_bootstrap_creates_the_admin_and_token_once(settings, tmp_path):
    from gateway.conf import shared_token

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


def bootstrap_process(database_url: str, state_dir: Path) -> subprocess.CompletedProcess:
    """``manage.py bootstrap`` as ``./dev run`` and ``./dev cluster`` run it, on ``database_url``."""
    env = {key: value for key, value in os.environ.items() if key != "HARNESS_DATABASE_URL"}
    env.update(DATABASE_URL=database_url, OPENCLAW_STATE_DIR=str(state_dir))
    return subprocess.run(
        [sys.executable, "manage.py", "bootstrap"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(not POSTGRES_URL.startswith(("postgres://", "postgresql://")), reason="needs PostgreSQL")
def test_bootstrap_creates_a_missing_postgres_database_once(tmp_path):
    name = f"openclaw_bootstrap_{uuid.uuid4().hex[:12]}"
    server = urllib.parse.urlsplit(POSTGRES_URL)
    url = urllib.parse.urlunsplit(server._replace(path=f"/{name}"))
    try:
        first = bootstrap_process(url, tmp_path)
        second = bootstrap_process(url, tmp_path)
    finally:
        with psycopg.connect(urllib.parse.urlunsplit(server._replace(path="/postgres")), autocommit=True) as admin:
            tables = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchall()
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    assert first.returncode == 0, first.stderr
    assert f"Created the PostgreSQL database {name}" in first.stdout
    assert "Admin login created: admin" in first.stdout
    assert second.returncode == 0, second.stderr
    assert "Created the PostgreSQL database" not in second.stdout
    assert tables == [(1,)]


def test_bootstrap_on_an_unreachable_postgres_server_says_so_without_a_traceback(tmp_path):
    result = bootstrap_process(f"postgres://postgres@127.0.0.1:{free_port()}/openclaw", tmp_path)

    assert result.returncode == 1
    assert "cannot connect to PostgreSQL database openclaw: connection failed" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "admin-credentials").exists()
