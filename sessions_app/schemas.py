"""Parameter and response shapes of the sessions operations, shared by the RPC and the JSON API.

Each operation has one schema; the JSON API takes the parts that are not in its URL (the session
key, the agent) from the same base classes. Every limit on what a caller sends is declared here
once, with the column it protects in mind, so bad input is refused before any write.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import Field, model_validator

from gateway.protocol import DEFAULT_MAX_FRAME_BYTES, MAX_SAFE_INTEGER, ClosedModel, NulCheckedByService
from gateway.schemas import OpenSchema

WORKTREE_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
MAX_WAIT_MS = 24 * 3600 * 1000

# A run's id is its idempotency key (``Run.run_id``, 200 characters).
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=200)]
Label = Annotated[str | None, Field(max_length=200)]
Category = Annotated[str | None, Field(max_length=100)]
ModelName = Annotated[str | None, Field(max_length=200)]
ListLimit = Annotated[int, Field(ge=1, le=1000)]
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


class SessionRef(ClosedModel):
    """A session named by key (``agent:<agent>:<rest>``, or a bare key under ``agentId``)."""

    key: str = Field(min_length=1)
    agentId: str | None = None


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


# A cursor is what a page's ``nextCursor`` said, passed back unchanged.
Cursor = Annotated[str, Field(min_length=1, max_length=500)]


class SessionsListParams(ClosedModel):
    """OpenClaw's ``limit``/``offset`` pages, and (this gateway's addition) ``cursor``: the previous page's
    ``nextCursor``, whose page costs the same at any depth (an offset makes the database skip every row
    before it)."""

    limit: ListLimit = 100
    offset: int = Field(default=0, ge=0)
    cursor: Cursor | None = None
    agentId: str | None = None
    label: str | None = None
    search: str | None = Field(default=None, max_length=200)
    archived: bool | Literal["all"] = False


class SessionChanges(ExpectedRevision):
    """What ``sessions.patch`` may change (the JSON API's PATCH body)."""

    label: Label = None
    displayName: Label = None
    category: Category = None
    archived: bool | None = None
    pinned: bool | None = None
    model: ModelName = None

    def changes(self) -> dict:
        """The fields the caller set, without the guards."""
        return self.model_dump(exclude_unset=True, exclude={"key", "agentId", *ExpectedRevision.model_fields})


class SessionsPatchParams(SessionChanges, SessionRef):
    pass


class SessionsResetParams(ExpectedRevision, SessionRef):
    reason: Literal["new", "reset"] = "reset"


class DeleteGuards(ExpectedRevision):
    """``sessions.delete``'s guards: those of every guarded mutation, and OpenClaw's ``expectedSessionUpdatedAt``
    (the row's ``updatedAt`` in epoch ms, as the rows show it; two writes within one millisecond look alike to
    it, which ``expectedRevision`` tells apart)."""

    expectedSessionUpdatedAt: Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)] | None = None


class SessionsDeleteParams(DeleteGuards, SessionRef):
    deleteTranscript: bool | None = None


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


class HistoryPage(ClosedModel):
    limit: HistoryLimit = 200


class ChatHistoryParams(HistoryPage):
    sessionKey: str = Field(min_length=1)
    agentId: str | None = None
    maxChars: int | None = Field(default=None, ge=1)


class AbortTarget(ClosedModel):
    """Which turn to stop; none: every queued and running turn of the session."""

    runId: str | None = Field(default=None, min_length=1)


class ChatAbortParams(AbortTarget):
    sessionKey: str = Field(min_length=1)
    agentId: str | None = None


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

NonEmptyText = Annotated[str, Field(min_length=1, max_length=300)]
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

    sessionKey: NonEmptyText | None = None
    agentId: NonEmptyText | None = None
    cursor: Annotated[str, Field(max_length=500)] | None = None
    limit: StartupLimit | None = None
    maxBytes: StartupMaxBytes | None = None
    offset: Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)] | None = None
    pendingBefore: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)] | None = None
    inputRunIds: Annotated[list[InputRunId], Field(min_length=1, max_length=50)] | None = None
    messageId: NonEmptyText | None = None
    sessionId: NonEmptyText | None = None
    maxChars: Annotated[int, Field(ge=1, le=500_000)] | None = None
    shortId: NonEmptyText | None = None
    slugHint: NonEmptyText | None = None

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
    key: NonEmptyText
    slug: NonEmptyText | None = None


class SessionsResolveParams(ClosedModel):
    """One selector of ``key``, ``sessionId``, ``label``, ``shortId`` (8-32 hex characters of a key's trailing
    UUID) or ``reference``; ``allowMissing`` answers ``{ok: false}`` instead of an error when nothing matches."""

    key: NonEmptyText | None = None
    sessionId: NonEmptyText | None = None
    label: SessionLabelText | None = None
    reference: SessionReference | None = None
    shortId: NonEmptyText | None = None
    slugHint: NonEmptyText | None = None
    agentId: NonEmptyText | None = None
    spawnedBy: NonEmptyText | None = None
    includeGlobal: bool | None = None
    includeUnknown: bool | None = None
    allowMissing: bool | None = None


class SessionsMessagesUnsubscribeParams(ClosedModel):
    key: NonEmptyText
    agentId: NonEmptyText | None = None


class SessionsMessagesSubscribeParams(SessionsMessagesUnsubscribeParams):
    # OpenClaw's schema: only ``true`` (an opt-in), never false.
    includeApprovals: Literal[True] | None = None
