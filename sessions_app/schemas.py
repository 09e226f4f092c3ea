"""Parameter and response shapes of the sessions operations, shared by the RPC and the JSON API.

Each operation has one schema; the JSON API takes the parts that are not in its URL (the session
key, the agent) from the same base classes. Every limit on what a caller sends is declared here
once, with the column it protects in mind, so bad input is refused before any write.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AfterValidator, Field, model_validator

from gateway import scopes as sc
from gateway.protocol import DEFAULT_MAX_FRAME_BYTES, MAX_SAFE_INTEGER, ClosedModel, NulCheckedByService
from gateway.schemas import OpenSchema

WORKTREE_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
MAX_WAIT_MS = 24 * 3600 * 1000

# A run's id is its idempotency key (``Run.run_id``, 200 characters).
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=200)]
Label = Annotated[str | None, Field(max_length=200)]
Category = Annotated[str | None, Field(max_length=100)]
ModelName = Annotated[str | None, Field(max_length=200)]
# A session row's ``revision`` (``Session.revision``): 1 when created, +1 on every write.
Revision = Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)]
HistoryLimit = Annotated[int, Field(ge=1, le=1000)]
WaitTimeoutMs = Annotated[int, Field(ge=0, le=MAX_WAIT_MS)]
# The text of one user message: about 250,000 tokens, more than most models take in a whole context.
# OpenClaw bounds it only by its frame (25 MiB, sized for image attachments, which chat.send here does not take).
MAX_MESSAGE_CHARS = 1024 * 1024
# A request frame that carries one (chat.send, sessions.create): the text at up to 4 bytes a character as
# UTF-8, and the room every other method has for the rest of its params.
MESSAGE_FRAME_BYTES = 4 * MAX_MESSAGE_CHARS + DEFAULT_MAX_FRAME_BYTES
# A turn's text: the run service refuses NUL with the reference's own message
# ("message must not contain null bytes") before any write; lone surrogates stop here.
MessageText = Annotated[str, Field(max_length=MAX_MESSAGE_CHARS), NulCheckedByService()]


NonEmptyText = Annotated[str, Field(min_length=1, max_length=1000)]
PermissionMode = Literal["read-only", "guarded", "workspace", "full"]


class ToolOverrides(ClosedModel):
    """OpenClaw's per-session tool overrides (MCP servers, skills, web search; none exist here)."""

    mcpServers: dict[str, bool] | None = None
    mcpToolsDeny: dict[str, list[Annotated[str, Field(min_length=1)]]] | None = None
    skills: dict[str, bool] | None = None
    webSearch: bool | None = None


class Mention(ClosedModel):
    profileId: Annotated[str, Field(min_length=1, max_length=256)]
    start: Annotated[int, Field(ge=0)]
    end: Annotated[int, Field(ge=1)]


Mentions = Annotated[list[Mention], Field(max_length=10)]


