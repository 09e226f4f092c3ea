"""At the default INFO level the log carries what an operator acts on: an idle sweep says nothing (neither the sweep
nor Celery's bookkeeping of it, which moves to DEBUG), a sweep that changed something says so, and a browser's own
request for ``/favicon.ico`` is no WARNING. The project's logging configuration (settings.LOGGING) is the one under
test: the filters sit on the loggers that write these lines."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from celery.app.trace import LOG_RECEIVED, LOG_SUCCESS
from celery.app.trace import info as celery_trace_info
from django.conf import settings
from django.utils import timezone

from approvals_app.tasks import expire_sweep
from devices_app.models import DevicePairingRequest, PairingStatus
from devices_app.services import pairing
from devices_app.tasks import pairing_sweep
from gateway.tasks import gateway_sweep
from sessions_app.tasks import runs_sweep
from tests.devices_app.test_services_pairing import claim
from workers_app.tasks import recovery_sweep

SWEEPS = [gateway_sweep, pairing_sweep, runs_sweep, recovery_sweep, expire_sweep]


def at_info_or_above(caplog) -> list[str]:
    return [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.INFO]


@pytest.mark.django_db(transaction=True)
def test_idle_sweeps_log_nothing_at_info(caplog):
    caplog.set_level(logging.INFO)
    for sweep in SWEEPS:
        sweep()
    assert at_info_or_above(caplog) == []


@pytest.mark.django_db(transaction=True)
def test_a_sweep_that_expires_a_pairing_request_says_so_at_info(caplog):
    request, _ = pairing.pairing_request_ensure(claim=claim())
    DevicePairingRequest.objects.filter(pk=request.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    caplog.set_level(logging.INFO)
    assert pairing_sweep() == {"expiredRequests": 1}
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.EXPIRED
    assert at_info_or_above(caplog) == [
        f"INFO devices_app.services.pairing: pairing: 1 request(s) expired without a decision: {request.request_id}"
    ]


def test_celerys_lines_about_the_periodic_sweeps_move_to_debug(caplog):
    caplog.set_level(logging.INFO)
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        context = {"id": "t-1", "name": entry["task"], "return_value": "{}", "runtime": 0.01, "args": "", "kwargs": ""}
        celery_trace_info(LOG_RECEIVED, context)
        celery_trace_info(LOG_SUCCESS, context)
        logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", "an-entry", entry["task"])
    assert at_info_or_above(caplog) == []


def test_celerys_lines_about_other_tasks_keep_info(caplog):
    caplog.set_level(logging.INFO)
    context = {
        "id": "t-2",
        "name": "sessions.run_turn",
        "return_value": "None",
        "runtime": 0.5,
        "args": "",
        "kwargs": "",
    }
    celery_trace_info(LOG_SUCCESS, context)
    assert at_info_or_above(caplog) == ["INFO celery.app.trace: Task sessions.run_turn[t-2] succeeded in 0.5s: None"]


def test_with_debug_on_the_sweeps_bookkeeping_shows_at_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="celery.app.trace")
    context = {
        "id": "t-3",
        "name": "sessions.runs_sweep",
        "return_value": "{}",
        "runtime": 0.01,
        "args": "",
        "kwargs": "",
    }
    celery_trace_info(LOG_SUCCESS, context)
    (record,) = [r for r in caplog.records if r.name == "celery.app.trace"]
    assert (record.levelname, record.getMessage()) == ("DEBUG", "Task sessions.runs_sweep[t-3] succeeded in 0.01s: {}")


@pytest.mark.django_db
def test_a_missing_favicon_is_no_warning_but_another_missing_page_still_is(client, caplog):
    caplog.set_level(logging.INFO)
    client.get("/favicon.ico")
    client.get("/apple-touch-icon-precomposed.png")
    assert [r for r in caplog.records if r.name == "django.request"] == []
    assert client.get("/no-such-page/").status_code == 404
    warnings = [r.getMessage() for r in caplog.records if r.name == "django.request"]
    assert warnings == ["Not Found: /no-such-page/"]
