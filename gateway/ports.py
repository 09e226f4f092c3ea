"""What the gateway core asks of the app that owns devices: one port, provided once at start.

The core speaks the protocol, runs the socket and keeps the records of gateway processes and their
connections. Who may connect (credentials, device proof, pairing, device tokens) and what a
connection's coming and going records on its device belong to ``devices_app``, which imports the core
and so cannot be imported by it. ``DevicesConfig.ready()`` provides the :class:`ConnectionAuthority`;
a grep for ``provide_connection_authority`` answers "who fills this?".
"""

from __future__ import annotations

from typing import Protocol

from .handshake import ConnectContext, ConnectOutcome
from .protocol import ConnectParams


class ConnectionAuthority(Protocol):
    def authenticate_connect(
        self, params: ConnectParams, ctx: ConnectContext, *, then: tuple[str, dict] | None = None
    ) -> ConnectOutcome:
        """Decide a connect and register its connection, or raise ``HandshakeRejected``.

        ``then`` (SQL text, named parameters): reads to send with the registration where it is one
        statement; their rows come back in :attr:`ConnectOutcome.then_rows`."""

    def connection_unregister(self, *, conn_id: str) -> bool:
        """Forget a closed connection (and record the disconnect on its device); whether it was known."""

    def process_unregister(self, *, boot_id: str) -> None:
        """Forget a gateway process that stopped, with its connections."""


_authority: ConnectionAuthority | None = None


def provide_connection_authority(authority: ConnectionAuthority) -> None:
    global _authority
    if _authority is not None and _authority is not authority:
        raise RuntimeError("the gateway's connection authority is provided once")
    _authority = authority


def connection_authority() -> ConnectionAuthority:
    if _authority is None:
        raise RuntimeError("no connection authority provided (devices_app is not installed or not ready)")
    return _authority
