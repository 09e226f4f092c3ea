"""Parameter and response shapes of exec policies and approvals, shared by the RPC and the JSON API. Every
limit on what a caller sends is declared here once (the document's own limits are exec_policy's)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import Field, field_validator, model_validator

from gateway.protocol import ClosedModel
from gateway.schemas import Identifier

# A command past the display limit (8 KiB, selectors.DISPLAY_LIMIT) is refused by the service with
# OpenClaw's own message; this bounds what is read at all.
MAX_COMMAND_CHARS = 64 * 1024
MAX_ARGV_ITEMS = 1024
MAX_CWD_CHARS = 4096
MAX_WARNING_CHARS = 4096
MAX_TIMEOUT_MS = 24 * 60 * 60 * 1000
MAX_HISTORY_LIMIT = 100

BaseHash = Annotated[str, Field(min_length=1, max_length=200)]
OptionalId = Annotated[str | None, Field(default=None, max_length=200)]

# --- policies ------------------------------------------------------------------------------------------


class ExecPolicySetBody(ClosedModel):
    """``exec.approvals.set`` (and the JSON API's body): the whole document, and the hash it was read with.
    The document itself is checked by the service (closed objects, limits, regular expressions)."""

    file: dict[str, Any]
    baseHash: BaseHash | None = None


class NodeIdParams(ClosedModel):
    nodeId: Identifier


class ExecPolicyNodeSetParams(ExecPolicySetBody, NodeIdParams):
    # OpenClaw's alternative to ``file`` for its macOS app's nodes, whose approvals the app keeps: no such node
    # pairs here, so it is refused by name rather than as an unknown key.
    native: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _no_native(self) -> ExecPolicyNodeSetParams:
        if self.native is not None:
            raise ValueError("native exec approvals (OpenClaw's macOS app nodes) are not kept here; send file")
        return self


# --- approvals -----------------------------------------------------------------------------------------


class ExecApprovalRequestParams(ClosedModel):
    id: Identifier | None = None
    command: str | None = Field(default=None, max_length=MAX_COMMAND_CHARS)
    commandArgv: list[str] | None = Field(default=None, max_length=MAX_ARGV_ITEMS)
    cwd: str | None = Field(default=None, max_length=MAX_CWD_CHARS)
    nodeId: OptionalId
    host: Literal["gateway", "node"] | None = None
    security: str | None = Field(default=None, max_length=32)
    ask: str | None = Field(default=None, max_length=32)
    agentId: OptionalId
    sessionKey: str | None = Field(default=None, max_length=300)
    sessionId: OptionalId
    runId: OptionalId
    toolCallId: OptionalId
    timeoutMs: int | None = Field(default=None, ge=1, le=MAX_TIMEOUT_MS)
    twoPhase: bool | None = None
    warningText: str | None = Field(default=None, max_length=MAX_WARNING_CHARS)
    # Accepted, no effect here (docs/gateway-protocol.md, "OpenClaw's params"): OpenClaw's run plans and command
    # highlighting, message-send scopes, channel routing and delivery of the approval to chat channels, which this
    # gateway does not have (its approvals reach the operators' clients and console only).
    systemRunPlan: dict[str, Any] | None = None
    env: dict[str, str] | None = None
    scope: dict[str, Any] | None = None
    unavailableDecisions: Annotated[list[Literal["allow-always"]], Field(min_length=1, max_length=1)] | None = None
    commandSpans: list[dict[str, Any]] | None = None
    resolvedPath: str | None = Field(default=None, max_length=MAX_CWD_CHARS)
    turnSourceChannel: str | None = None
    turnSourceTo: str | None = None
    turnSourceAccountId: str | None = None
    turnSourceThreadId: str | int | float | None = None
    approvalReviewerDeviceIds: list[Annotated[str, Field(min_length=1)]] | None = None
    requireDeliveryRoute: bool | None = None
    suppressDelivery: bool | None = None
    deliverToApprovalClientsOnly: bool | None = None

    @field_validator("commandArgv")
    @classmethod
    def _argv_size(cls, argv: list[str] | None) -> list[str] | None:
        if argv is not None and sum(len(arg) for arg in argv) > MAX_COMMAND_CHARS:
            raise ValueError(f"at most {MAX_COMMAND_CHARS} characters in all")
        return argv


class ApprovalIdParams(ClosedModel):
    id: Identifier


class ResolveBody(ClosedModel):
    # Any text: a decision other than allow-once, allow-always, deny is the service's "invalid decision".
    decision: str = Field(min_length=1, max_length=64)


class Reviewer(ClosedModel):
    channel: Annotated[str, Field(min_length=1, max_length=200)]
    accountId: Annotated[str, Field(min_length=1, max_length=200)]
    senderId: Annotated[str, Field(min_length=1, max_length=200)]


class ExecApprovalResolveParams(ResolveBody, ApprovalIdParams):
    # Accepted, no effect here: the chat-channel identity of a reviewer (no channels here; the audit log names the
    # connection's operator).
    reviewer: Reviewer | None = None
    # An allow-always entry here does not expire: asking for one that does is refused rather than made permanent.
    grantExpiresInDays: Annotated[int, Field(ge=1, le=3650)] | None = None

    @model_validator(mode="after")
    def _no_expiring_grant(self) -> ExecApprovalResolveParams:
        if self.grantExpiresInDays is not None and self.decision == "allow-always":
            raise ValueError("allow-always entries do not expire here; grantExpiresInDays is not supported")
        return self


class ApprovalHistoryParams(ClosedModel):
    """OpenClaw's ``approval.history`` params: a page of at most 100, the previous page's ``nextCursor``,
    and the approval kind (only ``exec`` approvals exist here)."""

    limit: int = Field(default=50, ge=1, le=MAX_HISTORY_LIMIT)
    cursor: str | None = Field(default=None, min_length=1, max_length=512)
    kind: Literal["exec", "plugin", "system-agent"] | None = None


# --- what they answer (the JSON API's response schemas) ------------------------------------------------


class ResolvedDefaultsOut(Schema):
    security: str
    ask: str
    askFallback: str
    autoAllowSkills: bool


class ExecPolicyOut(Schema):
    path: str
    exists: bool
    hash: str
    file: dict[str, Any]
    resolvedDefaults: ResolvedDefaultsOut


class ApprovalRequestOut(Schema):
    """The ``request`` object of events, lists and history."""

    command: str
    commandArgv: list[str] | None = None
    cwd: str | None = None
    nodeId: str | None = None
    host: str
    security: str | None = None
    ask: str | None = None
    agentId: str | None = None
    sessionKey: str | None = None
    sessionId: str | None = None
    runId: str | None = None
    toolCallId: str | None = None
    allowedDecisions: list[str]
    warningText: str | None = None


class PendingApprovalOut(Schema):
    id: str
    request: ApprovalRequestOut
    createdAtMs: int
    expiresAtMs: int
    approvalKind: Literal["exec"]


class ApprovalGetOut(Schema):
    id: str
    commandText: str
    commandPreview: str | None = None
    allowedDecisions: list[str]
    host: str | None = None
    nodeId: str | None = None
    agentId: str | None = None
    expiresAtMs: int


class ResolveOut(Schema):
    ok: bool


class ApprovalPresentationOut(Schema):
    kind: Literal["exec"]
    commandText: str
    commandPreview: str | None = None
    warningText: str | None = None
    host: str | None = None
    nodeId: str | None = None
    agentId: str | None = None
    allowedDecisions: list[str]


class ApprovalSourceOut(Schema):
    agentId: str | None = None
    sessionKey: str | None = None


class ApprovalResolverOut(Schema):
    kind: Literal["device", "channel", "runtime", "system"]
    id: str | None = None


class ApprovalHistoryItemOut(Schema):
    """A settled approval, as OpenClaw's terminal approval snapshot."""

    id: str
    urlPath: str
    createdAtMs: int
    expiresAtMs: int
    presentation: ApprovalPresentationOut
    resolvedAtMs: int
    status: Literal["allowed", "denied", "expired", "cancelled"]
    decision: Literal["allow-once", "allow-always", "deny"] | None = None
    reason: str
    source: ApprovalSourceOut | None = None
    resolver: ApprovalResolverOut | None = None


class ApprovalHistoryOut(Schema):
    items: list[ApprovalHistoryItemOut]
    nextCursor: str | None = None
