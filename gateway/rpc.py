"""Gateway-core methods: health, status, system-presence, config.get, and routing ``node.invoke`` to a node and its
result back."""

from __future__ import annotations

import logging
import os

from . import health, invoke, selectors, state, task_consumers
from . import scopes as sc
from .context import RpcContext
from .effective_config import config_snapshot
from .exceptions import FrameRejected, InvalidRequest, internal_error
from .protocol import SERVER_VERSION, decode_frame
from .registry import registry
from .schemas import NodeInvokeError, NodeInvokeParams, NodeInvokeResultParams, StatusParams

logger = logging.getLogger(__name__)

method = registry.method


# --- health and status ----------------------------------------------------------------------


@method("health", scope=None)
async def health_rpc(ctx: RpcContext, params) -> dict:
    try:
        probe = await health.health_snapshot()
    except Exception:
        # The database error's text names hosts and SQL: the log keeps it under the reference.
        raise internal_error(logger, "health probe") from None
    # OpenClaw's clients show the payload as it is (its health object is open): one field more for who runs turns.
    # Its state is the latest check's, never waited for; a missing worker leaves ``ok`` true (the process serves).
    task_queue = task_consumers.consumer_watch.current().to_json()
    return {
        **probe,
        "ts": selectors.now_ms(),
        "version": SERVER_VERSION,
        "uptimeMs": state.uptime_ms(),
        "taskQueue": task_queue,
    }


def _rss_bytes() -> int | None:
    try:
        with open(f"/proc/{os.getpid()}/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def gateway_status() -> dict:
    """The core's part of ``status``: this process and the cluster's processes and connections (one query)."""
    processes, counts = selectors.live_processes_and_connection_counts()
    return {
        "runtimeVersion": SERVER_VERSION,
        "pid": os.getpid(),
        "bootId": state.BOOT_ID,
        "uptimeMs": state.uptime_ms(),
        "processMemory": {"rssBytes": _rss_bytes()},
        "gatewayProcesses": processes,
        "connections": {**counts, "local": len(state.local_connections)},
        # OpenClaw's fields for its messaging channels and queued system events: neither exists here.
        "channelSummary": [],
        "queuedSystemEvents": [],
    }


@method("status", params=StatusParams, scope=sc.READ)
def status_rpc(ctx: RpcContext | None, params: StatusParams | None) -> dict:
    payload = gateway_status()
    # The apps' parts (stored sessions, default model, agents' heartbeats).
    for provider in registry.status_providers:
        payload.update(provider(ctx))
    return payload


@method("system-presence", scope=sc.READ)
def system_presence_rpc(ctx: RpcContext, params) -> list[dict]:
    """The presence list hello-ok's snapshot and the ``presence`` events carry, read now."""
    return selectors.presence_entries()


@method("config.get", scope=sc.READ)
async def config_get_rpc(ctx: RpcContext, params) -> dict:
    return config_snapshot()


# --- node.invoke -------------------------------------------------------------------------------


# A node command's params and its result are the node's business, bounded only by maxPayload as in OpenClaw.
@method("node.invoke", params=NodeInvokeParams, scope=sc.WRITE, max_frame_bytes=None)
async def node_invoke_rpc(ctx: RpcContext, params: NodeInvokeParams) -> dict:
    return await invoke.node_invoke(ctx, params)


@method("node.invoke.result", params=NodeInvokeResultParams, role="node", max_frame_bytes=None)
async def node_invoke_result_rpc(ctx: RpcContext, params: NodeInvokeResultParams) -> dict:
    if isinstance(params.payloadJSON, str):
        # The caller's process decodes payloadJSON into its response: it must hold to the frame
        # limits (depth, numbers, valid UTF-8 text) or that response could not be built or sent.
        # Text that is not JSON at all is passed on as before (the caller answers it as a string).
        try:
            decode_frame(params.payloadJSON)
        except FrameRejected as rejected:
            if rejected.malformed:
                return await invoke.node_invoke_result(ctx, params)
            reason = rejected.reason
            # The caller is told at once instead of waiting for its timeout.
            await invoke.node_invoke_result(
                ctx,
                params.model_copy(
                    update={
                        "ok": False,
                        "payload": None,
                        "payloadJSON": None,
                        "error": NodeInvokeError(code="INVALID_REQUEST", message=f"invalid payloadJSON: {reason}"),
                    }
                ),
            )
            raise InvalidRequest(f"invalid node.invoke.result params: payloadJSON: {reason}") from None
    return await invoke.node_invoke_result(ctx, params)
