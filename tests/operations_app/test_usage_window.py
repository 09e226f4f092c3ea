"""The days a report covers when the caller names none: the last N days up to today, in the caller's zone."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from operations_app.schemas import UsageCostParams
from operations_app.usage_window import resolve_window

NOW = datetime(2026, 3, 10, 22, 0, tzinfo=UTC)


def window(**params):
    parsed = UsageCostParams.model_validate(params)
    return resolve_window(parsed, days=parsed.days, now=NOW)


def test_the_default_is_the_last_30_days_up_to_today():
    found = window()
    assert (found.first_day, found.last_day, found.days) == (date(2026, 2, 9), date(2026, 3, 10), 30)
    assert found.start == datetime(2026, 2, 9, tzinfo=UTC)
    assert found.end == datetime(2026, 3, 11, tzinfo=UTC)


@pytest.mark.parametrize(("preset", "days"), [("7d", 7), ("30d", 30), ("90d", 90), ("1y", 365)])
def test_a_range_preset_ends_today(preset, days):
    found = window(range=preset)
    assert (found.last_day, found.days) == (date(2026, 3, 10), days)


def test_days_end_today_and_explicit_dates_win_over_both():
    assert window(days=1).first_day == date(2026, 3, 10)
    assert window(days=366).days == 366
    explicit = window(days=3, range="7d", startDate="2026-01-01", endDate="2026-01-31")
    assert (explicit.first_day, explicit.days) == (date(2026, 1, 1), 31)


def test_today_is_the_callers_today():
    # 22:00 UTC on the 10th is already the 11th in Tokyo, still the 10th five hours west.
    assert window(mode="specific", timeZone="Asia/Tokyo").last_day == date(2026, 3, 11)
    west = window(mode="specific", utcOffset="UTC-5")
    assert west.last_day == date(2026, 3, 10)
    assert west.zone == timezone(timedelta(hours=-5))
    assert west.start == datetime(2026, 2, 9, 5, tzinfo=UTC)


def test_a_leap_year_fits_and_every_day_is_listed():
    found = window(startDate="2024-01-01", endDate="2024-12-31")
    assert found.days == 366
    assert found.each_day()[59] == date(2024, 2, 29)
    assert len(found.each_day()) == 366
