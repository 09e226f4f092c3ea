"""The days a usage report covers, resolved from OpenClaw's date parameters and bounded.

OpenClaw's rules (its ``usage-date-range``), with its refusal messages: dates are whole ``YYYY-MM-DD``
calendar days, given together, start not after end; ``mode`` picks the zone the days are counted in (``utc``,
the default; ``gateway``, this gateway's ``TIME_ZONE``; ``specific``, ``timeZone`` or else ``utcOffset``). On
top of those, a window is at most :data:`MAX_USAGE_DAYS` days, and ``range: "all"`` is refused rather than
reading every run ever recorded.
"""

from __future__ import annotations

import functools
import re
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo

from django.utils import timezone as django_timezone

from gateway.exceptions import InvalidRequest

from .schemas import MAX_USAGE_DAYS, UsageWindowParams

DEFAULT_DAYS = 30
RANGE_DAYS = {"7d": 7, "30d": 30, "90d": 90, "1y": 365}
# Dates a report can name: the epoch onwards, and a day whose end is still a valid datetime in any zone.
EARLIEST_DAY = date(1970, 1, 1)
LATEST_DAY = date(9998, 12, 31)
NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})
_UTC_OFFSET = re.compile(r"^UTC([+-])(\d{1,2})(?::([0-5]\d))?$")


@dataclass(frozen=True)
class UsageWindow:
    first_day: date
    last_day: date
    zone: tzinfo

    @property
    def days(self) -> int:
        return (self.last_day - self.first_day).days + 1

    @property
    def start(self) -> datetime:
        return datetime.combine(self.first_day, time.min, tzinfo=self.zone)

    @property
    def end(self) -> datetime:
        """Exclusive: the first instant after the last day."""
        return datetime.combine(self.last_day + timedelta(days=1), time.min, tzinfo=self.zone)

    def each_day(self) -> list[date]:
        return [self.first_day + timedelta(days=offset) for offset in range(self.days)]


def resolve_window(params: UsageWindowParams, *, days: int | None = None, now: datetime | None = None) -> UsageWindow:
    zone = _zone(params)
    for field in ("startDate", "endDate"):
        raw = getattr(params, field)
        if raw is not None and _calendar_day(raw) is None:
            raise InvalidRequest(f"invalid {field}: expected a valid YYYY-MM-DD calendar date")
    first_day, last_day = _calendar_day(params.startDate), _calendar_day(params.endDate)
    if (first_day is None) != (last_day is None):
        raise InvalidRequest("startDate and endDate must be provided together")
    if first_day is not None and last_day is not None:
        if first_day > last_day:
            raise InvalidRequest("startDate must not be after endDate")
        for field, day in (("startDate", first_day), ("endDate", last_day)):
            if not EARLIEST_DAY <= day <= LATEST_DAY:
                raise InvalidRequest(f"{field} must be between {EARLIEST_DAY} and {LATEST_DAY}")
        window = UsageWindow(first_day=first_day, last_day=last_day, zone=zone)
        if window.days > MAX_USAGE_DAYS:
            raise InvalidRequest(
                f"date range too long: {window.days} days from startDate to endDate, at most {MAX_USAGE_DAYS}"
            )
        return window
    today = (now or django_timezone.now()).astimezone(zone).date()
    if params.range == "all":
        raise InvalidRequest(f'range "all" is not served: a report covers at most {MAX_USAGE_DAYS} days (use "1y")')
    span = RANGE_DAYS[params.range] if params.range else days or DEFAULT_DAYS
    return UsageWindow(first_day=today - timedelta(days=span - 1), last_day=today, zone=zone)


def _calendar_day(raw: str | None) -> date | None:
    if raw is None:
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError:
        return None


def _zone(params: UsageWindowParams) -> tzinfo:
    if params.mode == "gateway":
        return django_timezone.get_default_timezone()
    if params.mode != "specific":
        # OpenClaw: without a mode (or with "utc") the days are UTC days, whatever else was sent.
        return UTC
    offset = _utc_offset(params.utcOffset)
    if params.timeZone is not None:
        named = _named_zone(params.timeZone)
        if named is not None:
            return named
        # A browser's zone database may be newer than the gateway's: a usable offset sent with it still counts.
        if offset is not None:
            return offset
        raise InvalidRequest("invalid timeZone: expected a valid IANA time zone")
    if offset is not None:
        return offset
    if params.utcOffset is not None:
        raise InvalidRequest("invalid utcOffset: expected UTC-12:00 through UTC+14:00")
    return UTC


def _utc_offset(raw: str | None) -> tzinfo | None:
    match = _UTC_OFFSET.match(raw or "")
    if match is None:
        return None
    sign = 1 if match.group(1) == "+" else -1
    minutes = sign * (int(match.group(2)) * 60 + int(match.group(3) or 0))
    if not -12 * 60 <= minutes <= 14 * 60:
        return None
    return UTC if minutes == 0 else timezone(timedelta(minutes=minutes))


@functools.cache
def _known_zones() -> frozenset[str]:
    # The IANA names, less the files of a system's zone directory that are not zones of their own (PostgreSQL's
    # AT TIME ZONE would refuse them mid-query); read from disk once.
    return frozenset(zoneinfo.available_timezones()) - NOT_ZONES


def _named_zone(name: str) -> tzinfo | None:
    if name not in _known_zones():
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return None
