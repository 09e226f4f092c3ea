"""The log format switch, the context fields every line carries, and the shared, rotated log file.

Each test configures logging through the same ``logging_config`` the settings use (into a temporary file and the
test's captured standard error), and puts the settings' configuration back afterwards.
"""

from __future__ import annotations

import json
import logging
import logging.config
import multiprocessing
import re

import pytest
from django.conf import settings

from gateway import log_context
from gateway.log_files import SharedRotatingFileHandler, backup_path
from openclaw_site.log_config import logging_config

PLAIN_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING openclaw\.test: (?P<rest>.*)$")


@pytest.fixture
def configure(tmp_path):
    def apply(console_format: str, *, max_bytes: int = 10 * 1024 * 1024, backups: int = 5) -> object:
        logging.config.dictConfig(
            logging_config(
                console_format=console_format,
                level="INFO",
                file_path=tmp_path / "logs" / "gateway.log",
                file_max_bytes=max_bytes,
                file_backups=backups,
            )
        )
        return tmp_path / "logs" / "gateway.log"

    yield apply
    logging.config.dictConfig(settings.LOGGING)


def file_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_plain_is_the_human_format_with_the_context_appended_only_when_there_is_some(configure, capsys):
    configure("plain")
    logger = logging.getLogger("openclaw.test")

    logger.warning("no context here")
    with log_context.bound(run_id="run-1", session_key="agent:main:main"):
        logger.warning("a turn says %s", "hello")

    first, second = capsys.readouterr().err.splitlines()
    assert PLAIN_LINE.match(first)["rest"] == "no context here"
    assert PLAIN_LINE.match(second)["rest"] == "a turn says hello [run_id=run-1 session_key=agent:main:main]"


def test_json_lines_parse_and_carry_the_context_fields_and_the_process(configure, capsys, monkeypatch):
    monkeypatch.setenv("OPENCLAW_PROCESS_NAME", "gateway-7")
    path = configure("json")
    logger = logging.getLogger("openclaw.test")

    with log_context.bound(request_id="req-1", device_id="dev-1"):
        with log_context.bound(run_id="run-1", session_key="main"):
            logger.warning("inside a turn")
        logger.info("after the turn, still in the request")
    try:
        raise ValueError("the cause")
    except ValueError:
        logger.exception("it failed")

    console = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert console == file_lines(path)
    turn, request, failure = console
    assert {key: turn[key] for key in ("level", "logger", "message", "process")} == {
        "level": "WARNING",
        "logger": "openclaw.test",
        "message": "inside a turn",
        "process": "gateway-7",
    }
    assert (turn["request_id"], turn["device_id"], turn["run_id"], turn["session_key"]) == (
        "req-1",
        "dev-1",
        "run-1",
        "main",
    )
    assert "run_id" not in request and "session_key" not in request and request["request_id"] == "req-1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+\+00:00", turn["time"])
    assert "request_id" not in failure and "ValueError: the cause" in failure["exc_info"]
    # OpenClaw's Control UI reads the level and the subsystem from tslog's _meta.
    assert turn["_meta"] == {"logLevelName": "WARN", "name": "openclaw.test"}
    assert (request["_meta"]["logLevelName"], failure["_meta"]["logLevelName"]) == ("INFO", "ERROR")


def test_the_file_gets_json_lines_whatever_the_console_format(configure, capsys):
    path = configure("plain")

    logging.getLogger("openclaw.test").warning("one line")

    assert PLAIN_LINE.match(capsys.readouterr().err.strip())
    (line,) = file_lines(path)
    assert line["message"] == "one line" and line["process"] == log_context.process_label()


def test_an_unnamed_process_is_its_host_and_pid(monkeypatch):
    monkeypatch.delenv("OPENCLAW_PROCESS_NAME", raising=False)
    host, pid = log_context.process_label().rsplit(":", 1)
    assert host and int(pid) > 0


def test_a_request_object_never_reaches_a_json_line(configure, capsys):
    """Django's request logger attaches the request, whose repr carries the query string (a token, maybe)."""
    configure("json")

    class Request:
        def __repr__(self) -> str:
            return "<ASGIRequest: GET '/api/x?token=do-not-log-me'>"

    logging.getLogger("django.request").warning("Not Found: /api/x", extra={"request": Request(), "status_code": 404})

    err = capsys.readouterr().err
    assert "do-not-log-me" not in err and json.loads(err)["status_code"] == 404


def test_a_bound_value_is_cut_and_restored_after_the_block():
    with log_context.bound(request_id="x" * 1000):
        assert log_context.current() == {"request_id": "x" * log_context.MAX_FIELD_CHARS}
    assert log_context.current() == {}


def test_the_file_rotates_at_its_size_and_keeps_a_bounded_number_of_backups(tmp_path):
    path = tmp_path / "gateway.log"
    handler = SharedRotatingFileHandler(str(path), max_bytes=1000, backup_count=2)
    handler.setFormatter(log_context.JsonLineFormatter())
    logger = logging.Logger("openclaw.rotation")
    logger.addHandler(handler)
    try:
        for number in range(200):
            logger.warning("line %03d", number)
    finally:
        handler.close()

    files = sorted(tmp_path.iterdir())
    assert files == [path, backup_path(path, 1), backup_path(path, 2), tmp_path / "gateway.log.lock"]
    # Each file stops at the record that took it past the limit.
    assert all(f.stat().st_size < 1000 + 200 for f in files[:3])
    newest = [line["message"] for line in file_lines(path)]
    assert newest[-1] == "line 199"
    kept = [line["message"] for f in (backup_path(path, 2), backup_path(path, 1), path) for line in file_lines(f)]
    assert kept == [f"line {n:03d}" for n in range(200 - len(kept), 200)]


def _write_lines(path: str, writer: int, count: int) -> None:
    handler = SharedRotatingFileHandler(path, max_bytes=8000, backup_count=100)
    handler.setFormatter(log_context.JsonLineFormatter())
    logger = logging.Logger(f"writer-{writer}")
    logger.addHandler(handler)
    for number in range(count):
        logger.warning("writer %d line %d", writer, number)
    handler.close()


def test_processes_sharing_the_file_rotate_it_without_losing_or_mixing_lines(tmp_path):
    path = tmp_path / "gateway.log"
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_write_lines, args=(str(path), writer, 300)) for writer in range(3)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(60)
    assert [process.exitcode for process in writers] == [0, 0, 0]

    files = [path, *sorted(tmp_path.glob("gateway.log.*[0-9]"), key=lambda f: int(f.suffix[1:]))]
    assert len(files) > 2  # it did rotate
    lines = [line for f in files for line in file_lines(f)]  # every line is whole JSON
    assert sorted(line["message"] for line in lines) == sorted(
        f"writer {writer} line {number}" for writer in range(3) for number in range(300)
    )
