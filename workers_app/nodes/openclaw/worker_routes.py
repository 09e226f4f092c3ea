"""The HTTP routes of the project's worker on OpenClaw's node host (docs/node-worker-protocol.md, "OpenClaw's
dialect"), a plain ASGI app beside Django as the inference route is (no startup-gate wait: a worker's turn is
what recovery may be waiting for):

- ``GET  /api/workers/turns/<runId>/launch``: what the worker runs (model, context, bounds);
- ``POST /api/workers/turns/<runId>/progress``: ``{"items": [...]}``, delivered in order to the turn's thread;
- ``POST /api/workers/turns/<runId>/approval``: an exec question, answered with the gateway's decision, or
  ``504 TIMEOUT`` while it is still pending (the worker asks again with the same ``toolCallId``).

Every request carries the run's inference token (the launch's credential), good only while that run is running
on the token's node. The turn's thread may be another process (a Celery worker): items and questions reach it
through the channel layer (:func:`workers_app.nodes.openclaw.turns.turn_channel`), a decision comes back to the
channel of the request that asked.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from typing import Any

from channels.db import database_sync_to_async
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer

from gateway.exceptions import (
    Conflict,
    FrameRejected,
    GatewayError,
    InvalidRequest,
    NotFound,
    Unauthorized,
    Unavailable,
    internal_error,
)
from gateway.http_auth import bearer_token
from gateway.protocol import decode_frame
from sessions_app.model_providers import default_model
from sessions_app.models import Run
from sessions_app.services.runs import active_path_messages

from ...plain_http import ClientGone, Receive, Scope, Send, read_body, send_error, send_json
from ..turn_lookups import granted_run
from ..turn_tokens import INFERENCE_PATH, InferenceGrant, grant_for
from ..turn_watch import MESSAGE_KEY, MESSAGE_ROLES, agent_settings, turn_timeout_ms
from .turns import APPROVAL_MESSAGE, DECISION_MESSAGE, ITEMS_MESSAGE, turn_channel

logger = logging.getLogger(__name__)

TURNS_PREFIX = "/api/workers/turns/"
ROUTE = re.compile(r"/api/workers/turns/(?P<run_id>[^/]{1,200})/(?P<action>launch|progress|approval)")
METHODS = {"launch": "GET", "progress": "POST", "approval": "POST"}
PROGRESS_MAX_BYTES = 4 * 1024 * 1024
PROGRESS_MAX_ITEMS = 64
APPROVAL_MAX_BYTES = 128 * 1024
# How long an approval request waits for the decision before it answers 504 (the worker asks again): below the
# idle timeouts of proxies in front of the gateway.
APPROVAL_WAIT_S = 25.0
COMMAND_MAX_CHARS = 65_536
WORKDIR_MAX_CHARS = 4096
ENV_KEYS_MAX = 256
ENV_KEY_MAX_CHARS = 256
CALL_ID_MAX_CHARS = 200
TIMEOUT_S_MAX = 86_400
END_STATUSES = frozenset({"ok", "aborted", "error"})
TOKEN_HINT = "send 'Authorization: Bearer <the launch's admission credential>'"
NOT_RUNNING = "the run is no longer running on this node"


async def worker_turn_app(scope: Scope, receive: Receive, send: Send) -> None:
    route = ROUTE.fullmatch(scope["path"])
    action = route["action"] if route else ""
    try:
        if route is None:
            raise NotFound("no such worker route")
        if scope["method"] != METHODS[action]:
            method = scope["method"]
            error = InvalidRequest(f"method {method} is not allowed here", details={"allowed": [METHODS[action]]})
            error.http_status = 405
            raise error
        grant = _granted(scope, route["run_id"])
        if action == "launch":
            payload = await _launch(grant)
        elif action == "progress":
            payload = await _progress(grant, await read_body(receive, PROGRESS_MAX_BYTES))
        else:
            payload = await _approval(grant, await read_body(receive, APPROVAL_MAX_BYTES))
    except ClientGone:
        return
    except GatewayError as error:
        await send_error(send, error, allow=METHODS.get(action))
        return
    except Exception:
        await send_error(send, internal_error(logger, f"{scope['method']} {TURNS_PREFIX}…/{action}"))
        return
    await send_json(send, 200, payload, headers=[(b"cache-control", b"no-store")])


def _granted(scope: Scope, run_id: str) -> InferenceGrant:
    token = bearer_token(scope)
    if token is None:
        raise Unauthorized("credential required", details={"code": "AUTH_TOKEN_MISSING", "hint": TOKEN_HINT})
    grant = grant_for(token)
    if grant is None or grant.run_id != run_id:
        raise Unauthorized("credential refused", details={"code": "AUTH_TOKEN_MISMATCH", "hint": TOKEN_HINT})
    return grant


async def _running(grant: InferenceGrant) -> None:
    if await database_sync_to_async(granted_run)(grant.run_id, grant.node_id) is None:
        raise Conflict(NOT_RUNNING)


# --- launch --------------------------------------------------------------------------------------


async def _launch(grant: InferenceGrant) -> dict[str, Any]:
    payload = await database_sync_to_async(launch_payload)(grant)
    if payload is None:
        raise Conflict(NOT_RUNNING)
    return payload


def launch_payload(grant: InferenceGrant) -> dict[str, Any] | None:
    """What the worker runs: the session's model, the turn's context (chat messages, the user's message last,
    as the project's own worker gets them), and the agent loop's bounds; None once the run is not running on the
    grant's node."""
    if granted_run(grant.run_id, grant.node_id) is None:
        return None
    run = Run.objects.select_related("session", "window").filter(run_id=grant.run_id).first()
    if run is None:
        return None
    return {
        "runId": run.run_id,
        "model": run.session.model or default_model(),
        "messages": active_path_messages(run.window),
        "timeoutMs": turn_timeout_ms(),
        "agent": agent_settings(run.session.agent_id),
        "inference": {"path": INFERENCE_PATH},
    }


# --- progress ------------------------------------------------------------------------------------


async def _progress(grant: InferenceGrant, body: bytes) -> dict[str, Any]:
    items = checked_items(_json_object(body).get("items"))
    await _running(grant)
    await _deliver(grant.run_id, {"type": ITEMS_MESSAGE, "items": items})
    return {"ok": True}


def checked_items(items: Any) -> list[dict[str, Any]]:
    """The worker's progress items, each of a known kind and shape (the turn checks their meaning again)."""
    if not isinstance(items, list) or not 1 <= len(items) <= PROGRESS_MAX_ITEMS:
        raise InvalidRequest(f"invalid request: items must be a list of 1 to {PROGRESS_MAX_ITEMS} items")
    for index, item in enumerate(items):
        problem = _item_problem(item)
        if problem is None and item["kind"] == "end" and index != len(items) - 1:
            problem = "an end item must be the last"
        if problem is not None:
            raise InvalidRequest(f"invalid request: items[{index}]: {problem}")
    return items


def _item_problem(item: Any) -> str | None:
    if not isinstance(item, dict):
        return "must be an object"
    kind = item.get("kind")
    if kind == "delta":
        return None if isinstance(item.get("text"), str) else "a delta needs its text"
    if kind == "message":
        message = item.get("message")
        valid = (
            isinstance(item.get("key"), str)
            and MESSAGE_KEY.fullmatch(item["key"]) is not None
            and isinstance(message, dict)
            and message.get("role") in MESSAGE_ROLES
            and isinstance(message.get("content"), list)
            and isinstance(item.get("fullText", ""), str)
        )
        return None if valid else "a message needs a step key and an assistant or tool-result message"
    if kind == "tool":
        valid = (
            item.get("phase") == "start"
            and _text(item.get("toolCallId"), CALL_ID_MAX_CHARS)
            and _text(item.get("name"), 64)
            and isinstance(item.get("args", {}), dict)
        )
        return None if valid else "a tool item needs phase start, toolCallId, name and args"
    if kind == "end":
        result = item.get("result")
        valid = isinstance(result, dict) and result.get("status") in END_STATUSES
        return None if valid else "an end item needs a result with status ok, aborted or error"
    return "unknown kind"


# --- approval ------------------------------------------------------------------------------------


# Exec questions of one run this process holds open at once: a worker asks one per exec it runs (a few in parallel at
# most); each holds a request and an operator's approval row for up to APPROVAL_WAIT_S.
APPROVALS_IN_FLIGHT_PER_RUN = 8
_approvals_in_flight: collections.Counter[str] = collections.Counter()


async def _approval(grant: InferenceGrant, body: bytes) -> dict[str, Any]:
    question = checked_question(_json_object(body))
    await _running(grant)
    if _approvals_in_flight[grant.run_id] >= APPROVALS_IN_FLIGHT_PER_RUN:
        busy = Unavailable(
            f"this run already waits on {APPROVALS_IN_FLIGHT_PER_RUN} exec decisions; ask again once one is answered",
            retryable=True,
            retry_after_ms=1000,
        )
        busy.http_status = 429
        raise busy
    _approvals_in_flight[grant.run_id] += 1
    try:
        return await _asked(grant, question)
    finally:
        _approvals_in_flight[grant.run_id] -= 1
        if _approvals_in_flight[grant.run_id] <= 0:
            del _approvals_in_flight[grant.run_id]


async def _asked(grant: InferenceGrant, question: dict[str, Any]) -> dict[str, Any]:
    layer = get_channel_layer()
    reply = await layer.new_channel()
    await _deliver(grant.run_id, {"type": APPROVAL_MESSAGE, "question": question, "reply": reply})
    deadline = asyncio.get_running_loop().time() + APPROVAL_WAIT_S
    while (remaining := deadline - asyncio.get_running_loop().time()) > 0:
        try:
            answer = await asyncio.wait_for(layer.receive(reply), remaining)
        except TimeoutError:
            break
        if answer.get("type") == DECISION_MESSAGE and answer.get("toolCallId") == question["toolCallId"]:
            return {
                "allowed": answer.get("allowed") is True,
                "aborted": answer.get("aborted") is True,
                "reason": str(answer.get("reason") or ""),
            }
    pending = Unavailable(
        "the exec decision is still pending; ask again with the same toolCallId", code="TIMEOUT", retryable=True
    )
    pending.http_status = 504
    raise pending


def checked_question(value: dict[str, Any]) -> dict[str, Any]:
    """An exec question: the tool call, the command line, where it runs, its environment's names, its timeout."""
    expected = {"toolCallId", "command", "workdir", "envKeys", "timeoutS"}
    env_keys = value.get("envKeys")
    timeout_s = value.get("timeoutS")
    valid = (
        set(value) == expected
        and _text(value.get("toolCallId"), CALL_ID_MAX_CHARS)
        and _text(value.get("command"), COMMAND_MAX_CHARS)
        and _text(value.get("workdir"), WORKDIR_MAX_CHARS)
        and isinstance(env_keys, list)
        and len(env_keys) <= ENV_KEYS_MAX
        and all(_text(key, ENV_KEY_MAX_CHARS) for key in env_keys)
        and isinstance(timeout_s, int | float)
        and not isinstance(timeout_s, bool)
        and 0 <= timeout_s <= TIMEOUT_S_MAX
    )
    if not valid:
        raise InvalidRequest(
            "invalid request: an exec question is {toolCallId, command, workdir, envKeys, timeoutS} within bounds"
        )
    return value


# --- common --------------------------------------------------------------------------------------


def _text(value: Any, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = decode_frame(body.decode("utf-8"))
    except (UnicodeDecodeError, FrameRejected):
        raise InvalidRequest("invalid request: the body is not valid JSON") from None
    if not isinstance(value, dict):
        raise InvalidRequest("invalid request: the body must be a JSON object")
    return value


async def _deliver(run_id: str, message: dict[str, Any]) -> None:
    try:
        await get_channel_layer().send(turn_channel(run_id), message)
    except ChannelFull:
        raise Unavailable("the turn is not keeping up; retry shortly", retryable=True, retry_after_ms=1000) from None