def _refuse_attachments(attachments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if attachments:
        raise ValueError("attachments are not taken by this gateway; send the message as text")
    return attachments


# Files and images sent with a message (OpenClaw's ``attachments``): none is taken here, so a message that carries
# one is refused rather than sent without it; an empty list is accepted.
NoAttachments = Annotated[list[dict[str, Any]], AfterValidator(_refuse_attachments)]


class ProfileRelation(ClosedModel):
    profileId: Annotated[str, Field(min_length=1, max_length=256)]
    relationship: Literal["owned", "created", "involving"]


class Repository(ClosedModel):
    url: Annotated[str, Field(min_length=1, max_length=2048)]
    ref: Annotated[str, Field(min_length=1, max_length=1024)] | None = None


class SessionRef(ClosedModel):
    """A session named by key (``agent:<agent>:<rest>``, or a bare key under ``agentId``)."""

    key: str = Field(min_length=1)
    agentId: str | None = None


class SessionsDescribeParams(SessionRef):
    includeDerivedTitles: bool | None = None
    includeLastMessage: bool | None = None


class ExpectedRevision(ClosedModel):
    """Guarded mutations: refused when the session changed since the caller read it. ``expectedSessionId`` /
    ``expectedLifecycleRevision`` (OpenClaw's) catch a reset or a new owner; ``expectedRevision`` (this
    gateway's: the row's ``revision``) catches any write of the row."""

    expectedSessionId: str | None = None
    expectedLifecycleRevision: str | None = None
    expectedRevision: Revision | None = None


# --- sessions.* -------------------------------------------------------------------------------


class SessionsCreateParams(ClosedModel):
    key: str | None = None
    idempotencyKey: IdempotencyKey | None = None
    agentId: str | None = None
    label: Label = None
    displayName: Label = None
    category: Category = None
    model: ModelName = None
    parentSessionKey: str | None = None
    message: MessageText | None = None
    worktree: bool | None = None
    worktreeBaseRef: str | None = Field(default=None, max_length=200)
    worktreeName: str | None = Field(default=None, pattern=WORKTREE_NAME_PATTERN)
    cwd: str | None = None
    execNode: str | None = None
    # OpenClaw's /new: the new session follows its parent (checked here: a parent with a turn under way refuses).
    emitCommandHooks: bool | None = None
    succeedsParent: bool | None = None
    # Accepted, no effect here (docs/gateway-protocol.md, "OpenClaw's params"): OpenClaw's per-session runtime
    # settings, projects, forks at creation, attachments and mentions, which this gateway does not have.
    titleSource: Annotated[str, Field(max_length=1000)] | None = None
    agentRuntime: NonEmptyText | None = None
    contextWindow: NonEmptyText | None = None
    thinkingLevel: NonEmptyText | None = None
    fastMode: bool | Literal["auto"] | None = None
    permissionMode: PermissionMode | None = None
    toolOverrides: ToolOverrides | None = None
    incognito: bool | None = None
    visibility: Literal["shared", "read-only", "suggest", "draft"] | None = None
    catalogId: NonEmptyText | None = None
    spawnDepth: Annotated[int, Field(ge=1)] | None = None
    fork: bool | None = None
    forkFrom: Literal["last-completed"] | None = None
    timeoutMs: Annotated[int, Field(ge=0)] | None = None
    task: str | None = None
    mentions: Mentions | None = None
    attachments: NoAttachments | None = None
    projectId: NonEmptyText | None = None
    projectGitUrl: Annotated[str, Field(min_length=1, max_length=2048)] | None = None
    repository: Repository | None = None
    worktreeSource: Literal["empty"] | None = None

    def required_scope(self) -> str:
        """OpenClaw's scope of this creation: ``operator.admin`` to run it on a chosen node (``execNode``), with tool
        overrides, incognito or ``permissionMode: "full"``; ``operator.write`` otherwise."""
        if self.incognito is True or self.permissionMode == "full":
            return sc.ADMIN
        return sc.ADMIN if {"execNode", "toolOverrides"} & self.model_fields_set else sc.WRITE

    @model_validator(mode="after")
    def _succession(self) -> SessionsCreateParams:
        """OpenClaw's checks of ``succeedsParent``, with its messages, in its order."""
        if self.succeedsParent is not None:
            if not self.parentSessionKey:
                raise ValueError("succeedsParent requires parentSessionKey")
            if self.emitCommandHooks is not True:
                raise ValueError("succeedsParent requires emitCommandHooks")
            if self.succeedsParent and self.fork is True:
                raise ValueError("succeedsParent conflicts with fork: a fork runs in parallel to its parent")
        return self


# A cursor is what a page's ``nextCursor`` said, passed back unchanged.
Cursor = Annotated[str, Field(min_length=1, max_length=500)]


# A sessions.list page holds at most this many rows. The JSON API refuses a larger limit; OpenClaw takes any limit
# >= 1 (its Control UI asks for 10000), so over the wire a larger one is clamped to it and ``limitApplied`` says so.
SESSIONS_PAGE_MAX = 1000


class SessionsPageQuery(ClosedModel):
    """A page of sessions (the JSON API's query): OpenClaw's ``limit``/``offset`` pages, and (this gateway's
    addition) ``cursor``: the previous page's ``nextCursor``, whose page costs the same at any depth (an offset
    makes the database skip every row before it)."""

    limit: Annotated[int, Field(ge=1, le=SESSIONS_PAGE_MAX)] = 100
    offset: int = Field(default=0, ge=0)
    cursor: Cursor | None = None
    agentId: str | None = None
    label: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    search: str | None = Field(default=None, max_length=200)
    archived: bool | Literal["all"] = False

    @property
    def page_limit(self) -> int:
        return min(self.limit, SESSIONS_PAGE_MAX)


class SessionsListParams(SessionsPageQuery):
    """OpenClaw's ``sessions.list`` params (which of them filter here, which have no effect:
    docs/gateway-protocol.md, "OpenClaw's params"). Its limit has no upper bound: above a page's most it is
    clamped, as the page_limit says."""

    limit: Annotated[int, Field(ge=1)] = 100

    activeMinutes: Annotated[int, Field(ge=1)] | None = None
    spawnedBy: Annotated[str, Field(min_length=1, max_length=300)] | None = None
    pinned: bool | None = None
    group: Annotated[str, Field(max_length=100)] | None = None
    workspaceDir: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    requireLastInteraction: bool | None = None
    includeDerivedTitles: bool | None = None
    includeLastMessage: bool | None = None
    # Every key here is agent-scoped: no "global" or "unknown" session exists for these to add.
    includeGlobal: bool | None = None
    includeUnknown: bool | None = None
    # Filters on what no session has here (projects, creators and owners, boards): a row never matches them.
    projectId: NonEmptyText | None = None
    creatorId: NonEmptyText | None = None
    ownerId: NonEmptyText | None = None
    involvingProfileId: NonEmptyText | None = None
    profileRelation: ProfileRelation | None = None
    boardFace: Literal["chat", "dashboard"] | None = None
    hasBoard: bool | None = None
    # Accepted, no effect here (docs/gateway-protocol.md, "OpenClaw's params").
    activeOnly: bool | None = None
    sortBy: Literal["updatedAt", "lastInteractionAt", "activity"] | None = None
    excludeSubagents: bool | None = None
    excludeCron: bool | None = None
    excludeSystem: bool | None = None
    configuredAgentsOnly: bool | None = None
    includeActivitySummary: bool | None = None
    ownerFirst: bool | None = None
    involvingMe: bool | None = None
    includePeople: bool | None = None

    @property
    def selects_nothing(self) -> bool:
        """A filter on an attribute no session has here."""
        owned = (self.projectId, self.creatorId, self.ownerId, self.involvingProfileId, self.profileRelation)
        return any(value is not None for value in owned) or self.boardFace is not None or self.hasBoard is True


class SessionChanges(ExpectedRevision):
    """What ``sessions.patch`` may change (the JSON API's PATCH body)."""

    label: Label = None
    displayName: Label = None
    category: Category = None
    archived: bool | None = None
    pinned: bool | None = None
    model: ModelName = None

    def changes(self) -> dict:
        """The changes the caller set, without the guards (nor the fields OpenClaw's patch adds, which change
        nothing here)."""
        own = set(SessionChanges.model_fields) - set(ExpectedRevision.model_fields)
        return self.model_dump(exclude_unset=True, include=own)


NullableText = Annotated[str, Field(min_length=1, max_length=1000)] | None
# The fields and guards of sessions.patch that operator.write may send (OpenClaw's method-scope table, and this
# gateway's own displayName and expectedRevision); any other field, permissionMode "full" or sandboxMode need
# operator.admin.
PATCH_WRITE_SCOPE_FIELDS = frozenset(
    {
        "key",
        "agentId",
        "expectedSessionId",
        "expectedLifecycleRevision",
        "expectedPermissionMode",
        "expectedMarkedUnreadAt",
        "expectedRevision",
        "label",
        "displayName",
        "autoLabel",
        "icon",
        "color",
        "category",
        "boardFace",
        "boardPresentation",
        "pinned",
        "archived",
        "unread",
        "model",
        "agentRuntime",
        "thinkingLevel",
        "fastMode",
        "permissionMode",
    }
)


class SessionsPatchParams(SessionChanges, SessionRef):
    # Accepted, no effect here (docs/gateway-protocol.md, "OpenClaw's params"): OpenClaw's per-session runtime,
    # exec, sandbox, sidebar and tool-policy settings, which this gateway does not have.
    expectedPermissionMode: PermissionMode | None = None
    expectedSandboxMode: Literal["off"] | None = None
    expectedNativeRuntimeConsent: NullableText = None
    expectedToolOverrides: ToolOverrides | None = None
    expectedMarkedUnreadAt: Annotated[float, Field(ge=0)] | None = None
    autoLabel: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    icon: Annotated[str, Field(max_length=1000)] | None = None
    color: Annotated[str, Field(max_length=1000)] | None = None
    boardFace: Literal["chat", "dashboard"] | None = None
    boardPresentation: Literal["split", "expanded"] | None = None
    statusNote: Annotated[str, Field(max_length=120)] | None = None
    attention: Literal["hand", "key", "alert", "flag", "lock", "hourglass"] | None = None
    ttlMinutes: Annotated[int, Field(ge=1, le=120)] | None = None
    unread: bool | None = None
    contextWindow: NullableText = None
    thinkingLevel: NullableText = None
    fastMode: bool | Literal["auto"] | None = None
    toolOverrides: ToolOverrides | None = None
    verboseLevel: NullableText = None
    traceLevel: NullableText = None
    reasoningLevel: NullableText = None
    responseUsage: Literal["off", "tokens", "full", "on"] | None = None
    elevatedLevel: NullableText = None
    execHost: NullableText = None
    execSecurity: NullableText = None
    execAsk: NullableText = None
    execNode: NullableText = None
    permissionMode: PermissionMode | None = None
    sandboxMode: Literal["off"] | None = None
    nativeRuntimeConsent: NullableText = None
    agentRuntime: NullableText = None
    completionOwnerSessionKey: NullableText = None
    inheritedToolPolicyVersion: Literal[1] | None = None
    inheritedToolAllow: list[Annotated[str, Field(min_length=1)]] | None = None
    inheritedToolDeny: list[Annotated[str, Field(min_length=1)]] | None = None
    sendPolicy: Literal["allow", "deny"] | None = None
    groupActivation: Literal["mention", "always"] | None = None

    def sets_only_settings_not_kept(self) -> bool:
        """Whether this patch sets OpenClaw's settings only, none of which this gateway keeps."""
        kept = set(SessionChanges.model_fields) | set(SessionRef.model_fields)
        guards = {name for name in SessionsPatchParams.model_fields if name.startswith("expected")}
        return not self.changes() and bool(self.model_fields_set - kept - guards)

    def required_scope(self) -> str:
        """OpenClaw's scope of this patch: ``operator.write`` for the ordinary fields, ``operator.admin`` for the
        rest (exec, sandbox, tool policy, …), for ``permissionMode: "full"`` and for any ``sandboxMode``."""
        if self.permissionMode == "full" or "sandboxMode" in self.model_fields_set:
            return sc.ADMIN
        return sc.WRITE if self.model_fields_set <= PATCH_WRITE_SCOPE_FIELDS else sc.ADMIN


class ResetRequest(ExpectedRevision):
    """A reset: ``"new"`` (a new conversation the user asked for) or ``"reset"``, guarded like every mutation."""

    reason: Literal["new", "reset"] = "reset"


class SessionsResetParams(ResetRequest, SessionRef):
    pass


class DeleteGuards(ExpectedRevision):
    """``sessions.delete``'s guards: those of every guarded mutation, and OpenClaw's ``expectedSessionUpdatedAt``
    (the row's ``updatedAt`` in epoch ms, as the rows show it; two writes within one millisecond look alike to
    it, which ``expectedRevision`` tells apart)."""

    expectedSessionUpdatedAt: Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)] | None = None


