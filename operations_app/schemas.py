"""Parameter shapes of the operations methods, shared by the RPC and the console."""

from __future__ import annotations

from pydantic import Field

from gateway.protocol import ClosedModel

from . import logs

# --- logs ---------------------------------------------------------------------------------------------


class LogsTailParams(ClosedModel):
    """OpenClaw's ``logs.tail`` params (LogsTailParamsSchema): a byte offset from the previous answer, and at most
    5000 lines and 1,000,000 bytes per answer."""

    cursor: int | None = Field(default=None, ge=0)
    limit: int | None = Field(default=None, ge=1, le=logs.MAX_LIMIT)
    maxBytes: int | None = Field(default=None, ge=1, le=logs.MAX_BYTES)
