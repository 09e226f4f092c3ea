"""What a recovery pass changes is counted by pass and reason; what it leaves alone is not."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from workers_app.providers import providers
from workers_app.services.recovery import workers_recovery_sweep

from .test_placement_store import make_session
from .test_recovery import ScriptedProvider, on_scripted, row

pytestmark = pytest.mark.django_db


@pytest.fixture
def provider():
    scripted = ScriptedProvider()
    providers.register(scripted)
    yield scripted
    providers.unregister(scripted.id)


def transitions(reason: str, phase: str = "sweep") -> float:
    return REGISTRY.get_sample_value("openclaw_recovery_transitions_total", {"phase": phase, "reason": reason}) or 0.0


def all_transitions() -> float:
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "openclaw_recovery_transitions"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def test_a_lost_lease_counts_the_environment_and_the_placement_it_failed(provider):
    provider.status = "unknown"
    session = make_session()
    on_scripted(session)
    lost = transitions("environment:lease-unknown")
    reclaimed = transitions("placement:active-failed")

    workers_recovery_sweep()

    assert row(session)["state"] == "failed"
    assert transitions("environment:lease-unknown") == lost + 1
    assert transitions("placement:active-failed") == reclaimed + 1


def test_a_healthy_pass_counts_nothing(provider):
    session = make_session()
    on_scripted(session)
    before = all_transitions()

    workers_recovery_sweep()

    assert row(session)["state"] == "active"
    assert all_transitions() == before