# The params of a sessions.delete that operator.write may send (OpenClaw's method-scope table): only with
# ``archivedOnly``, which deletes an archived session only.
DELETE_WRITE_SCOPE_FIELDS = frozenset({"key", "agentId", "deleteTranscript", "expectedSessionId", "archivedOnly"})


class SessionsDeleteParams(DeleteGuards, SessionRef):
    deleteTranscript: bool | None = None
    archivedOnly: bool | None = None
    # Accepted, no effect here: OpenClaw's plugin lifecycle hooks, which this gateway does not have.
    emitLifecycleHooks: bool | None = None

    def required_scope(self) -> str:
        if self.archivedOnly is True and self.model_fields_set <= DELETE_WRITE_SCOPE_FIELDS:
            return sc.WRITE
        return sc.ADMIN


class ForkEntry(ClosedModel):
    """The transcript entry (a user message) a fork starts before."""

    entryId: str = Field(min_length=1)


class SessionsForkParams(ForkEntry):
    sessionKey: str = Field(min_length=1)
    agentId: str | None = None


class SessionsAdoptParams(ClosedModel):
    threadId: str = Field(min_length=1)
    harness: str = "native"
    agentId: str | None = None
    key: str | None = None
    label: Label = None


# --- chat.* and agent.wait --------------------------------------------------------------------


