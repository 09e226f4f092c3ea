"""Parameter shapes of the worker operations (workers.md §2.3, §4), shared by the RPC and the JSON API."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from openclaw_site.gateway.protocol import ClosedModel

Generation = Annotated[int, Field(ge=0, le=2**53 - 1)]
OwnerEpoch = Annotated[int, Field(ge=1, le=2**53 - 1)]
ProfileId = Annotated[str, Field(min_length=1, max_length=128)]
DeviceId = Annotated[str, Field(min_length=1, max_length=128)]
EnvironmentId = Annotated[str, Field(min_length=1, max_length=128)]


class SessionsDispatchParams(ClosedModel):
    key: str = Field(min_length=1)
    agentId: str | None = None
    profileId: ProfileId | None = None
    deviceId: DeviceId | None = None
    autoDevice: Literal[True] | None = None
    machineClass: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    os: Annotated[str, Field(min_length=1, max_length=64)] | None = None

    @model_validator(mode="after")
    def _one_target(self) -> SessionsDispatchParams:
        # autoDevice mixed with a target is the handler's refusal (OpenClaw answers it before validating
        # params, with the bare message); deviceId with profileId fails the schema's oneOf.
        if self.deviceId is not None and self.profileId is not None:
            raise ValueError("choose exactly one dispatch target: autoDevice, deviceId, or profileId")
        if self.machineClass is not None and self.profileId is None:
            raise ValueError("machineClass needs a profileId target")
        return self


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


class SessionsMoveParams(ClosedModel):
    key: str = Field(min_length=1)
    agentId: str | None = None
    expected: ExpectedSource
    target: Annotated[GatewayTarget | ProfileTarget | DeviceTarget, Field(discriminator="kind")]
    abandonSource: Literal[True] | None = None

    @model_validator(mode="after")
    def _abandon_only_to_gateway(self) -> SessionsMoveParams:
        if self.abandonSource and self.target.kind != "gateway":
            raise ValueError("abandonSource is only valid with the gateway target")
        return self


class RecoverToGateway(ClosedModel):
    expectedGeneration: Generation


class SessionsReclaimParams(ClosedModel):
    key: str = Field(min_length=1)
    agentId: str | None = None
    recoverToGateway: RecoverToGateway | None = None


class EnvironmentsListParams(ClosedModel):
    runtimeId: Annotated[str, Field(max_length=128)] | None = None
    projection: Literal["profiles"] | None = None
    includeDesktopSetup: bool | None = None
    includePreparedDetails: bool | None = None


class EnvironmentsStatusParams(ClosedModel):
    environmentId: EnvironmentId
    includePreparedDetails: bool | None = None


class EnvironmentsDestroyParams(ClosedModel):
    environmentId: EnvironmentId
    force: bool | None = None


class RunnerInventoryParams(ClosedModel):
    """Taken whole and checked by ``workers_app.inventory`` (its refusal is the reference's one message,
    ``invalid node runner inventory``); the frame decoder has already bounded its size and depth."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class InferenceMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=1_000_000)


class InferenceRequest(BaseModel):
    """The body of a worker's model call (an OpenAI chat-completions request; other fields are ignored)."""

    model: str = Field(default="", max_length=200)
    messages: list[InferenceMessage] = Field(min_length=1, max_length=10_000)
    stream: bool = True
