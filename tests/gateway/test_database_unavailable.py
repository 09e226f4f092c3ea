"""Getting no database connection in time (all in use, or the database unreachable) is told plainly (issue 27):
``internal_error`` — the one place unexpected exceptions become client errors, for the RPC, the JSON API and the
socket — makes psycopg's pool timeout (as Django raises it: its ``OperationalError`` caused by the pool's
``PoolTimeout``) a retryable ``UNAVAILABLE`` that says what happened, a 503 over HTTP, logged as one line without a
traceback. Any other database error stays an internal error told by reference only."""

from __future__ import annotations

import logging

import pytest
from django.db import OperationalError
from psycopg_pool import PoolTimeout

from gateway.exceptions import (
    DATABASE_UNAVAILABLE_MESSAGE,
    DatabaseUnavailable,
    InternalError,
    internal_error,
    pool_exhausted,
)
from operations_app.errors import error_recorder

pytestmark = pytest.mark.django_db(transaction=True)

logger = logging.getLogger(__name__)
POOL_TEXT = "couldn't get a connection after 3.00 sec"


@pytest.fixture(autouse=True)
def _recorded_during_the_test():
    yield
    # The operations app records every internal error from a thread of its own: in this test's database.
    assert error_recorder.drain(30)


def exhausted() -> OperationalError:
    try:
        try:
            raise PoolTimeout(POOL_TEXT)
        except PoolTimeout as timeout:
            raise OperationalError(POOL_TEXT) from timeout
    except OperationalError as wrapped:
        return wrapped


def test_an_exhausted_pool_is_answered_as_such_and_retryable(caplog):
    caplog.set_level(logging.WARNING, logger=__name__)
    try:
        raise exhausted()
    except OperationalError:
        error = internal_error(logger, "gateway method sessions.patch")

    assert isinstance(error, DatabaseUnavailable) and error.http_status == 503
    error_id = error.details["errorId"]
    assert error.to_shape() == {
        "code": "UNAVAILABLE",
        "message": DATABASE_UNAVAILABLE_MESSAGE,
        "details": {"code": "DATABASE_UNAVAILABLE", "errorId": error_id},
        "retryable": True,
        "retryAfterMs": 1000,
    }
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert (
        record.getMessage()
        == f"gateway method sessions.patch: no database connection could be had in time (errorId={error_id})"
    )


def test_pool_exhaustion_is_found_through_any_chain_of_causes():
    assert pool_exhausted(exhausted())
    assert pool_exhausted(PoolTimeout(POOL_TEXT))
    assert not pool_exhausted(OperationalError("server closed the connection unexpectedly"))
    assert not pool_exhausted(None)


def test_any_other_database_error_stays_an_internal_error_told_by_reference(caplog):
    caplog.set_level(logging.ERROR, logger=__name__)
    try:
        raise OperationalError("server closed the connection unexpectedly")
    except OperationalError:
        error = internal_error(logger, "gateway method sessions.patch")

    assert type(error) is InternalError and error.http_status == 500
    assert error.message == f"internal error; reference {error.details['errorId']}"
    assert "server closed" not in error.message
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info is not None
