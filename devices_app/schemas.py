"""Parameter and response shapes of devices, pairing, device tokens and nodes, shared by the RPC and the
JSON API. Every limit on what a caller sends is declared here once."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field, model_validator

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
    # The node's latest node.host.stats sample with updatedAtMs (also once offline).
    hostStats: dict[str, Any] | None = None
    # While connected: what the node declared on this connection (node.pluginTools.update, node.skills.update;
    # the skills without their content).
    nodePluginTools: list[dict[str, Any]] | None = None
    nodeSkills: list[dict[str, str]] | None = None


class NodeListOut(Schema):
    ts: int
    nodes: list[NodeOut]


class NodeDescribeOut(NodeOut):
    ts: int


class NodeEventParams(ClosedModel):
    event: str = Field(min_length=1, max_length=200)
    payload: Any = None
    payloadJSON: str | None = None


# --- what a node host declares of itself (OpenClaw's node-role publications) ----------------------

# OpenClaw's limits (gateway-protocol schema/nodes.ts and the gateway's normalisation): a node keeps at most 64
# skills of at most 64 KiB of content each and 512 KiB in all, and at most 128 plugin tools.
NODE_SKILLS_MAX = 64
NODE_SKILL_CONTENT_MAX_CHARS = 65536
NODE_SKILLS_CONTENT_MAX_BYTES = 512 * 1024
NODE_PLUGIN_TOOLS_MAX = 128
NODE_PLUGIN_TOOL_DESCRIPTION_MAX_CHARS = 1024
# Not one of OpenClaw's: what the stored tool catalog (parameter schemas included) may take, so that a node
# cannot grow its device row and every node.list without bound.
NODE_PLUGIN_TOOLS_MAX_BYTES = 256 * 1024

NodePluginToolName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")]
NodeSkillName = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^(?!.*--)[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$")
]
# OpenClaw's NonEmptyString: no upper bound there; the request frame bounds it here.
NodeText = Annotated[str, Field(min_length=1)]


class StrictClosedModel(ClosedModel):
    """Closed and strict, as OpenClaw's TypeBox schemas: no coercion ("1" is not 1, true is not 1)."""

    model_config = ConfigDict(strict=True)


class NodePluginToolMcp(StrictClosedModel):
    server: NodeText
    tool: NodeText


class NodePluginToolDescriptor(StrictClosedModel):
    pluginId: NodeText
    name: NodePluginToolName
    description: NodeText
    parameters: dict[str, Any] | None = None
    command: NodeText | None = None
    mcp: NodePluginToolMcp | None = None


class NodePluginToolsUpdateParams(StrictClosedModel):
    """``node.pluginTools.update``: the node's whole agent-visible plugin/MCP tool catalog (replaces the last)."""

    tools: list[NodePluginToolDescriptor]


class NodeSkillDescriptor(StrictClosedModel):
    # OpenClaw's name pattern has a look-ahead (no "--"), which only Python's engine runs.
    model_config = ConfigDict(strict=True, regex_engine="python-re")

    name: NodeSkillName
    description: str = Field(min_length=1, max_length=1024)
    content: str = Field(min_length=1, max_length=NODE_SKILL_CONTENT_MAX_CHARS)


class NodeSkillsUpdateParams(StrictClosedModel):
    """``node.skills.update``: the node's whole agent-visible skill catalog (replaces the last)."""

    skills: list[NodeSkillDescriptor] = Field(max_length=NODE_SKILLS_MAX)


NodeLoadAverage = Annotated[float, Field(ge=0, le=100000)]
NodeByteCount = Annotated[int, Field(ge=0)]


class NodeHostStatsPayload(StrictClosedModel):
    """The payload of the ``node.host.stats`` node event (OpenClaw's NodeHostStatsPayloadSchema)."""

    cpuCount: int = Field(ge=1, le=4096)
    # A 3-tuple in OpenClaw's schema; a JSON array of exactly three here.
    loadAverage: list[NodeLoadAverage] | None = Field(default=None, min_length=3, max_length=3)
    memoryTotalBytes: NodeByteCount
    memoryFreeBytes: NodeByteCount
    diskTotalBytes: NodeByteCount | None = None
    diskAvailableBytes: NodeByteCount | None = None

    @model_validator(mode="after")
    def _within_totals(self) -> NodeHostStatsPayload:
        if self.diskTotalBytes is None or self.diskAvailableBytes is None:
            disk_ok = self.diskTotalBytes is None and self.diskAvailableBytes is None
        else:
            disk_ok = self.diskAvailableBytes <= self.diskTotalBytes
        if self.memoryFreeBytes > self.memoryTotalBytes or not disk_ok:
            raise ValueError("free resources must not exceed totals and disk values must be paired")
        return self