class ChatSendParams(ClosedModel):
    sessionKey: str = Field(min_length=1)
    message: MessageText
    idempotencyKey: IdempotencyKey
    agentId: str | None = None
    sessionId: str | None = None
    thinking: str | None = None
    timeoutMs: int | None = Field(default=None, ge=0)
    deliver: bool | None = None
    # OpenClaw's: the message goes to the model as written, a slash command included.
    suppressCommandInterpretation: bool | None = None
    # Accepted, no effect here (docs/gateway-protocol.md, "OpenClaw's params"): OpenClaw's channels and their
    # routing, queue modes, mentions, the Control UI's page context, goal intents, tool bindings, provenance and the
    # guards of settings this gateway does not have.
    mentions: Mentions | None = None
    workContext: dict[str, Any] | None = None
    intent: dict[str, Any] | None = None
    fastMode: bool | Literal["auto"] | None = None
    fastAutoOnSeconds: Annotated[int, Field(ge=1)] | None = None
    queueMode: Literal["steer", "followup", "collect", "interrupt"] | None = None
    originatingChannel: str | None = None
    originatingTo: str | None = None
    originatingAccountId: str | None = None
    originatingThreadId: str | None = None
    replyToId: NonEmptyText | None = None
    toolBindings: Annotated[dict[str, Any], Field(max_length=16)] | None = None
    systemInputProvenance: dict[str, Any] | None = None
    systemProvenanceReceipt: str | None = None
    expectedLeafEntryId: NonEmptyText | None = None
    expectedSessionRoutingContract: NonEmptyText | None = None
    expectedPermissionMode: PermissionMode | None = None
    expectedToolOverrides: ToolOverrides | None = None
    attachments: NoAttachments | None = None


