"""Wire shapes of the gateway protocol: frames, connect params, constants.

All objects are closed (``extra="forbid"``), as in OpenClaw's TypeBox schemas, so a misspelt field
is an error rather than silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from openclaw_client import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION

SERVER_VERSION = "2026.9.6-django"

__all__ = [
    "MIN_PROTOCOL_VERSION",
    "PROTOCOL_VERSION",
    "SERVER_VERSION",
    "ClosedModel",
    "ConnectParams",
    "RequestFrame",
    "format_validation_error",
]

CLIENT_IDS = (
    "webchat-ui",
    "openclaw-control-ui",
    "openclaw-browser-copilot",
    "openclaw-tui",
    "webchat",
    "cli",
    "gateway-client",
    "openclaw-macos",
    "openclaw-linux",
    "openclaw-ios",
    "openclaw-watchos",
    "openclaw-android",
    "node-host",
    "openclaw-worker",
    "test",
    "fingerprint",
    "openclaw-probe",
)
CLIENT_MODES = ("webchat", "cli", "ui", "backend", "node", "worker", "probe", "test")


class ClosedModel(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)


NonEmptyStr = Field(min_length=1)


class RequestFrame(ClosedModel):
    type: Literal["req"]
    id: str = Field(min_length=1)
    method: str = Field(min_length=1)
    params: Any = None


class CancelFrame(ClosedModel):
    type: Literal["cancel"]
    id: str = Field(min_length=1)


class ClientInfo(ClosedModel):
    id: str
    displayName: str | None = None
    version: str = Field(min_length=1)
    platform: str = Field(min_length=1)
    deviceFamily: str | None = None
    modelIdentifier: str | None = None
    mode: str
    instanceId: str | None = None
    buildId: str | None = None
    timeZone: str | None = None

    @field_validator("id")
    @classmethod
    def _known_client_id(cls, value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in CLIENT_IDS:
            raise ValueError(f"must be one of: {', '.join(CLIENT_IDS)}")
        return lowered

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in CLIENT_MODES:
            raise ValueError(f"must be one of: {', '.join(CLIENT_MODES)}")
        return lowered


class DeviceProof(ClosedModel):
    id: str = Field(min_length=1)
    publicKey: str = Field(min_length=1)
    signature: str = Field(min_length=1)
    signedAt: int = Field(ge=0)
    nonce: str | None = None


class ConnectAuth(ClosedModel):
    token: str | None = Field(default=None, max_length=4096)
    bootstrapToken: str | None = Field(default=None, max_length=256)
    deviceToken: str | None = Field(default=None, max_length=256)
    password: str | None = Field(default=None, max_length=4096)
    approvalRuntimeToken: str | None = Field(default=None, max_length=2048)
    agentRuntimeIdentityToken: str | None = Field(default=None, max_length=2048)


class ConnectParams(ClosedModel):
    minProtocol: int = Field(ge=1)
    maxProtocol: int = Field(ge=1)
    client: ClientInfo
    caps: list[str] = Field(default_factory=list)
    commands: list[str] | None = None
    permissions: dict[str, bool] | None = None
    pathEnv: str | None = None
    role: str | None = None
    scopes: list[str] | None = None
    device: DeviceProof | None = None
    auth: ConnectAuth | None = None
    locale: str | None = None
    userAgent: str | None = None


def _error_path(loc: tuple[Any, ...]) -> str:
    return "/" + "/".join(str(part) for part in loc) if loc else "/"


def format_validation_error(error: ValidationError) -> str:
    """Readable one-line summary: ``at /client/id: must be one of …; at /minProtocol: required``."""
    parts = []
    for item in error.errors(include_url=False):
        kind = item.get("type", "")
        if kind == "missing":
            message = "must have required property"
        elif kind == "extra_forbidden":
            message = "unexpected property"
        else:
            message = item.get("msg", "invalid").removeprefix("Value error, ")
        parts.append(f"at {_error_path(tuple(item.get('loc', ())))}: {message}")
    return "; ".join(parts) or "invalid"


def negotiate_protocol(min_protocol: int, max_protocol: int) -> int | None:
    """Highest version both sides speak, or None."""
    candidate = min(max_protocol, PROTOCOL_VERSION)
    if candidate < max(min_protocol, MIN_PROTOCOL_VERSION):
        return None
    return candidate
