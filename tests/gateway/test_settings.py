"""Settings are checked at start: a value that cannot be used is one line naming the variable."""

from __future__ import annotations

import os
import re

import pytest

from tests.support.processes import ROOT, manage_check

CODE_DIRS = ("openclaw_site", "sessions_app", "native_harness", "workers_app", "openclaw_client")
READS = re.compile(r'(?:env_[a-z_]+|os\.environ\.get|getenv)\(\s*"([A-Z][A-Z0-9_]+)"')


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OPENCLAW_GATEWAY_PORT": "abc"}, "OPENCLAW_GATEWAY_PORT must be a whole number, not 'abc'"),
        ({"OPENCLAW_GATEWAY_PORT": "70000"}, "OPENCLAW_GATEWAY_PORT must be at most 65535, not 70000"),
        ({"DJANGO_DEBUG": "maybe"}, "DJANGO_DEBUG must be one of 1/0, true/false, yes/no, on/off, not 'maybe'"),
        ({"OPENCLAW_TASK_MODE": "celery"}, "OPENCLAW_TASK_MODE=celery needs REDIS_URL (the Celery broker)"),
        ({"OPENCLAW_TASK_MODE": "threads"}, "OPENCLAW_TASK_MODE must be one of celery, inprocess, not 'threads'"),
        ({"OPENCLAW_MODEL_READ_TIMEOUT_S": "soon"}, "OPENCLAW_MODEL_READ_TIMEOUT_S must be a number, not 'soon'"),
        (
            {"OPENCLAW_MODEL_TOTAL_TIMEOUT_S": "nan"},
            "OPENCLAW_MODEL_TOTAL_TIMEOUT_S must be a finite number, not 'nan'",
        ),
        ({"OPENCLAW_MODEL_PROVIDER": "openai"}, "OPENCLAW_MODEL_PROVIDER=openai needs OPENCLAW_MODEL_BASE_URL"),
        ({"OPENCLAW_MODEL_BASE_URL": "ftp://model"}, "OPENCLAW_MODEL_BASE_URL must be a URL starting with http://"),
        ({"DATABASE_URL": "mysql://db/x"}, "DATABASE_URL must be a URL starting with sqlite://"),
        ({"OPENCLAW_LOG_LEVEL": "loud"}, "OPENCLAW_LOG_LEVEL must be a log level"),
        ({"OPENCLAW_LOG_FORMAT": "xml"}, "OPENCLAW_LOG_FORMAT must be one of plain, json, not 'xml'"),
        ({"OPENCLAW_LOG_FILE_MAX_BYTES": "100"}, "OPENCLAW_LOG_FILE_MAX_BYTES must be at least 65536, not 100"),
        ({"OPENCLAW_LOG_FILE": "/dev/null/gateway.log"}, "OPENCLAW_LOG_FILE's directory /dev/null cannot be created"),
        ({"OPENCLAW_WORKSPACE_ROOTS": "relative/dir"}, "OPENCLAW_WORKSPACE_ROOTS must list absolute directories"),
        (
            {"OPENCLAW_PROCESS_STALE_AFTER_MS": "1000", "OPENCLAW_PROCESS_HEARTBEAT_INTERVAL_MS": "2000"},
            "OPENCLAW_PROCESS_STALE_AFTER_MS must be longer than OPENCLAW_PROCESS_HEARTBEAT_INTERVAL_MS",
        ),
        (
            {"OPENCLAW_EXECUTOR_LEASE_TTL_MS": "3000", "OPENCLAW_EXECUTOR_LEASE_RENEW_MS": "2000"},
            "OPENCLAW_EXECUTOR_LEASE_TTL_MS must be at least twice OPENCLAW_EXECUTOR_LEASE_RENEW_MS",
        ),
        ({"OPENCLAW_EXECUTOR_LEASE_TTL_MS": "500"}, "OPENCLAW_EXECUTOR_LEASE_TTL_MS must be at least 1000, not 500"),
        ({"OPENCLAW_AGENT_MAX_STEPS": "0"}, "OPENCLAW_AGENT_MAX_STEPS must be at least 1, not 0"),
        ({"OPENCLAW_HTTP_HEAD_TIMEOUT_MS": "50"}, "OPENCLAW_HTTP_HEAD_TIMEOUT_MS must be at least 100, not 50"),
        (
            {"OPENCLAW_HTTP_SLOW_HEADS_PER_ADDRESS": "0"},
            "OPENCLAW_HTTP_SLOW_HEADS_PER_ADDRESS must be at least 1, not 0",
        ),
        (
            {"OPENCLAW_HTTP_SLOW_HEADS_EXEMPT": "127.0.0.1, haproxy"},
            "OPENCLAW_HTTP_SLOW_HEADS_EXEMPT must list IP addresses or networks (10.0.0.0/8), not 'haproxy'",
        ),
        (
            {"OPENCLAW_AGENT_MAX_STEPS_BY_AGENT": '{"main": "many"}'},
            "OPENCLAW_AGENT_MAX_STEPS_BY_AGENT: the value of 'main' must be an integer, not \"many\"",
        ),
        (
            {"OPENCLAW_TOOLS_EXEC_TIMEOUT_S": "600", "OPENCLAW_TOOLS_EXEC_MAX_TIMEOUT_S": "60"},
            "OPENCLAW_TOOLS_EXEC_TIMEOUT_S must not exceed OPENCLAW_TOOLS_EXEC_MAX_TIMEOUT_S",
        ),
        (
            {"OPENCLAW_TURN_TIMEOUT_S": "60", "OPENCLAW_EXEC_APPROVAL_TIMEOUT_MS": "60000"},
            "OPENCLAW_EXEC_APPROVAL_TIMEOUT_MS must be shorter than OPENCLAW_TURN_TIMEOUT_S",
        ),
    ],
)
def test_a_bad_setting_stops_the_start_with_one_line_naming_it(tmp_path, env, message):
    result = manage_check(tmp_path, **env)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {message}")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_good_settings_pass_the_check(tmp_path):
    result = manage_check(
        tmp_path,
        OPENCLAW_GATEWAY_PORT="0",
        DJANGO_DEBUG="off",
        OPENCLAW_MODEL_BASE_URL="http://127.0.0.1:9/v1",
        OPENCLAW_WORKSPACE_ROOTS=f"{tmp_path}{os.pathsep}/srv",
        OPENCLAW_HTTP_SLOW_HEADS_EXEMPT="127.0.0.1, 10.0.0.0/8, ::1",
    )
    assert result.returncode == 0, result.stderr


def test_the_log_file_is_under_the_state_dir_unless_set_empty(tmp_path):
    written = tmp_path / "written"
    assert manage_check(written, OPENCLAW_LOG_FORMAT="json").returncode == 0
    assert (written / "logs").is_dir()
    disabled = tmp_path / "disabled"
    assert manage_check(disabled, OPENCLAW_LOG_FILE="").returncode == 0
    assert not (disabled / "logs").exists()


def test_the_readme_documents_every_variable_the_code_reads():
    names = set()
    for directory in CODE_DIRS:
        for path in (ROOT / directory).rglob("*.py"):
            names.update(READS.findall(path.read_text(encoding="utf-8")))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    undocumented = sorted(name for name in names - {"DJANGO_SETTINGS_MODULE"} if f"`{name}`" not in readme)
    assert names, "the scan found no variables"
    assert undocumented == []