class HistoryPage(ClosedModel):
    limit: HistoryLimit = 200


# OpenClaw's smallest byte budget of a history page.
MIN_HISTORY_BYTES = 1024
MAX_INPUT_RUN_IDS = 50


class ChatHistoryParams(HistoryPage):
    """OpenClaw's ``chat.history`` params (their effect here: sessions_app/history.py)."""

    sessionKey: str = Field(min_length=1)
    agentId: str | None = None
    maxChars: int | None = Field(default=None, ge=1, le=500_000)
    maxBytes: Annotated[int, Field(ge=MIN_HISTORY_BYTES)] | None = None
    offset: Annotated[int, Field(ge=0)] | None = None
    cursor: Annotated[str, Field(max_length=1000)] | None = None
    messageId: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    sessionId: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    inputRunIds: (
        Annotated[
            list[Annotated[str, Field(min_length=1, max_length=256)]], Field(min_length=1, max_length=MAX_INPUT_RUN_IDS)
        ]
        | None
    ) = None
    # Accepted, no effect here: this gateway keeps no pending inputs apart from its queued turns.
    pendingBefore: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _one_position(self) -> ChatHistoryParams:
        """OpenClaw's checks, with its messages, in its order."""
        if self.offset is not None and self.messageId is not None:
            raise ValueError("offset and messageId cannot be used together")
        if self.cursor is not None and (self.offset is not None or self.messageId is not None):
            raise ValueError("cursor cannot be used with offset or messageId")
        if self.sessionId is not None and self.messageId is None:
            raise ValueError("sessionId requires messageId")
        if self.inputRunIds is not None and len(set(self.inputRunIds)) != len(self.inputRunIds):
            raise ValueError("inputRunIds must be unique")
        return self


