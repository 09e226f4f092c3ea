"""Turns are counted by status when they end, with their duration, the model's time and the tokens by model."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from sessions_app import turns
from sessions_app.model_providers.base import ModelProviderError
from sessions_app.services import runs
from tests.sessions_app.test_agent_turns import ScriptedProvider, make, use

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_finished_turn_counts_its_status_duration_model_time_and_tokens(monkeypatch, tmp_path):
    session = make(cwd=str(tmp_path))
    use(monkeypatch, ScriptedProvider(("hello", ())))
    runs.run_submit(session_key=session.key, message="hi", idempotency_key="r1")
    model = session.model or turns.default_model()
    ok = sample("openclaw_turns_total", status="ok")
    timed = sample("openclaw_turn_duration_seconds_count", status="ok")
    calls = sample("openclaw_model_call_seconds_count", provider="scripted")
    tokens_in = sample("openclaw_model_tokens_total", model=model, direction="in")
    tokens_out = sample("openclaw_model_tokens_total", model=model, direction="out")

    assert turns.execute_turn("r1") == "ok"

    assert sample("openclaw_turns_total", status="ok") == ok + 1
    assert sample("openclaw_turn_duration_seconds_count", status="ok") == timed + 1
    assert sample("openclaw_model_call_seconds_count", provider="scripted") == calls + 1
    assert sample("openclaw_model_tokens_total", model=model, direction="in") == tokens_in + 5
    assert sample("openclaw_model_tokens_total", model=model, direction="out") == tokens_out + 1


class FailingProvider:
    name = "failing"

    def stream(self, messages, *, model, should_abort, tools=None):
        raise ModelProviderError("upstream refused", kind="http")
        yield  # a generator, as providers are


def test_a_failed_model_call_still_counts_its_time_and_the_turn_as_error(monkeypatch, tmp_path):
    session = make(cwd=str(tmp_path))
    monkeypatch.setattr(turns, "get_model_provider", FailingProvider)
    runs.run_submit(session_key=session.key, message="hi", idempotency_key="r1")
    errors = sample("openclaw_turns_total", status="error")
    calls = sample("openclaw_model_call_seconds_count", provider="failing")

    assert turns.execute_turn("r1") == "error"

    assert sample("openclaw_turns_total", status="error") == errors + 1
    assert sample("openclaw_model_call_seconds_count", provider="failing") == calls + 1


def test_a_queued_turn_aborted_before_it_ran_counts_as_aborted():
    session = make()
    runs.run_submit(session_key=session.key, message="hi", idempotency_key="r1")
    aborted = sample("openclaw_turns_total", status="aborted")
    timed = sample("openclaw_turn_duration_seconds_count", status="aborted")

    runs.run_abort(session_key=session.key)

    assert sample("openclaw_turns_total", status="aborted") == aborted + 1
    assert sample("openclaw_turn_duration_seconds_count", status="aborted") == timed  # it never started
