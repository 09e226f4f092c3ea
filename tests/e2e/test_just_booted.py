"""agent.wait on a host that just booted (issue: it woke 5 s late for the first hour after boot).

The gateway (and its Celery worker, on the Redis profile) run with a monotonic clock that starts
near zero (tests/support/just_booted/sitecustomize.py) and with agent.wait's safety-net re-read
set to an hour: a finished turn is reported only if the run-finished notification reaches the
waiter, which needs the gateway's process listener to have joined its group.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from tests.support.clients import operator
from tests.support.processes import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

JUST_BOOTED = str(ROOT / "tests" / "support" / "just_booted")
HOUR_MS = 3600 * 1000
# Far beyond a healthy turn (tens of ms) and far below the hour a missed wake-up costs.
NO_WAKE_UP_AFTER_S = 120


def _pythonpath() -> str:
    return os.pathsep.join(p for p in (JUST_BOOTED, os.environ.get("PYTHONPATH", "")) if p)


def test_agent_wait_reports_a_finished_turn_when_the_monotonic_clock_starts_near_zero(gateway_factory):
    gateway = gateway_factory(extra_env={"PYTHONPATH": _pythonpath(), "OPENCLAW_AGENT_WAIT_RECHECK_MS": str(HOUR_MS)})

    async def scenario() -> tuple[dict, dict]:
        client = operator(gateway)
        await client.connect()
        try:
            created = await client.request("sessions.create", {"key": "just-booted"})
            ack = await client.request(
                "chat.send", {"sessionKey": created["key"], "message": "Reply exactly: UP", "idempotencyKey": "boot-1"}
            )
            # Waiting as long as the re-read interval: without the wake-up the answer would come after
            # an hour; the guard below is generous for a healthy gateway (milliseconds) and fails fast.
            waited = await client.request(
                "agent.wait", {"runId": "boot-1", "timeoutMs": HOUR_MS}, timeout=NO_WAKE_UP_AFTER_S
            )
            return ack, waited
        finally:
            await client.close()

    ack, waited = asyncio.run(scenario())
    assert ack == {"runId": "boot-1", "status": "started"}
    assert waited["status"] == "ok"
    assert waited["outputText"] == "UP"


def test_the_fake_clock_is_in_effect_in_child_processes():
    """Guards the test above: a child started this way really sees a just-booted monotonic clock."""
    probe = subprocess.run(
        [sys.executable, "-c", "import time; print(time.monotonic())"],
        env={**os.environ, "PYTHONPATH": _pythonpath()},
        capture_output=True,
        text=True,
        check=True,
    )
    assert float(probe.stdout) < 60
