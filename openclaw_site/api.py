"""The single NinjaAPI: one router per app, token auth, and the one error shape.

Every answer under ``/api/`` that is not a success is ``{"error": {code, message, details?,
retryable?, retryAfterMs?}}`` — the RPC's error shape — with the HTTP status of the error class:
bad input (400, naming only what the client sent), a missing or wrong token (401), unknown routes
(404) and methods (405), and unexpected failures (500, a reference instead of the exception's text).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.operation import Operation

from approvals_app.api import router as approvals_router
from devices_app.api import router as devices_router
from gateway.api import router as gateway_router
from gateway.exceptions import (
    GatewayError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    internal_error,
)
from gateway.http_auth import OPERATOR_AUTH, TOKEN_HEADER
from gateway.protocol import error_path, validation_message
from operations_app.api import router as usage_router
from sessions_app.api import router as sessions_router
from workers_app.api import router as workers_router

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"
# ninja's validation locations, as a client names them.
PARAMETER_SOURCES = {"body": "body", "query": "query", "path": "path", "header": "header", "cookie": "cookie"}


class GatewayAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation: Operation) -> str:
        """The view's name (``session_list``, ``placement_dispatch``): unique across the API (a test
        checks it), and unchanged when a module moves."""
        return operation.view_func.__name__


api = GatewayAPI(
    title="OpenClaw gateway API",
    version="1",
    description=(
        "The gateway's operations for scripts, over the same services as its WebSocket methods (named in "
        "each operation's description). Send `Authorization: Bearer <gateway token>` (or "
        f'`{TOKEN_HEADER}: <gateway token>`). Every error is `{{"error": {{code, message, details?, retryable?, '
        "retryAfterMs?}}`: bad input 400 (nothing changed), no or a wrong token 401, unknown ids 404, a "
        "state that moved on 409 or 400 with the service's own message, a backend that failed 503, and an "
        "unexpected failure 500 with a reference the gateway's log has the cause under."
    ),
    auth=OPERATOR_AUTH,
    urls_namespace="api",
)
api.add_router("/gateway", gateway_router)
# Devices and nodes kept the paths they had when the gateway core served them.
api.add_router("/gateway", devices_router)
api.add_router("/approvals", approvals_router)
api.add_router("/sessions", sessions_router)
api.add_router("/workers", workers_router)
api.add_router("/usage", usage_router)


def error_response(error: GatewayError) -> JsonResponse:
    response = JsonResponse({"error": error.to_shape()}, status=error.http_status)
    if error.http_status == 429 and error.retry_after_ms is not None:
        response["Retry-After"] = str(max(1, math.ceil(error.retry_after_ms / 1000)))
    return response


@api.exception_handler(GatewayError)
def gateway_error(request: HttpRequest, exc: GatewayError):
    return error_response(exc)


@api.exception_handler(ValidationError)
def validation_error(request: HttpRequest, exc: ValidationError):
    """``at /<field>`` paths relative to what the client sent (the body, the query string, the path)."""
    problems = [_problem(item) for item in exc.errors]
    message = "invalid request: " + "; ".join(f"at {p['path']} ({p['in']}): {p['message']}" for p in problems)
    return error_response(InvalidRequest(message, details={"errors": problems}))


def _problem(item: dict) -> dict:
    location = tuple(item.get("loc", ()))
    source = PARAMETER_SOURCES.get(str(location[0]), "body") if location else "body"
    # A body schema is one view parameter whose name the client never sent: ("body", "payload", "message").
    fields = location[2:] if source == "body" and len(location) > 1 else location[1:]
    return {"in": source, "path": error_path(fields), "message": validation_message(item)}


@api.exception_handler(AuthenticationError)
def authentication_error(request: HttpRequest, exc: AuthenticationError):
    presented = "Authorization" in request.headers or TOKEN_HEADER in request.headers
    return error_response(
        Unauthorized(
            "gateway token refused" if presented else "gateway token required",
            details={
                "code": "AUTH_TOKEN_MISMATCH" if presented else "AUTH_TOKEN_MISSING",
                "hint": f"send 'Authorization: Bearer <gateway token>' or '{TOKEN_HEADER}: <gateway token>'",
            },
        )
    )


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, exc: HttpError):
    if exc.status_code == 400:
        # ninja's only 400 of its own: a body that is not JSON.
        return error_response(InvalidRequest("invalid request: the body is not valid JSON"))
    error = GatewayError(str(exc), code="INVALID_REQUEST" if exc.status_code < 500 else "UNAVAILABLE")
    error.http_status = exc.status_code
    return error_response(error)


@api.exception_handler(Http404)
def not_found(request: HttpRequest, exc: Http404):
    return error_response(NotFound(f"not found: {request.method} {request.path}"))


@api.exception_handler(RequestDataTooBig)
def body_too_large(request: HttpRequest, exc: RequestDataTooBig):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return error_response(PayloadTooLarge(f"request body too large (at most {limit} bytes)"))


@api.exception_handler(Exception)
def unexpected_error(request: HttpRequest, exc: Exception):
    error = internal_error(logger, f"{request.method} {request.path}")
    return error_response(error)


class ApiErrorShapeMiddleware:
    """Errors answered before a view runs — Django's 404 for an unknown route under ``/api/``, ninja's
    bare 405 — get the one error shape too."""

    # Both, so that Django keeps the chain async under Daphne: a sync-only middleware here would put
    # every request (the worker's inference stream among them) through a thread of its own.
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self._acall(request)
        return _reshape(request, self.get_response(request))

    async def _acall(self, request: HttpRequest):
        return _reshape(request, await self.get_response(request))


def _reshape(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    if not request.path.startswith(API_PREFIX) or response.get("Content-Type", "").startswith("application/json"):
        return response
    if response.status_code == 404:
        return error_response(NotFound(f"no API route {request.method} {request.path}"))
    if response.status_code == 405:
        allowed = response.get("Allow", "")
        error = InvalidRequest(
            f"method {request.method} is not allowed on {request.path}", details={"allowed": allowed.split(", ")}
        )
        error.http_status = 405
        reshaped = error_response(error)
        reshaped["Allow"] = allowed
        return reshaped
    return response
