"""Parameter and response shapes of devices, pairing, device tokens and nodes, shared by the RPC and the
JSON API. Every limit on what a caller sends is declared here once."""

from __future__ import annotations

from typing import Any, Literal

from ninja import Schema
from pydantic import Field

from gateway.protocol import ClosedModel
from gateway.schemas import MAX_SCOPES, Identifier, OpenSchema, ScopeName

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


class NodeEventParams(ClosedModel):
    event: str = Field(min_length=1, max_length=200)
    payload: Any = None
    payloadJSON: str | None = None
