"""One access line per HTTP request and per RPC call, each on its own logger so either can be silenced
(``openclaw.access.http``, ``openclaw.access.rpc``).

A line says what was asked and how it ended, never what was sent: the method and the path without its query
string, or the RPC method; the status or the error code; the time taken. Bodies, params, headers, cookies,
tokens and message text stay out.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from . import log_context

http_logger = logging.getLogger("openclaw.access.http")
rpc_logger = logging.getLogger("openclaw.access.rpc")

REQUEST_ID_HEADER = "X-Request-ID"
# The status an access line gives a request whose client left before the answer (nginx's convention).
CLIENT_CLOSED_REQUEST = 499
# A proxy's request id is kept when it is a plain token; anything else is replaced (it lands in every line).
_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
MAX_LOGGED_PATH_CHARS = 300
# A client may send any method name; the registered ones are far shorter.
MAX_LOGGED_METHOD_CHARS = 100


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


def _request_id(request) -> str:
    offered = request.headers.get(REQUEST_ID_HEADER, "")
    return offered if _CLIENT_REQUEST_ID.fullmatch(offered) else uuid.uuid4().hex


def _log_http(request, status: int, started: float) -> None:
    path = request.path[:MAX_LOGGED_PATH_CHARS]
    duration_ms = _elapsed_ms(started)
    http_logger.info(
        "%s %s %s %.1fms",
        request.method,
        path,
        status,
        duration_ms,
        extra={"method": request.method, "path": path, "status": status, "duration_ms": duration_ms},
    )


class RequestLogMiddleware:
    """First in ``MIDDLEWARE``: gives the request its ``request_id`` (the client's ``X-Request-ID`` when it is a
    plain token, else a new one), answers with it, and writes the access line when the response is ready."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._answer_async(request)
        started = time.perf_counter()
        request_id = _request_id(request)
        with log_context.bound(request_id=request_id):
            status = 500
            try:
                response = self.get_response(request)
                status = response.status_code
            finally:
                _log_http(request, status, started)
        response[REQUEST_ID_HEADER] = request_id
        return response

    async def _answer_async(self, request):
        started = time.perf_counter()
        request_id = _request_id(request)
        with log_context.bound(request_id=request_id):
            status = 500
            try:
                response = await self.get_response(request)
                status = response.status_code
            except asyncio.CancelledError:
                # Django cancels the view when the client disconnects first (a health check's timeout): nothing
                # failed here, and no answer went out.
                status = CLIENT_CLOSED_REQUEST
                raise
            finally:
                _log_http(request, status, started)
        response[REQUEST_ID_HEADER] = request_id
        return response


def rpc_access_logged(
    run_request: Callable[..., Awaitable[dict[str, Any]]],
) -> Callable[..., Awaitable[dict[str, Any]]]:
    """Wraps the RPC dispatcher: the call runs with ``request_id`` = the frame's id and the connection's
    ``device_id`` in the log context, and ends with one line: method, ``ok`` or the error code, duration."""

    @functools.wraps(run_request)
    async def logged(ctx, frame, **options: Any) -> dict[str, Any]:
        started = time.perf_counter()
        # Stays so when the caller cancels the request (a cancel frame, a disconnect); run_request answers the rest.
        outcome = "cancelled"
        with log_context.bound(request_id=frame.id, device_id=ctx.device_id or ctx.node_id):
            try:
                response = await run_request(ctx, frame, **options)
                outcome = "ok" if response.get("ok") else str(response.get("error", {}).get("code", "error"))
                return response
            finally:
                duration_ms = _elapsed_ms(started)
                method = frame.method[:MAX_LOGGED_METHOD_CHARS]
                rpc_logger.info(
                    "%s %s %.1fms",
                    method,
                    outcome,
                    duration_ms,
                    extra={"method": method, "outcome": outcome, "duration_ms": duration_ms},
                )

    return logged
