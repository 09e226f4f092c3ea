from __future__ import annotations

import time

import psycopg.errors
import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import OperationalError
from django.db.backends.postgresql.operations import DatabaseOperations as PostgresOperations

from gateway.conf import shared_token
from gateway.executor_leases import HOLDER_KEY, LEASE_KEY
from operations_app.errors import error_recorder
from tests.support.api import API_TOKEN
from tests.support.browser import AXE_REPORTS, SCREENSHOTS
from tests.support.clients import IDENTITY_DIRS, remove_identity_dirs_made_after
from tests.support.processes import remove_scratch_dir, start_gateway, stop_and_remove

pytest_plugins = [
    "tests.support.device_fixtures",
    "tests.support.redis_marker",
    "tests.support.log_capture",
    "pytester",
]

_RUN_STARTED = pytest.StashKey[float]()


def pytest_configure(config):
    config.stash[_RUN_STARTED] = time.time()


def pytest_terminal_summary(terminalreporter, config):
    """Name the folders of the browser tests' screenshots and axe reports when this run wrote some (a person
    looks at them)."""
    started = config.stash.get(_RUN_STARTED, time.time())
    written = [shot for shot in SCREENSHOTS.glob("*/*.png") if shot.stat().st_mtime >= started]
    if written:
        terminalreporter.write_line(f"browser screenshots ({len(written)} from this run): {SCREENSHOTS}/")
    reports = [report for report in AXE_REPORTS.glob("*.json") if report.stat().st_mtime >= started]
    if reports:
        terminalreporter.write_line(f"accessibility reports ({len(reports)} pages from this run): {AXE_REPORTS}/")


GATEWAY_LOG_TAIL_LINES = 80


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used the worker's shared gateway shows that gateway's last log lines: it keeps running
    across tests, so what blocked it may have begun in an earlier one, and its state folder is gone after the run."""
    report = yield
    shared = item.funcargs.get("gateway") if hasattr(item, "funcargs") else None
    if report.failed and call.when == "call" and shared is not None:
        tail = "\n".join(shared.log().splitlines()[-GATEWAY_LOG_TAIL_LINES:])
        report.sections.append((f"shared gateway log, last {GATEWAY_LOG_TAIL_LINES} lines", tail))
    return report


@pytest.fixture(scope="session")
def gateway(django_db_setup, django_db_blocker):
    """One gateway process per test worker, on the test database, with default settings."""
    server = start_gateway()
    yield server
    stop_and_remove([server])


@pytest.fixture
def gateway_factory(django_db_setup):
    """Start dedicated gateway processes (custom settings); all are stopped after the test and their state folders
    removed."""
    started = []

    def start(**kwargs):
        server = start_gateway(**kwargs)
        started.append(server)
        return server

    yield start
    stop_and_remove(started)


@pytest.fixture(autouse=True)
def _pending_node_connects_answered_at_once():
    """In this process, as in the test gateways (``gateway_settings_for_tests``): a node's connect refused for its
    pending pairing is answered at once, as the tests of refusals expect, and no held connect subscribes a test's
    short-lived event loop to the broadcasts. The tests of the hold turn it on in their gateways."""
    previous = settings.OPENCLAW_GATEWAY["PAIRING_HOLD_MS"]
    settings.OPENCLAW_GATEWAY["PAIRING_HOLD_MS"] = 0
    yield
    settings.OPENCLAW_GATEWAY["PAIRING_HOLD_MS"] = previous


@pytest.fixture(autouse=True)
def _node_identities_removed():
    """The identity folders that ``node()`` made for the test go when it ends, pass or fail."""
    made_before = len(IDENTITY_DIRS)
    yield
    remove_identity_dirs_made_after(made_before)


@pytest.fixture
def remove_when_done():
    """``remove_when_done(folder)``: a folder a launcher made for the test (a cluster's or a node host's state
    folder) is removed when the test ends, pass or fail — after the test's last look at the logs inside it."""
    folders: list[str] = []
    yield folders.append
    failures = []
    for folder in folders:
        try:
            remove_scratch_dir(folder)
        except OSError as failure:
            failures.append(failure)
    if failures:
        raise ExceptionGroup("removing the test's folders failed", failures)


@pytest.fixture(autouse=True)
def _gateway_settles_before_flush(request):
    """Let gateway processes finish their disconnect bookkeeping before the test database is flushed.

    pytest-django flushes with one TRUNCATE of every table; run while a gateway process is still
    unregistering a connection (a transaction over several tables), PostgreSQL may pick the
    TRUNCATE as a deadlock victim. Requesting ``transactional_db`` first makes this teardown run
    before the flush.
    """
    if request.node.get_closest_marker("e2e") is None:
        yield
        return
    request.getfixturevalue("transactional_db")
    yield
    from gateway.models import GatewayConnection

    deadline = time.monotonic() + 10
    while GatewayConnection.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture(scope="session", autouse=True)
def _flush_survives_deadlocks():
    """Retry the test database flush when PostgreSQL picks it as a deadlock victim.

    Gateway and Celery processes outlive a test: their heartbeats, sweeps and presence reads join
    several tables, and pytest-django's TRUNCATE of every table locks them one by one in another
    order. The victim's transaction is rolled back whole, so running the flush again is safe.
    """
    original = PostgresOperations.execute_sql_flush

    def execute_sql_flush(self, sql_list):
        for attempt in range(5):
            try:
                return original(self, sql_list)
            except OperationalError as exc:
                if not isinstance(exc.__cause__, psycopg.errors.DeadlockDetected) or attempt == 4:
                    raise
                time.sleep(0.1 * (attempt + 1))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PostgresOperations, "execute_sql_flush", execute_sql_flush)
        yield


@pytest.fixture(scope="session", autouse=True)
def _internal_errors_recorded_once():
    """This process's recorder of internal errors tries each write once: a retry seconds later would land in
    whichever test runs then. Gateway processes the tests start keep their retries (tests/e2e/test_readiness.py)."""
    error_recorder.retry_delays_s = ()


@pytest.fixture
def worker_labels():
    """``worker_labels(name)``: an executor label of a Celery worker process for this test only; the lease keys of
    every label it made are deleted afterwards (the cache outlives the test)."""
    made: list[str] = []

    def label(name: str) -> str:
        made.append(f"celery:test-{name}:{time.monotonic_ns()}")
        return made[-1]

    yield label
    cache.delete_many([key.format(label) for label in made for key in (LEASE_KEY, HOLDER_KEY)])


@pytest.fixture
def mock_openai():
    """A real OpenAI-compatible HTTP server on 127.0.0.1 (scriptable; echo by default)."""
    from tests.support.mock_openai import MockOpenAI

    with MockOpenAI().start() as server:
        yield server


@pytest.fixture
def model_gateway(gateway_factory, mock_openai):
    """A gateway (and its Celery worker when Redis is there) whose turns call the mock provider."""
    return gateway_factory(
        extra_env={
            "OPENCLAW_MODEL_BASE_URL": mock_openai.base_url,
            "OPENCLAW_MODEL_API_KEY": "sk-test",
            "OPENCLAW_MODEL": "mock-model",
            "OPENCLAW_MODEL_READ_TIMEOUT_S": "2",
        }
    )


@pytest.fixture
def api_token(settings) -> str:
    """The gateway token the JSON API accepts (``Authorization: Bearer <token>``)."""
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "TOKEN": API_TOKEN}
    shared_token.cache_clear()
    yield API_TOKEN
    shared_token.cache_clear()
