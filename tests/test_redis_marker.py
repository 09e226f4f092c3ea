"""The ``redis`` marker itself skips a test when Redis is absent (tests/support/redis_marker.py)."""

from __future__ import annotations

import pytest

from tests.e2e import test_seed_004_paired_node_worker_lifecycle as seed_004
from tests.support.redis_marker import REDIS_SKIP_REASON

MARKED_MODULE = """
import pytest

pytestmark = pytest.mark.redis


def test_needs_a_second_process():
    raise AssertionError("ran without Redis")


class TestMarkedClass:
    def test_inherits_the_marker(self):
        raise AssertionError("ran without Redis")
"""

UNMARKED_MODULE = """
def test_runs_anyway():
    assert 1 + 1 == 2
"""


def run_inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.RunResult:
    """A pytest run of two small modules with only the marker's plugin (not this suite's Django, browser…)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_marked=MARKED_MODULE, test_unmarked=UNMARKED_MODULE)
    return pytester.runpytest_inprocess("-p", "tests.support.redis_marker", "-p", "no:cacheprovider", "-rs")


def test_a_redis_test_is_skipped_with_the_reason_when_redis_url_is_unset(pytester, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)

    result = run_inner(pytester, monkeypatch)

    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines([f"*{REDIS_SKIP_REASON}*"])


def test_a_redis_test_runs_when_redis_url_is_set(pytester, monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")

    result = run_inner(pytester, monkeypatch)

    result.assert_outcomes(passed=1, failed=2)


def test_the_second_process_test_of_seed_004_is_marked():
    marks = getattr(seed_004.test_the_same_with_the_node_on_a_second_gateway_process, "pytestmark", [])
    assert "redis" in [mark.name for mark in marks]
