"""The one error hierarchy of the project.

Services raise these; the RPC dispatcher turns them into the protocol ``ErrorShape`` and the JSON
API into HTTP statuses. The protocol ``code`` follows OpenClaw's conventions: validation, unknown
method, role/scope and policy denials are ``INVALID_REQUEST``; transient or backend failures and an
offline node are ``UNAVAILABLE``; pairing is ``NOT_PAIRED``.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg_pool import PoolTimeout


class GatewayError(Exception):
    code = "UNAVAILABLE"
    http_status = 503

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retryable: bool | None = None,
        retry_after_ms: int | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.details = details
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms
        if code is not None:
            self.code = code

    def to_shape(self) -> dict[str, Any]:
        shape: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            shape["details"] = self.details
        if self.retryable is not None:
            shape["retryable"] = self.retryable
        if self.retry_after_ms is not None:
            shape["retryAfterMs"] = self.retry_after_ms
        return shape


class InvalidRequest(GatewayError):
    code = "INVALID_REQUEST"
    http_status = 400


class NotFound(InvalidRequest):
    http_status = 404


class PayloadTooLarge(InvalidRequest):
    http_status = 413


class Conflict(InvalidRequest):
    """A compare-and-set or idempotency check lost against a concurrent writer."""

    http_status = 409


class PermissionDenied(InvalidRequest):
    """Role or scope refusal; OpenClaw reports these as INVALID_REQUEST."""

    http_status = 403


class Unauthorized(InvalidRequest):
    http_status = 401


class RateLimited(InvalidRequest):
    """Too many failed attempts from this client address: refused, whatever the request, until ``retry_after_ms``
    has passed (HTTP 429 with ``Retry-After``)."""

    http_status = 429


class NotPaired(GatewayError):
    code = "NOT_PAIRED"
    http_status = 403


class Unavailable(GatewayError):
    code = "UNAVAILABLE"
    http_status = 503


class Busy(Unavailable):
    """A sound request the target's current state refuses for now: a turn running, a session initializing,
    a placement moving or failed. OpenClaw answers these ``UNAVAILABLE`` and so does the RPC; over HTTP
    they are 409, since nothing failed on the server's side (a 5xx is for that)."""

    http_status = 409


class InternalError(Unavailable):
    """An unexpected failure inside the gateway, told as a reference (``internal_error``). The wire says
    ``UNAVAILABLE`` (retryable), as OpenClaw does; over HTTP it is a 500, the server's own fault."""

    http_status = 500


class DatabaseUnavailable(InternalError):
    """No pooled database connection came free within the pool's wait (``OPENCLAW_DB_POOL_TIMEOUT_MS``): every one
    in use, or the database unreachable. The step that asked did not reach the database. ``UNAVAILABLE``,
    retryable, as every internal error; over HTTP a 503 (overloaded or cut off, not broken)."""

    http_status = 503


DATABASE_UNAVAILABLE_MESSAGE = (
    "the gateway could not get a database connection in time (all in use, or the database unreachable); retry shortly"
)
DATABASE_UNAVAILABLE_RETRY_MS = 1000


class HandshakeRejected(Exception):
    """A connect that must be answered with an error and then closed with ``close_code``."""

    def __init__(self, error: GatewayError, *, close_code: int = 1008, close_reason: str | None = None):
        super().__init__(error.message)
        self.error = error
        self.close_code = close_code
        self.close_reason = close_reason if close_reason is not None else error.message


@dataclass(frozen=True)
class InternalErrorReport:
    """An ``internal_error`` as its listeners get it: for operators only (the first line of the message is
    here; clients never see it)."""

    error_id: str
    context: str
    exception_class: str
    first_line: str
    occurred_at: datetime


InternalErrorListener = Callable[[InternalErrorReport], None]
_internal_error_listeners: list[InternalErrorListener] = []
_listener_logger = logging.getLogger(__name__)


def on_internal_error(listener: InternalErrorListener) -> None:
    """Have ``listener`` told of every ``internal_error`` (the operations app records them for the console).

    It is called on the failing caller's thread, possibly inside a broken transaction or an event loop: it must
    return at once and touch no database itself."""
    if listener not in _internal_error_listeners:
        _internal_error_listeners.append(listener)


def _report_internal_error(error_id: str, context: str, exc: BaseException | None) -> None:
    if not _internal_error_listeners:
        return
    message = str(exc) if exc is not None else ""
    report = InternalErrorReport(
        error_id=error_id,
        context=context,
        exception_class=type(exc).__qualname__ if exc is not None else "",
        first_line=message.splitlines()[0] if message else "",
        occurred_at=datetime.now(UTC),
    )
    for listener in _internal_error_listeners:
        try:
            listener(report)
        except Exception:
            # A listener's failure must not turn the caller's error into another one.
            _listener_logger.exception("internal error listener %r failed (errorId=%s)", listener, error_id)


def internal_error(
    logger: logging.Logger,
    context: str,
    *,
    summary: str = "internal error",
    exc: BaseException | None = None,
    details: dict[str, Any] | None = None,
) -> InternalError:
    """What a client is told about an unexpected exception: a reference, never the exception's text.

    The traceback of ``exc`` (default: the exception being handled) goes to ``logger`` under the
    same reference, so an operator can find it from the client's report.
    """
    error_id = uuid.uuid4().hex[:16]
    failure = exc if exc is not None else sys.exception()
    if pool_exhausted(failure):
        # Load or an outage, not a bug: one line, no traceback; the client is told plainly and may retry.
        logger.warning("%s: no database connection could be had in time (errorId=%s)", context, error_id)
        _report_internal_error(error_id, context, failure)
        return DatabaseUnavailable(
            DATABASE_UNAVAILABLE_MESSAGE,
            details={**(details or {}), "code": "DATABASE_UNAVAILABLE", "errorId": error_id},
            retryable=True,
            retry_after_ms=DATABASE_UNAVAILABLE_RETRY_MS,
        )
    logger.error("%s failed (errorId=%s)", context, error_id, exc_info=exc if exc is not None else True)
    _report_internal_error(error_id, context, failure)
    return InternalError(
        f"{summary}; reference {error_id}", details={**(details or {}), "errorId": error_id}, retryable=True
    )


def pool_exhausted(exc: BaseException | None) -> bool:
    """Whether ``exc`` is psycopg's pool giving up on a free connection (Django raises it wrapped in its own
    ``OperationalError``, the pool's ``PoolTimeout`` as its cause)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, PoolTimeout):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


class FrameRejected(InvalidRequest):
    """A frame refused before its request runs: not JSON, beyond what the protocol carries (depth, numbers,
    text, size), or not a request frame.

    After the handshake it is answered under ``frame_id``: the frame's own id when that can be read and sent
    back (``protocol.request_id_of``), else ``"invalid"``. Before it, the socket closes with 1008.
    """

    def __init__(self, reason: str, *, malformed: bool = False, frame_id: str = "invalid"):
        super().__init__(f"invalid request frame: {reason}")
        self.reason = reason
        # Not JSON at all: OpenClaw closes a handshake on it with the bare reason "invalid request frame".
        self.malformed = malformed
        self.frame_id = frame_id
