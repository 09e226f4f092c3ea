"""Parameter and response shapes of the gateway core's operations, shared by the RPC and the JSON API.

Every limit on what a caller sends (lengths, ranges) is declared here once; both interfaces
validate with these models before any service runs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from .protocol import ClosedModel

# Ids and names callers send; the columns that keep them (device ids are 64 hex characters,
# request ids UUIDs, roles and scopes short words) are far below these bounds.
Identifier = Annotated[str, Field(min_length=1, max_length=200)]
ScopeName = Annotated[str, Field(min_length=1, max_length=64)]
MAX_SCOPES = 32

# --- errors (the one error shape of both interfaces) -------------------------------------------


class ErrorShape(Schema):
    code: str
    message: str
    details: Any = None
    retryable: bool | None = None
    retryAfterMs: int | None = None


class ErrorOut(Schema):
    error: ErrorShape


# What every JSON API route under the gateway token may answer besides its own refusals: bad input
# (400), a missing or wrong token (401) and an unexpected failure (500, a reference, never the cause).
ALWAYS_ERRORS = (400, 401, 500)


def error_responses(*statuses: int) -> dict[int, type[ErrorOut]]:
    """The error part of a route's ``response`` dict: :data:`ALWAYS_ERRORS` plus ``statuses``."""
    return dict.fromkeys(sorted({*ALWAYS_ERRORS, *statuses}), ErrorOut)


class OpenSchema(BaseModel):
    """A projection other apps may add fields to (node rows, session rows): the documented fields are
    checked, the others are passed on as they are. A plain pydantic model: ninja's ``Schema`` reads
    its input attribute by attribute and would drop the undeclared fields."""

    model_config = ConfigDict(extra="allow")


# --- health ------------------------------------------------------------------------------------


class HealthOut(Schema):
    ok: bool
    ts: int


# --- node.invoke and what nodes send back -------------------------------------------------------


class NodeInvokeParams(ClosedModel):
    nodeId: str = Field(max_length=200)
    command: str = Field(max_length=200)
    params: Any = None
    timeoutMs: int | None = Field(default=None, ge=0, le=24 * 3600 * 1000)
    idempotencyKey: str = Field(min_length=1, max_length=200)
    sessionKey: str | None = Field(default=None, max_length=300)
    turnSourceChannel: str | None = None
    turnSourceTo: str | None = None
    turnSourceAccountId: str | None = None
    turnSourceThreadId: str | None = None


class NodeInvokeError(ClosedModel):
    code: str | None = None
    message: str | None = None


class NodeInvokeResultParams(ClosedModel):
    id: Identifier
    nodeId: Identifier
    ok: bool
    payload: Any = None
    payloadJSON: Any = None
    error: NodeInvokeError | None = None


# --- status --------------------------------------------------------------------------------------


class StatusParams(ClosedModel):
    """OpenClaw's ``status`` reads these two flags; here neither changes the answer (no messaging channels, no
    CLI projection), but its clients may send them."""

    includeChannelSummary: bool | None = None
    includeCliProjection: bool | None = None


# --- features this gateway does not have (gateway/absent_features.py) -----------------------------
# Their params are OpenClaw's schemas (closed, as there): what a client may send is checked as OpenClaw checks
# it, and the answer is OpenClaw's for an empty or disabled feature.

# OpenClaw's NonEmptyString, bounded here like every text a caller sends.
NonEmptyText = Annotated[str, Field(min_length=1, max_length=1000)]
# A session key as sessions_app bounds it (sessions_app/keys.py MAX_KEY_LENGTH).
SessionKeyText = Annotated[str, Field(min_length=1, max_length=300)]
AgentIdText = Annotated[str, Field(min_length=1, max_length=200)]
TaskStatus = Literal["queued", "running", "completed", "failed", "cancelled", "timed_out"]


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


# OpenClaw takes one status or a list of them; one is read as a list of one (so an error names its position).
TaskStatuses = Annotated[list[TaskStatus], BeforeValidator(_one_or_many)]


class CronListParams(ClosedModel):
    sessionKey: SessionKeyText | None = None
    sessionAgentId: AgentIdText | None = None
    includeDisabled: bool | None = None
    limit: Annotated[int, Field(ge=1, le=200)] | None = None
    offset: Annotated[int, Field(ge=0)] | None = None
    query: Annotated[str, Field(max_length=1000)] | None = None
    enabled: Literal["all", "enabled", "disabled"] | None = None
    scheduleKind: Literal["all", "at", "every", "cron", "on-exit", "stream"] | None = None
    lastRunStatus: Literal["all", "ok", "error", "skipped", "unknown"] | None = None
    trigger: Literal["all", "conditional", "unconditional"] | None = None
    sortBy: Literal["nextRunAtMs", "updatedAtMs", "name"] | None = None
    sortDir: Literal["asc", "desc"] | None = None
    agentId: AgentIdText | None = None
    compact: bool | None = None
    includeDeliveryPreviews: bool | None = None


class TasksListParams(ClosedModel):
    status: TaskStatuses | None = None
    agentId: AgentIdText | None = None
    sessionKey: SessionKeyText | None = None
    limit: Annotated[int, Field(ge=1, le=500)] | None = None
    cursor: Annotated[str, Field(max_length=512)] | None = None
    sortBy: Literal["updatedAt", "endedAt"] | None = None


class UpdateStatusParams(ClosedModel):
    refreshCheckout: bool | None = None


class TalkCatalogParams(ClosedModel):
    provider: NonEmptyText | None = None
    model: NonEmptyText | None = None


class SessionFeatureParams(ClosedModel):
    """``sessions.companion.state``, ``sessions.branches.list`` and ``progressCard.get``."""

    sessionKey: SessionKeyText
    agentId: AgentIdText | None = None


class ObserverVisibilityParams(ClosedModel):
    visible: bool
