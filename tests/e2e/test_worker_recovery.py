"""Recovery across real gateway processes: a dispatch whose gateway was killed (SIGKILL, no shutdown) is
failed cleanly by the next gateway's startup recovery; one driven by a live gateway is left alone."""

from __future__ import annotations

import signal
import time

import pytest

from gateway.models import GatewayProcess
from sessions_app.services.sessions import SessionSpec, session_create
from tests.support.clients import call_once
from tests.support.processes import GatewayLaunch, free_port, gateway_settings_for_tests
from workers_app.models import Placement
from workers_app.services import placements as store

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def boot_id_of(pid: int) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        process = GatewayProcess.objects.filter(pid=pid).first()
        if process is not None:
            return str(process.boot_id)
        time.sleep(0.05)
    raise AssertionError(f"gateway {pid} never registered")


def placement_state(server, key: str) -> dict:
    return call_once(server, "sessions.describe", {"key": key})["session"]["placement"]


def test_a_dispatch_left_by_a_killed_gateway_fails_as_interrupted_and_a_live_ones_does_not():
    port = free_port()
    launch = GatewayLaunch.prepare(port=port, settings=gateway_settings_for_tests(port))
    killed = launch.start(worker=False)
    survivor_port = free_port()
    survivor_launch = GatewayLaunch.prepare(port=survivor_port, settings=gateway_settings_for_tests(survivor_port))
    survivor = survivor_launch.start(worker=False)
    replacement = None
    try:
        orphaned = session_create(spec=SessionSpec(key="agent:main:orphaned-dispatch", agent_id="main"))
        driven = session_create(spec=SessionSpec(key="agent:main:driven-dispatch", agent_id="main"))
        store.placement_start_dispatch(session=orphaned, owner=f"gateway:{boot_id_of(killed.pid)}")
        store.placement_start_dispatch(session=driven, owner=f"gateway:{boot_id_of(survivor.pid)}")

        killed.stop(signal.SIGKILL)
        replacement = launch.start(worker=False)

        deadline = time.monotonic() + 30
        while Placement.objects.get(pk=orphaned.pk).state != "failed" and time.monotonic() < deadline:
            time.sleep(0.1)
        failed = placement_state(replacement, orphaned.key)
        assert failed["state"] == "failed"
        assert failed["terminalReason"] == "Worker dispatch interrupted in requested"
        assert placement_state(replacement, driven.key)["state"] == "requested"
    finally:
        for server in (replacement, survivor, killed):
            if server is not None:
                server.stop()
        launch.remove_state()
        survivor_launch.remove_state()


def test_the_embedded_gateway_sweeps_periodically_after_its_start():
    port = free_port()
    embedded = {"REDIS_URL": "", "OPENCLAW_TASK_MODE": "inprocess", "OPENCLAW_SWEEP_INTERVAL_MS": "1000"}
    launch = GatewayLaunch.prepare(port=port, settings={**gateway_settings_for_tests(port), **embedded})
    gateway = launch.start(worker=False)
    try:
        time.sleep(1.5)  # startup recovery has run: what follows is the periodic sweep's to find
        session = session_create(spec=SessionSpec(key="agent:main:lost-later", agent_id="main"))
        placement = store.placement_start_dispatch(session=session, owner="celery:elsewhere:1")
        Placement.objects.filter(pk=session.pk).update(updated_at_ms=placement.updated_at_ms - 3_600_000)

        deadline = time.monotonic() + 30
        while Placement.objects.get(pk=session.pk).state != "failed" and time.monotonic() < deadline:
            time.sleep(0.2)
        failed = placement_state(gateway, session.key)
        # Its driver went silent past the stage deadline (10 min): the sweep declares it interrupted.
        assert (failed["state"], failed["terminalReason"]) == ("failed", "Worker dispatch interrupted in requested")
    finally:
        gateway.stop()
        launch.remove_state()
