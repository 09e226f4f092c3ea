"""Gateway methods of operations_app, one block per part (docs/operations.md)."""

from __future__ import annotations

import asyncio

from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.registry import registry

from . import logs
from .schemas import LogsTailParams

method = registry.method


# --- logs ---------------------------------------------------------------------------------------------


# operator.read, as OpenClaw's method-scope table has it (reference/openclaw-clients.md, protocol.md §3).
@method("logs.tail", params=LogsTailParams, scope=sc.READ)
async def logs_tail_rpc(ctx: RpcContext, params: LogsTailParams) -> dict:
    # File reading only: a thread of its own, not the database hop's thread that other requests queue for.
    tail = await asyncio.to_thread(
        logs.log_tail,
        logs.log_file(),
        cursor=params.cursor,
        limit=params.limit or logs.DEFAULT_LIMIT,
        max_bytes=params.maxBytes or logs.DEFAULT_MAX_BYTES,
    )
    return tail.as_payload()