class AbortTarget(ClosedModel):
    """Which turn to stop; none: every queued and running turn of the session."""

    runId: str | None = Field(default=None, min_length=1)


class ChatAbortParams(AbortTarget):
    sessionKey: str = Field(min_length=1)
    agentId: str | None = None
    # OpenClaw keeps its side (``/btw``) turns running with it; every turn here is a main turn, so all stop.
    preserveSideRuns: bool | None = None


class AgentWaitParams(ClosedModel):
    runId: str = Field(min_length=1)
    timeoutMs: WaitTimeoutMs = 30_000


# --- agents, models and commands (the clients' start-up reads) -----------------------------------
# OpenClaw's params of agent.identity.get, models.list, models.authStatus, commands.list and chat.metadata; their
# NonEmptyString fields are bounded here like every text a caller sends. Agent ids and session keys are then
# checked by sessions_app/keys.py as everywhere else.

AgentIdText = Annotated[str, Field(min_length=1, max_length=200)]
SessionKeyText = Annotated[str, Field(min_length=1, max_length=300)]
# OpenClaw's saved model accounts (none exist here; accepted, with no effect).
AuthProfileId = Annotated[str, Field(min_length=1, max_length=256)]
ProviderText = Annotated[str, Field(min_length=1, max_length=200)]


class AgentIdentityParams(ClosedModel):
    agentId: AgentIdText | None = None
    # OpenClaw's schema lets this one be empty; an empty key means "none".
    sessionKey: Annotated[str, Field(max_length=300)] | None = None


class ModelsListParams(ClosedModel):
    agentId: AgentIdText | None = None
    sessionKey: SessionKeyText | None = None
    authProfileId: AuthProfileId | None = None
    provider: ProviderText | None = None
    includeDetails: bool | None = None
    includeProviderCapabilities: bool | None = None
    includeDefaultModels: bool | None = None
    preparedOnly: bool | None = None
    refresh: bool | None = None
    view: Literal["default", "configured", "provider-config", "all"] | None = None

    @model_validator(mode="after")
    def _one_mode_one_owner(self) -> ModelsListParams:
        if self.preparedOnly and self.refresh:
            raise ValueError("preparedOnly and refresh cannot be combined")
        if self.sessionKey is not None and self.authProfileId is not None:
            raise ValueError("sessionKey and authProfileId cannot be combined")
        return self


class ModelsAuthStatusParams(ClosedModel):
    refresh: bool | None = None
    # OpenClaw's schema lets this one be empty; an empty id means the default agent.
    agentId: Annotated[str, Field(max_length=200)] | None = None


class CommandsListParams(ClosedModel):
    sessionKey: SessionKeyText | None = None
    agentId: AgentIdText | None = None
    provider: ProviderText | None = None
    scope: Literal["text", "native", "both"] | None = None
    includeArgs: bool | None = None


class ChatMetadataParams(ClosedModel):
    agentId: AgentIdText | None = None
    authProfileId: AuthProfileId | None = None
    sessionKey: SessionKeyText | None = None

    @model_validator(mode="after")
    def _one_owner(self) -> ChatMetadataParams:
        if self.sessionKey is not None and self.authProfileId is not None:
            raise ValueError("sessionKey and authProfileId cannot be combined")
        return self


class MessageIn(ClosedModel):
    """The JSON API's ``chat.send`` (and, with ``wait``, ``agent.wait``) in one call."""

    message: MessageText
    idempotencyKey: IdempotencyKey | None = None
    wait: bool = True
    timeoutMs: WaitTimeoutMs = 30_000


# --- runs (the JSON API's view of chat turns) -------------------------------------------------

RunStatusName = Literal["queued", "running", "ok", "error", "aborted"]
RunsLimit = Annotated[int, Field(ge=1, le=500)]


