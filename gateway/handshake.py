"""The ``connect`` request: validation and protocol negotiation, and what a decided connect carries.

:func:`parse_connect` is pure and runs on the event loop. Authentication, device proof and pairing are
the connection authority's (``gateway.ports``, provided by devices_app), which the connect's one database
hop asks. Both raise :class:`HandshakeRejected`, which carries the error ``res`` and the close code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from . import scopes as sc
from .auth import is_loopback
from .exceptions import GatewayError, HandshakeRejected, InvalidRequest
from .protocol import PROTOCOL_VERSION, ConnectParams, RequestFrame, format_validation_error, negotiate_protocol


class FirstFrameInvalid(Exception):
    """Not a request frame at all: closed without a response."""


def parse_connect(raw: Any) -> tuple[str, ConnectParams, int]:
    """Validate the first frame. Returns (request id, params, negotiated protocol)."""
    try:
        frame = RequestFrame.model_validate(raw)
    except ValidationError:
        raise FirstFrameInvalid() from None
    if frame.method != "connect":
        raise HandshakeRejected(InvalidRequest("invalid handshake: first request must be connect"))
    try:
        params = ConnectParams.model_validate(frame.params)
    except ValidationError as exc:
        raise HandshakeRejected(InvalidRequest(f"invalid connect params: {format_validation_error(exc)}")) from None
    protocol = negotiate_protocol(params.minProtocol, params.maxProtocol)
    if protocol is None:
        raise HandshakeRejected(
            InvalidRequest(
                "protocol mismatch",
                details={"code": "PROTOCOL_MISMATCH", "expectedProtocol": PROTOCOL_VERSION},
            ),
            close_code=1002,
        )
    if params.role is not None and params.role not in sc.ROLES:
        raise HandshakeRejected(InvalidRequest("invalid role"))
    return frame.id, params, protocol


def failure_reason(error: GatewayError) -> str:
    """A refused connect's reason as a metrics label: the detail code the client reads (``AUTH_TOKEN_MISMATCH``,
    ``PAIRING_REQUIRED``, ``PROTOCOL_MISMATCH``, …), else the error code; both are constants of this code base."""
    detail = (error.details or {}).get("code")
    return (detail if isinstance(detail, str) and detail else error.code).lower()


@dataclass(frozen=True)
class ConnectContext:
    conn_id: str
    boot_id: str
    channel_name: str
    nonce: str
    remote_ip: str | None
    # The upgrade request carried proxy headers (Forwarded, X-Real-IP, X-Forwarded-*) / an Origin.
    forwarded: bool = False
    browser_origin: bool = False

    @property
    def direct_local(self) -> bool:
        """A client on this machine talking to us directly: loopback peer, no proxy, no browser."""
        return is_loopback(self.remote_ip) and not self.forwarded and not self.browser_origin


# (client.id, client.mode) of OpenClaw's local first-party clients that keep their requested scopes
# without a device identity when they prove the shared secret over a direct loopback connection:
# the gateway's own backend self-connections, and the CLI (OpenClaw 2026.9.6 preserves its scopes
# too; its `gateway call` connects without a device).
LOCAL_SHARED_SECRET_CLIENTS = frozenset({("gateway-client", "backend"), ("cli", "cli")})


def keeps_unbound_scopes(params: ConnectParams, ctx: ConnectContext, auth_method: str) -> bool:
    """Whether a device-less operator keeps the scopes it asked for (else they are cleared to []).

    Scopes a client declares without a device identity are bound to nothing; OpenClaw clears
    them except in explicit bypass modes (reference protocol.md §2.3). This gateway has no Control
    UI or trusted-proxy mode, so the bypasses left are the loopback ones above.
    """
    return (
        (params.client.id, params.client.mode) in LOCAL_SHARED_SECRET_CLIENTS
        and auth_method in ("token", "password")
        and ctx.direct_local
    )


@dataclass(frozen=True)
class ConnectOutcome:
    role: str
    scopes: list[str]
    auth_method: str
    device_id: str | None
    node_id: str | None
    commands: list[str]
    device_token: str | None
    device_token_issued_at_ms: int | None
    # The rows of the reads sent with the registration (``authenticate_connect``'s ``then``), when they were.
    then_rows: list[list[tuple]] | None = None
