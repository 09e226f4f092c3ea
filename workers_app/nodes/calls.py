"""Calling a node's private worker commands from synchronous code (dispatch stages, turns, teardown).

The call itself is the gateway core's :func:`~gateway.invoke.invoke_private`; it runs
where the channel layer lives (:mod:`gateway.publisher`): on a gateway process the
gateway's event loop, whichever thread asks (the in-memory layer's queues belong to it); in a Celery
worker the one long-lived loop that also publishes its events (the Redis layer receives on one loop).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway import publisher
from gateway.background import release_database_connections
from gateway.invoke import NodeCommandFailed, ProgressCallback, invoke_private

# Commands answer quickly unless they move bytes or run a turn; those pass their own timeout.
COMMAND_TIMEOUT_MS = 30_000
PROTOCOL_VERSION = 1


def not_connected(device_id: str) -> str:
    """Why a command (or a dispatch, a teardown) could not reach the node."""
    return f"device worker node is not connected: {device_id}; reconnect it before retrying"


def run_on_gateway_loop[T](make: Callable[[], Awaitable[T]]) -> T:
    """Run the coroutine ``make()`` to completion from synchronous code and return its result."""
    release_database_connections()
    return publisher.submit(make).result()


def call_node(
    node_id: str,
    command: str,
    params: dict[str, Any],
    *,
    timeout_ms: int = COMMAND_TIMEOUT_MS,
    on_progress: ProgressCallback | None = None,
) -> Any:
    """``command`` on the node's live connection; raises :class:`NodeCommandFailed`."""
    return run_on_gateway_loop(
        lambda: invoke_private(
            node_id, command, {"version": PROTOCOL_VERSION, **params}, timeout_ms=timeout_ms, on_progress=on_progress
        )
    )


__all__ = [
    "COMMAND_TIMEOUT_MS",
    "NodeCommandFailed",
    "call_node",
    "not_connected",
    "release_database_connections",
    "run_on_gateway_loop",
]
