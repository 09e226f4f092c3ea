"""Parameter and response shapes of the gateway core's operations, shared by the RPC and the JSON API.

Every limit on what a caller sends (lengths, ranges) is declared here once; both interfaces
validate with these models before any service runs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import BaseModel, ConfigDict, Field

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


# --- pairing, tokens, nodes -------------------------------------------------------------------


class RequestIdParams(ClosedModel):
    requestId: Identifier


class DeviceIdParams(ClosedModel):
    deviceId: Identifier


class NodeIdParams(ClosedModel):
    nodeId: Identifier


class DeviceRoleParams(ClosedModel):
    """A device's token of one role (the JSON API has both in its path)."""

    deviceId: Identifier
    role: ScopeName


class TokenScopes(ClosedModel):
    """The scopes a rotated token gets (the JSON API's rotate body); none: the device's approved ones."""

    scopes: list[ScopeName] | None = Field(default=None, max_length=MAX_SCOPES)


class TokenRotateParams(TokenScopes, DeviceRoleParams):
    pass


class TokenRevokeParams(DeviceRoleParams):
    pass


class NodeRename(ClosedModel):
    displayName: str = Field(min_length=1, max_length=200)


class NodeRenameParams(NodeRename, NodeIdParams):
    pass


class PairingRequestsQuery(ClosedModel):
    """The JSON API's list of open pairing requests, all roles or one."""

    role: Literal["operator", "node"] | None = None


# --- what the pairing, token and node operations answer ----------------------------------------


class HealthOut(Schema):
    ok: bool
    ts: int


class DeviceIdentityOut(Schema):
    """What a device says of itself when it pairs: on its open request and on its paired record."""

    deviceId: str
    publicKey: str | None = None
    displayName: str | None = None
    platform: str | None = None
    deviceFamily: str | None = None
    clientId: str | None = None
    clientMode: str | None = None
    role: str | None = None
    roles: list[str]
    scopes: list[str]
    remoteIp: str | None = None


class PairingRequestOut(DeviceIdentityOut):
    """An open device pairing request (``device.pair.list``'s ``pending``)."""

    requestId: str
    role: str
    silent: bool | None = None
    isRepair: bool | None = None
    reason: str | None = None
    ts: int | None = None


class TokenSummaryOut(Schema):
    role: str
    scopes: list[str]
    createdAtMs: int | None = None
    rotatedAtMs: int | None = None
    revokedAtMs: int | None = None
    lastUsedAtMs: int | None = None


class PairedDeviceOut(DeviceIdentityOut):
    operatorLabel: str | None = None
    createdAtMs: int | None = None
    approvedAtMs: int | None = None
    lastSeenAtMs: int | None = None
    lastSeenReason: str | None = None
    tokens: list[TokenSummaryOut]
    connected: bool


class DevicePairListOut(Schema):
    pending: list[PairingRequestOut]
    paired: list[PairedDeviceOut]


class PairingRequestsOut(Schema):
    pending: list[PairingRequestOut]


class DevicePairApproveOut(Schema):
    requestId: str
    device: PairedDeviceOut


class DevicePairRejectOut(Schema):
    requestId: str
    deviceId: str


class DeviceRemovedOut(Schema):
    deviceId: str


class TokenRotateOut(Schema):
    deviceId: str
    role: str
    scopes: list[str]
    rotatedAtMs: int
    tokenDelivery: Literal["in-band", "withheld-cross-device"]
    token: str | None = None


class TokenRevokeOut(Schema):
    deviceId: str
    role: str
    revokedAtMs: int | None


class NodeIdentityOut(Schema):
    """What a node says of itself when it pairs: on its open request and on its paired record."""

    nodeId: str
    displayName: str | None = None
    platform: str | None = None
    version: str | None = None
    deviceFamily: str | None = None
    modelIdentifier: str | None = None
    caps: list[str]
    commands: list[str]
    permissions: dict[str, Any] | None = None
    remoteIp: str | None = None


class NodePairingRequestOut(NodeIdentityOut):
    """An open pairing request of a node (``node.pair.list``'s ``pending``)."""

    requestId: str
    silent: bool | None = None
    isRepair: bool | None = None
    ts: int | None = None


class PairedNodeOut(NodeIdentityOut):
    createdAtMs: int | None = None
    approvedAtMs: int | None = None
    lastConnectedAtMs: int | None = None


class NodePairListOut(Schema):
    pending: list[NodePairingRequestOut]
    paired: list[PairedNodeOut]


class NodePairApproveOut(Schema):
    requestId: str
    node: PairedNodeOut


class NodePairRejectOut(Schema):
    requestId: str
    nodeId: str


class NodeRemovedOut(Schema):
    nodeId: str


class NodeRenameOut(Schema):
    nodeId: str
    displayName: str


class NodeOut(OpenSchema):
    """A node of the catalog (``node.list``, ``node.describe``): paired, pending or only connected.
    Other apps add their fields (workers_app: ``sessionHost``, ``workerSlots``, ``workerBundle``, ``issues``)."""

    nodeId: str
    displayName: str | None = None
    platform: str | None = None
    version: str | None = None
    clientId: str | None = None
    clientMode: str | None = None
    deviceFamily: str | None = None
    modelIdentifier: str | None = None
    remoteIp: str | None = None
    caps: list[str] | None = None
    commands: list[str] | None = None
    permissions: dict[str, Any] | None = None
    pathEnv: str | None = None
    paired: bool
    connected: bool
    connectedAtMs: int | None = None
    lastConnectedAtMs: int | None = None
    lastDisconnectedAtMs: int | None = None
    lastSeenAtMs: int | None = None
    lastSeenReason: str | None = None
    approvedAtMs: int | None = None
    approvalState: Literal["approved", "pending-reapproval", "pending-approval", "unapproved"]
    pendingRequestId: str | None = None
    pendingDeclaredCaps: list[str] | None = None
    pendingDeclaredCommands: list[str] | None = None
    pendingDeclaredPermissions: dict[str, Any] | None = None


class NodeListOut(Schema):
    ts: int
    nodes: list[NodeOut]


class NodeDescribeOut(NodeOut):
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


class NodeEventParams(ClosedModel):
    event: str = Field(min_length=1, max_length=200)
    payload: Any = None
    payloadJSON: str | None = None
