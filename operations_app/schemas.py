"""Parameter shapes of the operations methods, shared by the RPC, the JSON API and the console: ``logs.tail``,
and the usage reports (``usage.status``, ``usage.cost``, ``sessions.usage``). OpenClaw's names and patterns;
every limit on what a caller sends is declared here once (the date range itself is resolved and bounded by
:mod:`operations_app.usage_window`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt

from gateway.protocol import ClosedModel

from . import logs

# --- logs ---------------------------------------------------------------------------------------------


class LogsTailParams(ClosedModel):
    """OpenClaw's ``logs.tail`` params (LogsTailParamsSchema): a byte offset from the previous answer, and at most
    5000 lines and 1,000,000 bytes per answer."""

    # Strict: JSON integers only, as OpenClaw's schema (no "12", no true).
    cursor: StrictInt | None = Field(default=None, ge=0, le=2**53 - 1)
    limit: StrictInt | None = Field(default=None, ge=1, le=logs.MAX_LIMIT)
    maxBytes: StrictInt | None = Field(default=None, ge=1, le=logs.MAX_BYTES)


# --- usage ---------------------------------------------------------------------------------------------

# The longest window a report covers: a year, leap day included. OpenClaw reads up to a century of
# transcript files; here every report is SQL over the runs table, so the window is bounded.
MAX_USAGE_DAYS = 366
# sessions.usage rows (OpenClaw's default is 50; its Control UI asks for 1000).
DEFAULT_SESSIONS_LIMIT = 50
MAX_SESSIONS_LIMIT = 1000

DateText = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}$", max_length=10)]
UtcOffsetText = Annotated[str, Field(pattern=r"^UTC[+-]\d{1,2}(?::[0-5]\d)?$", max_length=9)]
# IANA names are at most ~30 characters (America/Argentina/ComodRivadavia).
TimeZoneName = Annotated[str, Field(min_length=1, max_length=64)]
AgentId = Annotated[str, Field(min_length=1, max_length=100)]
SessionKey = Annotated[str, Field(min_length=1, max_length=300)]
DateMode = Literal["utc", "gateway", "specific"]
RangePreset = Literal["7d", "30d", "90d", "1y", "all"]


class UsageWindowParams(ClosedModel):
    """How a report's days are chosen: ``startDate``..``endDate`` (both, inclusive), else ``range``, else
    ``days`` ending today, else the last 30 days; in UTC, the gateway's zone, or a ``specific`` one."""

    startDate: DateText | None = None
    endDate: DateText | None = None
    range: RangePreset | None = None
    mode: DateMode | None = None
    utcOffset: UtcOffsetText | None = None
    timeZone: TimeZoneName | None = None


class UsageStatusParams(ClosedModel):
    sessionKey: SessionKey | None = None


class UsageCostParams(UsageWindowParams):
    days: int | None = Field(default=None, ge=1, le=MAX_USAGE_DAYS)
    agentId: AgentId | None = None
    agentScope: Literal["all"] | None = None


class SessionsUsageParams(UsageWindowParams):
    key: SessionKey | None = None
    agentId: AgentId | None = None
    agentScope: Literal["all"] | None = None
    groupBy: Literal["instance", "family"] | None = None
    includeHistorical: bool | None = None
    limit: int | None = Field(default=None, ge=1, le=MAX_SESSIONS_LIMIT)
    includeContextWeight: bool | None = None
    # Accepted, no effect here: OpenClaw's breakdown by the user profile that created a session (no profiles here).
    creatorKey: Annotated[str, Field(min_length=1, max_length=300)] | None = None
