"""Parameter shapes of the worker operations (workers.md §2.3, §4), shared by the RPC and the JSON API."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from gateway.protocol import ClosedModel
from gateway.schemas import OpenSchema
from openclaw_client.agent.openai_stream import MAX_ARGUMENTS_BYTES, MAX_ID_CHARS, MAX_NAME_CHARS, MAX_TOOL_CALLS
from sessions_app.schemas import SessionRef

Generation = Annotated[int, Field(ge=0, le=2**53 - 1)]
OwnerEpoch = Annotated[int, Field(ge=1, le=2**53 - 1)]
ProfileId = Annotated[str, Field(min_length=1, max_length=128)]
DeviceId = Annotated[str, Field(min_length=1, max_length=128)]
EnvironmentId = Annotated[str, Field(min_length=1, max_length=128)]


class DispatchTarget(ClosedModel):
    """Where ``sessions.dispatch`` places a session (the JSON API's dispatch body)."""

    profileId: ProfileId | None = None
    deviceId: DeviceId | None = None
    autoDevice: Literal[True] | None = None
    machineClass: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    os: Annotated[str, Field(min_length=1, max_length=64)] | None = None

    @model_validator(mode="after")
    def _one_target(self) -> DispatchTarget:
        # autoDevice mixed with a target is the handler's refusal (OpenClaw answers it before validating
        # params, with the bare message); deviceId with profileId fails the schema's oneOf.
        if self.deviceId is not None and self.profileId is not None:
            raise ValueError("choose exactly one dispatch target: autoDevice, deviceId, or profileId")
        if self.machineClass is not None and self.profileId is None:
            raise ValueError("machineClass needs a profileId target")
        return self


class SessionsDispatchParams(DispatchTarget, SessionRef):
    pass


class ExpectedSource(ClosedModel):
    generation: Generation
    environmentId: EnvironmentId
    ownerEpoch: OwnerEpoch


class GatewayTarget(ClosedModel):
    kind: Literal["gateway"]


class ProfileTarget(ClosedModel):
    kind: Literal["profile"]
    profileId: ProfileId
    machineClass: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    os: Annotated[str, Field(min_length=1, max_length=64)] | None = None


class DeviceTarget(ClosedModel):
    kind: Literal["device"]
    deviceId: DeviceId


class MoveRequest(ClosedModel):
    """``sessions.move`` of the placement the caller saw (the JSON API's move body)."""

    expected: ExpectedSource
    target: Annotated[GatewayTarget | ProfileTarget | DeviceTarget, Field(discriminator="kind")]
    abandonSource: Literal[True] | None = None

    @model_validator(mode="after")
    def _abandon_only_to_gateway(self) -> MoveRequest:
        if self.abandonSource and self.target.kind != "gateway":
            raise ValueError("abandonSource is only valid with the gateway target")
        return self


class SessionsMoveParams(MoveRequest, SessionRef):
    pass


class RecoverToGateway(ClosedModel):
    expectedGeneration: Generation


class ReclaimOptions(ClosedModel):
    """``sessions.reclaim``: stop the worker; with ``recoverToGateway``, continue that failed generation on
    the gateway (the JSON API's reclaim body)."""

    recoverToGateway: RecoverToGateway | None = None


class SessionsReclaimParams(ReclaimOptions, SessionRef):
    pass


class EnvironmentsListParams(ClosedModel):
    runtimeId: Annotated[str, Field(max_length=128)] | None = None
    projection: Literal["profiles"] | None = None
    includeDesktopSetup: bool | None = None
    includePreparedDetails: bool | None = None


class EnvironmentRef(ClosedModel):
    environmentId: EnvironmentId


class PreparedDetails(ClosedModel):
    includePreparedDetails: bool | None = None


class EnvironmentsStatusParams(PreparedDetails, EnvironmentRef):
    pass


class DestroyOptions(ClosedModel):
    """``force``: destroy even while a session is attached (its placement fails, its work is given up)."""

    force: bool | None = None


class EnvironmentsDestroyParams(DestroyOptions, EnvironmentRef):
    pass


# --- the JSON API's placement list (no gateway method lists placements) ---------------------------

PlacementStateName = Literal[
    "local",
    "requested",
    "provisioning",
    "syncing",
    "starting",
    "active",
    "draining",
    "reconciling",
    "reclaimed",
    "failed",
]


class PlacementsListParams(ClosedModel):
    """Placements, most recently changed first; a page goes on from the previous page's ``nextCursor``."""

    state: PlacementStateName | None = None
    environmentId: EnvironmentId | None = None
    limit: Annotated[int, Field(ge=1, le=500)] = 100
    cursor: Annotated[str, Field(min_length=1, max_length=500)] | None = None


# --- what the placement and environment operations answer ------------------------------------------


class PlacementOut(Schema):
    """The public placement projection (workers.md §4.4): which fields show depends on the state; a
    session never dispatched shows ``{"state": "local"}``."""

    state: PlacementStateName
    generation: int | None = None
    createdAtMs: int | None = None
    updatedAtMs: int | None = None
    stateChangedAtMs: int | None = None
    environmentId: str | None = None
    activeOwnerEpoch: int | None = None
    workerBundleHash: str | None = None
    workspaceBaseManifestRef: str | None = None
    remoteWorkspaceDir: str | None = None
    lastTranscriptAckCursor: int | None = None
    lastLiveEventAckCursor: int | None = None
    terminalReason: str | None = None
    terminalAtMs: int | None = None
    recoveryError: str | None = None
    recoveryAction: Literal["restart", "stop-first"] | None = None
    providerId: str | None = None
    profileId: str | None = None


class PlacementResultOut(Schema):
    """What ``sessions.dispatch``, ``sessions.move`` and ``sessions.reclaim`` answer."""

    ok: bool
    key: str
    sessionId: str
    placement: PlacementOut


class PlacementRowOut(Schema):
    key: str
    sessionId: str
    placement: PlacementOut


class PlacementsPageOut(Schema):
    placements: list[PlacementRowOut]
    nextCursor: str | None


class WorkerFactsOut(Schema):
    profileId: str
    providerId: str
    state: str
    ageMs: int
    attachedSessionIds: list[str]
    tunnelStatus: str
    leaseId: str | None = None
    nodeId: str | None = None
    destroyRequestedAtMs: int | None = None
    idleMs: int | None = None
    error: str | None = None


class EnvironmentOut(OpenSchema):
    """A row of ``environments.list`` (workers.md §2.3): a worker environment, or a paired node
    (``id: "node:<nodeId>"``, with its node fields)."""

    id: str
    type: Literal["worker", "node"]
    status: Literal["starting", "available", "stopping", "unavailable", "error"]
    trust: Literal["persistent", "disposable"] | None = None
    worker: WorkerFactsOut | None = None
    label: str | None = None
    sessionHost: bool | None = None


class ProfileOut(Schema):
    id: str
    providerId: str


class EnvironmentsListOut(Schema):
    environments: list[EnvironmentOut]
    profiles: list[ProfileOut] | None = None


class EnvironmentDestroyOut(Schema):
    ok: bool
    environment: EnvironmentOut


class RunnerInventoryParams(ClosedModel):
    """Taken whole and checked by ``workers_app.nodes.inventory`` (its refusal is the reference's one message,
    ``invalid node runner inventory``); the frame decoder has already bounded its size and depth."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


# The tools a worker may offer the model in one call (each entry's JSON text bounded on its own).
MAX_INFERENCE_TOOLS = 64
MAX_TOOL_ENTRY_BYTES = 64 * 1024


class InferenceToolFunction(BaseModel):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    arguments: str = Field(max_length=MAX_ARGUMENTS_BYTES)


class InferenceToolCall(BaseModel):
    """A call an earlier reply made (the bounds are the ones the reply folder holds a model's calls to)."""

    id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    type: Literal["function"] = "function"
    function: InferenceToolFunction


class InferenceMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    # null only next to tool_calls (an assistant message of calls only, as the API returns it).
    content: str | None = Field(max_length=1_000_000)
    tool_calls: list[InferenceToolCall] | None = Field(default=None, max_length=MAX_TOOL_CALLS)
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)
    name: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)

    @model_validator(mode="after")
    def tool_fields_fit_the_role(self) -> InferenceMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message has tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message, and only a tool message, has a tool_call_id")
        if self.content is None and not self.tool_calls:
            raise ValueError("content may be null only next to tool_calls")
        return self


def _tool_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A chat-completions ``tools`` entry, checked where a provider would refuse it and kept as sent."""
    function = entry.get("function")
    if entry.get("type") != "function" or not isinstance(function, dict):
        raise ValueError('a tool is {"type": "function", "function": {name, description?, parameters?}}')
    name = function.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS:
        raise ValueError(f"a tool's function name is a string of 1 to {MAX_NAME_CHARS} characters")
    if not isinstance(function.get("parameters", {}), dict):
        raise ValueError("a tool's function parameters are a JSON Schema object")
    if len(json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode()) > MAX_TOOL_ENTRY_BYTES:
        raise ValueError(f"a tool is at most {MAX_TOOL_ENTRY_BYTES} bytes of JSON")
    return entry


class InferenceRequest(BaseModel):
    """The body of a worker's model call (an OpenAI chat-completions request; other fields are ignored)."""

    model: str = Field(default="", max_length=200)
    messages: list[InferenceMessage] = Field(min_length=1, max_length=10_000)
    tools: list[Annotated[dict[str, Any], AfterValidator(_tool_entry)]] | None = Field(
        default=None, max_length=MAX_INFERENCE_TOOLS
    )
    stream: bool = True
