"""The ``redis`` marker skips its test, with the reason, when no Redis is configured.

``./dev test`` deselects these tests without ``REDIS_URL``; plain ``pytest`` (an IDE, a single file)
would otherwise run them against the in-memory channel layer, where a second gateway process never
hears the first one and the test fails only after its longest timeout.
"""

from __future__ import annotations

import os

import pytest

REDIS_MARKER = "redis"
REDIS_SKIP_REASON = "needs Redis: REDIS_URL is unset (./dev test sets it when Redis answers on 127.0.0.1:6379)"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{REDIS_MARKER}: needs Redis (skipped when REDIS_URL is unset)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("REDIS_URL"):
        return
    skip = pytest.mark.skip(reason=REDIS_SKIP_REASON)
    for item in items:
        if item.get_closest_marker(REDIS_MARKER) is not None:
            item.add_marker(skip)
