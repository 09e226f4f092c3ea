"""``logs.tail`` through the gateway's request path: OpenClaw's params and result, cursor paging over the gateway's
own log file, the server-side bounds, rotation, refusals with the reference's error, and the scope."""

from __future__ import annotations

import asyncio
import json
import logging
import logging.config

import pytest
from django.conf import settings as django_settings

from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.dispatch import run_request
from gateway.log_files import SharedRotatingFileHandler
from gateway.protocol import RequestFrame
from gateway.registry import registry
from openclaw_site.log_config import logging_config
from operations_app import logs

pytestmark = pytest.mark.django_db(transaction=True)

RESULT_KEYS = {"file", "cursor", "size", "lines", "truncated", "reset"}


def ctx(*scopes: str, role: str = sc.ROLE_OPERATOR) -> RpcContext:
    return RpcContext(
        conn_id="conn-1",
        channel_name="inmemory!conn-1",
        role=role,
        scopes=list(scopes),
        auth_method="token",
        client_id="test",
        client_mode="test",
    )


READER = ctx(sc.READ)


def tail(params: dict | None = None, context: RpcContext = READER) -> dict:
    frame = RequestFrame(type="req", id="r1", method="logs.tail", params=params if params is not None else {})
    return asyncio.run(run_request(context, frame))


def ok(params: dict | None = None, context: RpcContext = READER) -> dict:
    response = tail(params, context)
    assert response["ok"], response
    assert set(response["payload"]) == RESULT_KEYS
    return response["payload"]


def refusal(response: dict) -> tuple[str, str]:
    assert response["ok"] is False, response
    return response["error"]["code"], response["error"]["message"]


@pytest.fixture
def log_path(tmp_path, settings):
    path = tmp_path / "logs" / "gateway.log"
    path.parent.mkdir()
    settings.OPENCLAW_LOG_FILE = path
    return path


def append(path, *lines: str) -> None:
    with open(path, "a", encoding="utf-8") as stream:
        stream.writelines(f"{line}\n" for line in lines)


def test_registered_under_operator_read_as_openclaw_has_it_and_advertised():
    spec = registry.methods["logs.tail"]
    assert (spec.scope, spec.role) == (sc.READ, "operator")
    assert "logs.tail" in registry.method_names()


def test_the_first_call_returns_the_newest_lines_and_the_cursor_pages_forward(log_path):
    append(log_path, *(f"line {n}" for n in range(10)))

    first = ok({"limit": 3})
    assert first["lines"] == ["line 7", "line 8", "line 9"]
    assert first["file"] == str(log_path)
    assert first["cursor"] == first["size"] == log_path.stat().st_size
    assert (first["truncated"], first["reset"]) == (True, False)

    assert ok({"cursor": first["cursor"]})["lines"] == []
    append(log_path, "line 10", "line 11")
    second = ok({"cursor": first["cursor"]})
    assert second["lines"] == ["line 10", "line 11"]
    assert (second["truncated"], second["reset"]) == (False, False)
    assert second["cursor"] == log_path.stat().st_size


def test_a_line_still_being_written_waits_for_the_next_call(log_path):
    append(log_path, "whole")
    with open(log_path, "a", encoding="utf-8") as stream:
        stream.write('{"message": "half')

    first = ok()
    assert first["lines"] == ["whole"]
    assert first["cursor"] == len("whole\n") < first["size"]

    append(log_path, ' written"}')
    assert ok({"cursor": first["cursor"]})["lines"] == ['{"message": "half written"}']


def test_max_bytes_bounds_the_read_and_a_cursor_too_far_behind_starts_again_from_the_newest(log_path):
    append(log_path, *(f"{n:04d}" + "x" * 95 for n in range(100)))  # 100 lines of 100 bytes

    newest = ok({"maxBytes": 1000})
    # The window is the last 1000 bytes: exactly ten whole lines.
    assert [line[:4] for line in newest["lines"]] == [f"{n:04d}" for n in range(90, 100)]
    assert (newest["truncated"], newest["reset"]) == (True, False)

    cut = ok({"maxBytes": 1050})
    assert [line[:4] for line in cut["lines"]] == [f"{n:04d}" for n in range(90, 100)]  # the partial line is dropped

    behind = ok({"cursor": 100, "maxBytes": 1000})
    assert (behind["truncated"], behind["reset"]) == (True, True)
    assert behind["lines"] == newest["lines"]