class RunsListParams(ClosedModel):
    """Turns of every session, newest first; a page goes on from the previous page's ``nextCursor``."""

    status: RunStatusName | None = None
    sessionKey: Annotated[str, Field(min_length=1, max_length=300)] | None = None
    limit: RunsLimit = 50
    cursor: Cursor | None = None


class RunRef(ClosedModel):
    runId: IdempotencyKey


class RunRowOut(Schema):
    runId: str
    sessionKey: str
    status: RunStatusName
    createdAt: int
    startedAt: int | None
    endedAt: int | None
    error: str | None


class RunsPageOut(Schema):
    runs: list[RunRowOut]
    nextCursor: str | None


class RunOut(Schema):
    runId: str
    sessionKey: str
    status: RunStatusName
    startedAt: int | None
    endedAt: int | None
    error: str | None
    outputText: str | None


# --- what the sessions and chat operations answer -----------------------------------------------


class ForkSourceOut(Schema):
    sessionKey: str
    sessionId: str
    entryId: str | None = None


class WorktreeOut(Schema):
    id: str
    branch: str
    path: str


class SessionRowOut(OpenSchema):
    """A session as ``sessions.list`` and ``sessions.describe`` show it; unset fields are left out.
    Other apps add their fields (workers_app: ``placement``)."""

    key: str
    kind: str
    agentId: str
    sessionId: str
    lifecycleRevision: str
    revision: int
    updatedAt: int | None = None
    createdAt: int | None = None
    lastInteractionAt: int | None = None
    label: str | None = None
    displayName: str | None = None
    category: str | None = None
    archived: bool
    pinned: bool
    initializationPending: bool
    createdVia: str
    parentSessionKey: str | None = None
    status: str | None = None
    model: str | None = None
    modelProvider: str | None = None
    inputTokens: int | None = None
    outputTokens: int | None = None
    lastRunId: str | None = None
    forkSource: ForkSourceOut | None = None
    spawnedCwd: str | None = None
    worktree: WorktreeOut | None = None


class SessionDefaultsOut(Schema):
    defaultAgentId: str
    mainKey: str
    mainSessionKey: str
    modelProvider: str
    model: str


class SessionsListOut(Schema):
    ts: int
    count: int
    limitApplied: int
    offset: int
    nextOffset: int | None
    nextCursor: str | None
    hasMore: bool
    defaults: SessionDefaultsOut
    sessions: list[SessionRowOut]


class SessionDescribeOut(Schema):
    session: SessionRowOut


class ResolvedModelOut(Schema):
    modelProvider: str
    model: str


class SessionCreatedOut(Schema):
    ok: bool
    key: str
    sessionId: str
    entry: SessionRowOut
    runStarted: bool
    resolved: ResolvedModelOut
    worktree: WorktreeOut | None = None
    runId: str | None = None


class SessionAdoptedOut(Schema):
    ok: bool
    key: str
    sessionId: str
    entry: SessionRowOut


class SessionEntryOut(Schema):
    """``sessions.patch`` (with ``resolved``) and ``sessions.reset``."""

    ok: bool
    key: str
    entry: SessionRowOut
    resolved: ResolvedModelOut | None = None


class SessionDeletedOut(Schema):
    ok: bool
    key: str
    deleted: bool


class SessionForkOut(Schema):
    sessionKey: str
    editorText: str


class ChatHistoryOut(Schema):
    sessionKey: str
    sessionId: str
    messages: list[dict[str, Any]]
    totalMessages: int
    hasMore: bool
    # Where the next (older) page starts, counted back from the newest message; absent on the last page.
    nextOffset: int | None = None


class TerminalReplyOut(Schema):
    disposition: str
    text: str


class MessageOut(Schema):
    """``chat.send``'s acknowledgement (``wait: false``: ``started``, or for a repeated key ``in_flight``,
    ``ok`` or ``error`` with its ``summary``), or the turn's outcome as ``agent.wait`` gives it (``ok``,
    ``error``, or ``timeout`` when the wait ran out first)."""

    runId: str
    status: Literal["started", "in_flight", "ok", "error", "timeout"]
    summary: str | None = None
    startedAt: int | None = None
    endedAt: int | None = None
    outputText: str | None = None
    terminalReply: TerminalReplyOut | None = None
    error: str | None = None
    aborted: bool | None = None


