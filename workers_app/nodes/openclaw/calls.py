"""OpenClaw's private node commands, sent verbatim: its strict schemas refuse any key they do not define (the
project dialect's ``version`` among them), and its node never lists the commands it answers.

Codes a node answers with (node-worker-dialect.md §1.11, §3.6) become operator text here, once.
"""

from __future__ import annotations

from typing import Any

from gateway.invoke import InvokeTarget, NodeCommandFailed, invoke_private

from ...providers import WorkerProviderError
from ..calls import COMMAND_TIMEOUT_MS, not_connected, run_on_gateway_loop

# What the node answers when its own supervisor failed; OpenClaw masks the cause behind it.
MASKED_UNAVAILABLE = "node worker supervisor command failed"
# Codes the gateway's transport gives when the connection is gone or no longer the one that was asked.
CONNECTION_LOST_CODES = frozenset({"NOT_CONNECTED", "DISCONNECTED", "PAIRING_CHANGED", "ROUTE_CHANGED"})


def call_openclaw(
    node_id: str,
    command: str,
    params: dict[str, Any],
    *,
    timeout_ms: int = COMMAND_TIMEOUT_MS,
    idempotency_key: str | None = None,
) -> Any:
    """``command`` on the node's live connection, from synchronous code; raises :class:`NodeCommandFailed`."""
    return run_on_gateway_loop(
        lambda: invoke_openclaw(node_id, command, params, timeout_ms=timeout_ms, idempotency_key=idempotency_key)
    )


async def invoke_openclaw(
    node_id: str,
    command: str,
    params: dict[str, Any],
    *,
    timeout_ms: int,
    idempotency_key: str | None = None,
    target: InvokeTarget | None = None,
) -> Any:
    """``command`` on the node's live connection, on the gateway's loop; raises :class:`NodeCommandFailed`."""
    return await invoke_private(
        node_id,
        command,
        params,
        timeout_ms=timeout_ms,
        target=target,
        declared_worker_host=True,
        idempotency_key=idempotency_key,
    )


def openclaw_failure(node_id: str, failure: NodeCommandFailed, what: str) -> WorkerProviderError:
    """An OpenClaw node's failure as dispatch and teardown report it: ``<what>: <the node's message>``, the
    connection's loss as the not-connected message, and a masked supervisor failure as itself."""
    if failure.code in CONNECTION_LOST_CODES:
        return WorkerProviderError(not_connected(node_id))
    message = " ".join(failure.message.split())[:500]
    if failure.code == "UNAVAILABLE" and not message:
        message = MASKED_UNAVAILABLE
    if failure.code == "INVALID_REQUEST" and not message.startswith("INVALID_REQUEST"):
        message = f"INVALID_REQUEST: {message}"
    return WorkerProviderError(f"{what}: {message} ({failure.code})")
