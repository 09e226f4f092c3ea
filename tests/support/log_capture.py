"""The JSON lines the project's log configuration would write, captured from the root logger for one test."""

from __future__ import annotations

import io
import json
import logging

import pytest

from gateway.log_context import JsonLineFormatter, LogContextFilter


class CapturedLog:
    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.addFilter(LogContextFilter())
        self.handler.setFormatter(JsonLineFormatter())

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def lines(self, logger: str | None = None) -> list[dict]:
        parsed = [json.loads(line) for line in self.text.splitlines()]
        return [line for line in parsed if logger is None or line["logger"] == logger]


@pytest.fixture
def json_log():
    captured = CapturedLog()
    root = logging.getLogger()
    root.addHandler(captured.handler)
    yield captured
    root.removeHandler(captured.handler)
