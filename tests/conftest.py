from __future__ import annotations

import pytest

from tests.gateway_process import start_gateway


@pytest.fixture(scope="session")
def gateway(django_db_setup, django_db_blocker):
    """One gateway process per test worker, on the test database, with default settings."""
    server = start_gateway()
    yield server
    server.stop()


@pytest.fixture
def gateway_factory(django_db_setup):
    """Start dedicated gateway processes (custom settings); all are stopped after the test."""
    started = []

    def start(**kwargs):
        server = start_gateway(**kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