def test_limit_and_max_bytes_are_capped_by_the_server_at_openclaws_ceilings(log_path):
    append(log_path, *(f"l{n}" for n in range(6000)))

    capped = ok({"limit": logs.MAX_LIMIT, "maxBytes": logs.MAX_BYTES})
    assert len(capped["lines"]) == logs.MAX_LIMIT and capped["lines"][-1] == "l5999"
    # A direct caller (the console) is clamped the same way.
    direct = logs.log_tail(log_path, limit=10**9, max_bytes=10**12)
    assert len(direct.lines) == logs.MAX_LIMIT
    # Defaults: OpenClaw's 500 lines.
    assert len(ok()["lines"]) == logs.DEFAULT_LIMIT


@pytest.mark.parametrize(
    ("params", "where"),
    [
        ({"limit": 0}, "at /limit"),
        ({"limit": 5001}, "at /limit"),
        ({"maxBytes": 0}, "at /maxBytes"),
        ({"maxBytes": 1_000_001}, "at /maxBytes"),
        ({"cursor": -1}, "at /cursor"),
        ({"cursor": "12"}, "at /cursor"),
        ({"limit": True}, "at /limit"),
        ({"cursor": 1.5}, "at /cursor"),
        ({"lines": 10}, "at /lines"),
    ],
)
def test_bad_params_are_refused_with_the_reference_error(log_path, params, where):
    code, message = refusal(tail(params))
    assert code == "INVALID_REQUEST"
    assert message.startswith(f"invalid logs.tail params: {where}")


def test_a_rotated_or_truncated_file_resets_the_cursor(log_path):
    handler = SharedRotatingFileHandler(str(log_path), max_bytes=64 * 1024, backup_count=1)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.Logger("openclaw.test.rotation")
    logger.addHandler(handler)
    try:
        written = 0
        while not log_path.exists() or log_path.stat().st_size < 64 * 1024:
            logger.warning("before %04d %s", written, "y" * 40)
            written += 1
        before = ok({"limit": 1})
        assert before["lines"] == [f"before {written - 1:04d} {'y' * 40}"]
        # The file is full: the next record rotates it first.
        logger.warning("after the rotation")
    finally:
        handler.close()

    after = ok({"cursor": before["cursor"]})
    assert after["reset"] is True
    assert after["lines"] == ["after the rotation"]
    assert after["cursor"] == after["size"] == log_path.stat().st_size

    log_path.write_text("")
    emptied = ok({"cursor": after["cursor"]})
    assert (emptied["lines"], emptied["cursor"], emptied["size"], emptied["reset"]) == ([], 0, 0, True)


def test_a_missing_file_is_an_empty_log(log_path):
    assert ok({"cursor": 5}) == {
        "file": str(log_path),
        "cursor": 0,
        "size": 0,
        "lines": [],
        "truncated": False,
        "reset": False,
    }


def test_no_log_file_configured_is_unavailable(settings):
    settings.OPENCLAW_LOG_FILE = None
    assert refusal(tail()) == ("UNAVAILABLE", "no log file: OPENCLAW_LOG_FILE is set empty")


def test_callers_without_operator_read_are_refused_and_read_nothing(log_path):
    append(log_path, "secret line")

    approver = tail({}, ctx(sc.APPROVALS))
    assert refusal(approver) == ("INVALID_REQUEST", "missing scope: operator.read")
    assert approver["error"]["details"]["missingScope"] == sc.READ
    assert refusal(tail({}, ctx(role=sc.ROLE_NODE))) == ("INVALID_REQUEST", "unauthorized role: node")
    # operator.write implies read, and admin every scope.
    assert ok({}, ctx(sc.WRITE))["lines"] == ["secret line"]
    assert ok({}, ctx(sc.ADMIN))["lines"] == ["secret line"]


def test_the_gateways_own_lines_come_back_as_json(tmp_path, settings):
    path = tmp_path / "gateway.log"
    settings.OPENCLAW_LOG_FILE = path
    logging.config.dictConfig(
        logging_config(console_format="plain", level="INFO", file_path=path, file_max_bytes=10**6, file_backups=1)
    )
    try:
        ok()
        lines = [json.loads(line) for line in ok()["lines"]]
    finally:
        logging.config.dictConfig(django_settings.LOGGING)

    access = [line for line in lines if line["logger"] == "openclaw.access.rpc"]
    assert [(line["method"], line["outcome"], line["request_id"]) for line in access] == [("logs.tail", "ok", "r1")]
