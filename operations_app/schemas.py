"""Parameter shapes of the operations methods, shared by the RPC and the console."""

from __future__ import annotations

from pydantic import Field, StrictInt

from gateway.protocol import ClosedModel

from . import logs

# --- logs ---------------------------------------------------------------------------------------------


class LogsTailParams(ClosedModel):
    """OpenClaw's ``logs.tail`` params (LogsTailParamsSchema): a byte offset from the previous answer, and at most
    5000 lines and 1,000,000 bytes per answer."""

    # Strict: JSON integers only, as OpenClaw's schema (no "12", no true).
    cursor: StrictInt | None = Field(default=None, ge=0, le=2**53 - 1)
    limit: StrictInt | None = Field(default=None, ge=1, le=logs.MAX_LIMIT)
    maxBytes: StrictInt | None = Field(default=None, ge=1, le=logs.MAX_BYTES)
