"""Internal errors are recorded for the System page off the failing caller's path (operations_app/errors.py)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse

from gateway import exceptions, state
from gateway.exceptions import InternalError, InternalErrorReport, internal_error
from gateway.models import AuditLog
from operations_app.errors import ErrorRecorder, error_recorder
from operations_app.models import RecordedError
from operations_app.services import error_record

logger = logging.getLogger(__name__)
DRAIN_TIMEOUT_S = 30.0
LEAK = "duplicate key value violates unique constraint\nDETAIL: Key (id)=(1) already exists."

recording_db = pytest.mark.django_db(transaction=True)


def report(error_id: str, context: str = "a test") -> InternalErrorReport:
    return InternalErrorReport(
        error_id=error_id,
        context=context,
        exception_class="ValueError",
        first_line="bad value",
        occurred_at=datetime.now(UTC),
    )


@recording_db
def test_an_error_inside_a_broken_transaction_is_recorded_outside_it():
    with pytest.raises(InternalError) as raised, transaction.atomic():
        first = AuditLog.objects.create(actor="t", action="a", target_type="x", target_id="1")
        try:
            AuditLog.objects.create(id=first.id, actor="t", action="a", target_type="x", target_id="2")
        except IntegrityError as exc:
            # No savepoint: on PostgreSQL this transaction now refuses every query until it is rolled back.
            raise internal_error(logger, "a broken transaction", exc=exc) from None

    error_id = raised.value.details["errorId"]
    assert error_recorder.drain(DRAIN_TIMEOUT_S)
    recorded = RecordedError.objects.get(error_id=error_id)
    assert recorded.context == "a broken transaction"
    assert recorded.exception_class == "IntegrityError"
    assert recorded.process_boot_id == state.BOOT_ID
    # The caller's transaction was rolled back; the record was not part of it.
    assert not AuditLog.objects.exists()


@recording_db
def test_an_error_in_async_code_is_recorded_and_the_client_sees_only_the_reference():
    async def handler() -> InternalError:
        try:
            raise ValueError(LEAK)
        except ValueError:
            return internal_error(logger, "gateway method test.broken")

    error = asyncio.run(handler())

    error_id = error.details["errorId"]
    assert error.to_shape() == {
        "code": "UNAVAILABLE",
        "message": f"internal error; reference {error_id}",
        "details": {"errorId": error_id},
        "retryable": True,
    }
    assert error_recorder.drain(DRAIN_TIMEOUT_S)
    recorded = RecordedError.objects.get(error_id=error_id)
    assert (recorded.context, recorded.exception_class) == ("gateway method test.broken", "ValueError")
    # Operators see the first line of the message; the rest (here the row's key) stays in the log.
    assert recorded.first_line == "duplicate key value violates unique constraint"


@recording_db
def test_the_store_keeps_only_the_newest_rows():
    error_record(reports=[report(f"old{i}") for i in range(4)], keep=3)
    deleted = error_record(reports=[report("new0"), report("new1")], keep=3)

    assert deleted >= 2  # and any older row another test's error left behind
    assert [row.error_id for row in RecordedError.objects.all()] == ["new1", "new0", "old3"]


@recording_db
def test_long_texts_are_clipped_to_their_columns():
    long = InternalErrorReport(
        error_id="x1", context="c" * 400, exception_class="E", first_line="m" * 900, occurred_at=datetime.now(UTC)
    )
    error_record(reports=[long])

    recorded = RecordedError.objects.get(error_id="x1")
    assert len(recorded.context) == 300 and recorded.context.endswith("…")
    assert len(recorded.first_line) == 500


def test_a_failed_write_is_logged_and_dropped_never_raised(caplog):
    """No database here (pytest-django refuses it, as a dead server would): the caller returns at once."""
    recorder = ErrorRecorder(retry_delays_s=())
    with caplog.at_level(logging.WARNING, logger="operations_app.errors"):
        recorder(report("lost1"))
        assert recorder.drain(DRAIN_TIMEOUT_S)

    assert any("could not record 1 internal errors (lost1)" in r.getMessage() for r in caplog.records)


def test_a_full_queue_drops_the_report_without_raising():
    recorder = ErrorRecorder(queue_size=1)
    # No writer yet holds the queue's one place: the second report finds it taken.
    recorder.pending.put_nowait(report("queued"))
    recorder(report("dropped"))

    assert recorder.dropped == 1


@pytest.mark.django_db
def test_the_admin_finds_an_error_by_its_reference_and_changes_nothing(admin_client):
    error_record(reports=[report("feedc0ffee123456", "GET /api/sessions/"), report("0000000000000000")])
    changelist = reverse("admin:operations_app_recordederror_changelist")

    found = admin_client.get(changelist, {"q": "feedc0ffee123456"})

    assert found.status_code == 200
    assert [row.error_id for row in found.context["cl"].result_list] == ["feedc0ffee123456"]
    row = RecordedError.objects.get(error_id="feedc0ffee123456")
    change = reverse("admin:operations_app_recordederror_change", args=[row.pk])
    assert admin_client.post(change, {"context": "edited"}).status_code == 403
    row.refresh_from_db()
    assert row.context == "GET /api/sessions/"


def test_a_listener_that_fails_does_not_change_what_the_caller_gets(monkeypatch, caplog):
    told: list[InternalErrorReport] = []

    def broken_listener(report: InternalErrorReport) -> None:
        raise RuntimeError("listener bug")

    monkeypatch.setattr(exceptions, "_internal_error_listeners", [broken_listener, told.append])
    with caplog.at_level(logging.ERROR):
        try:
            raise KeyError("missing")
        except KeyError:
            error = internal_error(logger, "a context")

    error_id = error.details["errorId"]
    assert error.message == f"internal error; reference {error_id}"
    # The next listener was still told, with the exception being handled.
    assert [(r.error_id, r.context, r.exception_class, r.first_line) for r in told] == [
        (error_id, "a context", "KeyError", "'missing'")
    ]
    assert any("internal error listener" in r.getMessage() and error_id in r.getMessage() for r in caplog.records)
