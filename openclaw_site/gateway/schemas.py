"""Parameter and response shapes of the gateway core's operations, shared by the RPC and the JSON API.

Every limit on what a caller sends (lengths, ranges) is declared here once; both interfaces
validate with these models before any service runs.
"""

from __future__ import annotations

from typing import Any

from ninja import Schema
from pydantic import Field

from .protocol import ClosedModel

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
    requestId: str = Field(min_length=1)


class DeviceIdParams(ClosedModel):
    deviceId: str = Field(min_length=1)


class NodeIdParams(ClosedModel):
    nodeId: str = Field(min_length=1)


class TokenRotateParams(ClosedModel):
    deviceId: str = Field(min_length=1)
    role: str = Field(min_length=1)
    scopes: list[str] | None = None


class TokenRevokeParams(ClosedModel):
    deviceId: str = Field(min_length=1)
    role: str = Field(min_length=1)


class NodeRenameParams(ClosedModel):
    nodeId: str = Field(min_length=1)
    displayName: str = Field(min_length=1, max_length=200)


# --- node.invoke and what nodes send back -------------------------------------------------------


class NodeInvokeParams(ClosedModel):
    nodeId: str
    command: str
    params: Any = None
    timeoutMs: int | None = Field(default=None, ge=0)
    idempotencyKey: str = Field(min_length=1)
    sessionKey: str | None = None
    turnSourceChannel: str | None = None
    turnSourceTo: str | None = None
    turnSourceAccountId: str | None = None
    turnSourceThreadId: str | None = None


class NodeInvokeError(ClosedModel):
    code: str | None = None
    message: str | None = None


class NodeInvokeResultParams(ClosedModel):
    id: str = Field(min_length=1)
    nodeId: str = Field(min_length=1)
    ok: bool
    payload: Any = None
    payloadJSON: Any = None
    error: NodeInvokeError | None = None


class NodeEventParams(ClosedModel):
    event: str = Field(min_length=1)
    payload: Any = None
    payloadJSON: str | None = None