class ChatAbortOut(Schema):
    ok: bool
    aborted: bool
    runIds: list[str]


# --- chat.startup, sessions.resolve, sessions.messages.* (OpenClaw's Control UI chat page) -------------------
# OpenClaw's ChatStartupParams, SessionsResolveParams and SessionsMessages(Un)subscribeParams, field for field.

ChatPageText = Annotated[str, Field(min_length=1, max_length=300)]
# chat.history's page: at most CHAT_HISTORY_MAX_ENTRIES (1000) messages; maxBytes at least 1024.
StartupLimit = Annotated[int, Field(ge=1, le=1000)]
StartupMaxBytes = Annotated[int, Field(ge=1024, le=MAX_SAFE_INTEGER)]
InputRunId = Annotated[str, Field(min_length=1, max_length=256)]
# A session label as OpenClaw bounds it (SESSION_LABEL_MAX_LENGTH); this gateway stores at most 200.
SessionLabelText = Annotated[str, Field(max_length=512)]

# The fields the short-link form of chat.startup may carry (OpenClaw's second union member).
_SHORT_LINK_FIELDS = frozenset({"shortId", "slugHint", "agentId", "limit", "maxBytes"})


class ChatStartupParams(ClosedModel):
    """Either chat.history's params (``sessionKey`` …) or a short chat link (``shortId`` + ``agentId``, with
    ``slugHint``, ``limit`` and ``maxBytes``): OpenClaw's union of the two, with one error for each wrong mix."""

    sessionKey: ChatPageText | None = None
    agentId: ChatPageText | None = None
    cursor: Annotated[str, Field(max_length=500)] | None = None
    limit: StartupLimit | None = None
    maxBytes: StartupMaxBytes | None = None
    offset: Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)] | None = None
    pendingBefore: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)] | None = None
    inputRunIds: Annotated[list[InputRunId], Field(min_length=1, max_length=50)] | None = None
    messageId: ChatPageText | None = None
    sessionId: ChatPageText | None = None
    maxChars: Annotated[int, Field(ge=1, le=500_000)] | None = None
    shortId: ChatPageText | None = None
    slugHint: ChatPageText | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ChatStartupParams:
        if self.shortId is not None:
            extra = sorted(self.model_fields_set - _SHORT_LINK_FIELDS)
            if extra:
                raise ValueError(
                    f"a shortId startup takes only shortId, slugHint, agentId, limit, maxBytes (not {', '.join(extra)})"
                )
            if self.agentId is None:
                raise ValueError("a shortId startup requires agentId")
            return self
        if self.sessionKey is None:
            raise ValueError("sessionKey or shortId is required")
        if self.slugHint is not None:
            raise ValueError("slugHint requires shortId")
        if self.inputRunIds is not None and len(set(self.inputRunIds)) != len(self.inputRunIds):
            raise ValueError("inputRunIds must be unique")
        return self


class SessionReference(ClosedModel):
    key: ChatPageText
    slug: ChatPageText | None = None


class SessionsResolveParams(ClosedModel):
    """One selector of ``key``, ``sessionId``, ``label``, ``shortId`` (8-32 hex characters of a key's trailing
    UUID) or ``reference``; ``allowMissing`` answers ``{ok: false}`` instead of an error when nothing matches."""

    key: ChatPageText | None = None
    sessionId: ChatPageText | None = None
    label: SessionLabelText | None = None
    reference: SessionReference | None = None
    shortId: ChatPageText | None = None
    slugHint: ChatPageText | None = None
    agentId: ChatPageText | None = None
    spawnedBy: ChatPageText | None = None
    includeGlobal: bool | None = None
    includeUnknown: bool | None = None
    allowMissing: bool | None = None


class SessionsMessagesUnsubscribeParams(ClosedModel):
    key: ChatPageText
    agentId: ChatPageText | None = None


class SessionsMessagesSubscribeParams(SessionsMessagesUnsubscribeParams):
    # OpenClaw's schema: only ``true`` (an opt-in), never false.
    includeApprovals: Literal[True] | None = None
