"""Parameter and response shapes of the gateway core's operations, shared by the RPC and the JSON API.

Every limit on what a caller sends (lengths, ranges) is declared here once; both interfaces
validate with these models before any service runs.
"""

from __future__ import annotations

from typing import Annotated, Any

from ninja import Schema
from pydantic import Field

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


# --- pairing, tokens, nodes -------------------------------------------------------------------


class RequestIdParams(ClosedModel):
    requestId: Identifier


class DeviceIdParams(ClosedModel):
    deviceId: Identifier


class NodeIdParams(ClosedModel):
    nodeId: Identifier


class TokenRotateParams(ClosedModel):
    deviceId: Identifier
    role: ScopeName
    scopes: list[ScopeName] | None = Field(default=None, max_length=MAX_SCOPES)


class TokenRevokeParams(ClosedModel):
    deviceId: Identifier
    role: ScopeName


class NodeRenameParams(ClosedModel):
    nodeId: Identifier
    displayName: str = Field(min_length=1, max_length=200)


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


class NodeEventParams(ClosedModel):
    event: str = Field(min_length=1, max_length=200)
    payload: Any = None
    payloadJSON: str | None = None
