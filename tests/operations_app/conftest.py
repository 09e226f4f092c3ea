"""Runs with recorded usage, made through the sessions services a turn goes through (submit, claim, finish), then
placed on the day a test needs (``created_at``: the day a turn counts on)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sessions_app.models import Run, RunStatus, Session
from sessions_app.services import runs, sessions

PRICES = {
    "gpt-a": {"input": 2.0, "output": 8.0},
    "openai/gpt-b": {"input": 1.0, "output": 4.0, "cacheRead": 0.5, "cacheWrite": 1.5},
}


@pytest.fixture(autouse=True)
def _prices(settings):
    settings.OPENCLAW_MODEL_PRICES = PRICES


def at(day: str, clock: str = "12:00") -> datetime:
    return datetime.fromisoformat(f"{day}T{clock}:00").replace(tzinfo=UTC)


def session(key: str, **fields: Any) -> Session:
    found = Session.objects.filter(key=key).first()
    if found is not None:
        return found
    return sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id=key.split(":")[1], **fields))


def turn(
    key: str,
    run_id: str,
    when: datetime,
    usage: dict[str, Any] | None,
    *,
    model: str = "gpt-a",
    provider: str = "openai",
    status: str = RunStatus.OK,
) -> Run:
    session(key)
    runs.run_submit(session_key=key, message=f"message {run_id}", idempotency_key=run_id)
    runs.run_claim(run_id=run_id, executor="test")
    runs.run_finish(
        run_id=run_id,
        outcome=runs.TurnOutcome(status=status, text="reply", usage=usage, model=model, model_provider=provider),
    )
    Run.objects.filter(run_id=run_id).update(created_at=when)
    return Run.objects.get(run_id=run_id)


@pytest.fixture
def month() -> None:
    """Runs over three days of March 2026, two models, three sessions of two agents:

    ===========  ====  =====================  =======  ==============================
    run          day   session                model    input / output
    ===========  ====  =====================  =======  ==============================
    r1           1st   agent:main:alpha       gpt-a    1000 / 500
    r2           1st   agent:main:alpha       gpt-b    2000 / 1000 (+ 400 cache read)
    r3           2nd   agent:main:beta        gpt-a    3000 / 100
    r4           2nd   agent:main:beta        mystery  700 / 300 (no price)
    r5           3rd   agent:ops:gamma        gpt-a    10 / 20
    r6           3rd   agent:main:alpha       gpt-a    failed, no usage
    r0           Feb   agent:main:alpha       gpt-a    outside the window
    ===========  ====  =====================  =======  ==============================
    """
    turn("agent:main:alpha", "r1", at("2026-03-01", "08:00"), {"input": 1000, "output": 500, "totalTokens": 1500})
    turn(
        "agent:main:alpha",
        "r2",
        at("2026-03-01", "09:00"),
        {"input": 2000, "output": 1000, "cacheRead": 400},
        model="gpt-b",
    )
    turn("agent:main:beta", "r3", at("2026-03-02"), {"input": 3000, "output": 100})
    turn("agent:main:beta", "r4", at("2026-03-02", "13:00"), {"input": 700, "output": 300}, model="mystery")
    turn("agent:ops:gamma", "r5", at("2026-03-03"), {"input": 10, "output": 20})
    turn("agent:main:alpha", "r6", at("2026-03-03", "14:00"), None, status=RunStatus.ERROR)
    turn("agent:main:alpha", "r0", at("2026-02-28", "23:59"), {"input": 99, "output": 99})
