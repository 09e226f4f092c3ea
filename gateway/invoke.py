"""``node.invoke`` brokering, end to end, in one place.

1. The caller's process checks the call, claims its ``idempotencyKey`` and sends a
   ``gateway.invoke.request`` message to the node's connection (on whichever gateway process holds
   it; ``GatewayConnection.channel_name`` routes it through the channel layer).
2. That connection turns it into a ``node.invoke.request`` event for the node and remembers where
   the answer goes (``RpcContext.pending_invokes``).
3. The node answers with ``node.invoke.result``; its connection forwards a
   ``gateway.invoke.result`` message to the caller's channel, which resolves the waiting future
   (:data:`broker`). A node that disconnects first fails its pending invokes with ``NOT_CONNECTED``.

The gateway's own worker runtime drives nodes with private commands through :func:`invoke_private`,
from any process (a gateway, a Celery worker): it waits on a channel of its own, on which the node's
``node.invoke.progress`` events arrive too, in the order of their ``seq``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from channels.db import DatabaseSyncToAsync, database_sync_to_async
from channels.layers import get_channel_layer

from . import idempotency, selectors
from . import scopes as sc
from .conf import gateway_setting
from .context import RpcContext
from .events import EVENT_NODE_INVOKE_REQUEST
from .exceptions import InvalidRequest, PermissionDenied, Unavailable
from .intake import is_big, off_loop
from .node_commands import is_private_node_command
from .schemas import NodeInvokeParams, NodeInvokeResultParams

REQUEST_MESSAGE = "gateway.invoke.request"
RESULT_MESSAGE = "gateway.invoke.result"
PROGRESS_MESSAGE = "gateway.invoke.progress"
PROGRESS_EVENT = "node.invoke.progress"
# While the gateway's own invoke waits, how often it checks that the node's connection still exists.
LIVENESS_CHECK_S = 2.0
# The node's connection, looked up for an invoke from synchronous code: in threads of its own, where nothing waits.
# Not the thread every request's database work shares, nor the loop's default executor: the caller may be waiting
# on this invoke from either, and a lookup queued behind its own caller would never run.
_lookup_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gateway-invoke-lookup")
# Commands a plain node.invoke must not reach, with the error OpenClaw answers.
RESERVED_COMMANDS = ("system.execApprovals.get", "system.execApprovals.set")


class InvokeBroker:
    """Futures of the ``node.invoke`` calls made on this process, resolved by routed results."""

    def __init__(self) -> None:
        self._pending: dict[str, asyncio.Future] = {}

    def create(self, invoke_id: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._pending[invoke_id] = future
        return future

    def resolve(self, invoke_id: str, result: dict[str, Any]) -> bool:
        future = self._pending.pop(invoke_id, None)
        if future is None or future.done():
            return False
        future.set_result(result)
        return True

    def discard(self, invoke_id: str) -> None:
        self._pending.pop(invoke_id, None)


broker = InvokeBroker()


@dataclass(frozen=True)
class InvokeTarget:
    channel_name: str
    conn_id: str
    commands: list[str]


def invoke_target(node_id: str) -> InvokeTarget | None:
    """Where an invoke for the node goes now: its live connection, if it has one."""
    route = selectors.live_node_route(node_id)
    if route is None:
        return None
    channel_name, conn_id, commands = route
    return InvokeTarget(channel_name=channel_name, conn_id=str(conn_id), commands=list(commands or []))


_invoke_target_off_loop = DatabaseSyncToAsync(invoke_target, thread_sensitive=False, executor=_lookup_pool)


def failure_message(invoke_id: str, code: str, message: str) -> dict[str, Any]:
    return {"type": RESULT_MESSAGE, "id": invoke_id, "ok": False, "error": {"code": code, "message": message}}


# --- the caller's side ---------------------------------------------------------------------------


async def node_invoke(ctx: RpcContext, params: NodeInvokeParams) -> dict:
    """``node.invoke``: run a declared, approved command on a connected node and return its outcome."""
    node_id, command = params.nodeId.strip(), params.command.strip()
    if not node_id or not command:
        raise InvalidRequest("nodeId and command required")
    if is_private_node_command(command):
        raise InvalidRequest("node.invoke does not allow private node controls", details={"command": command})
    if command in RESERVED_COMMANDS:
        raise InvalidRequest("use exec.approvals.node.get/set for node exec approvals")
    if command == "browser.proxy" and not ctx.has_scope(sc.ADMIN):
        raise PermissionDenied(f"missing scope: {sc.ADMIN}")
    target = await database_sync_to_async(invoke_target)(node_id)
    if target is None:
        raise Unavailable("node not connected", details={"code": "NOT_CONNECTED"})
    if not target.commands:
        raise InvalidRequest(
            f'node did not declare commands; "{command}" cannot be invoked',
            details={"reason": "node did not declare commands", "command": command},
        )
    if command not in target.commands:
        raise InvalidRequest(
            f'node command "{command}" is not declared by the node or not in its approved command surface',
            details={"reason": "command not declared by node", "command": command},
        )
    timeout_ms = params.timeoutMs if params.timeoutMs else gateway_setting("NODE_INVOKE_TIMEOUT_MS")
    # A retried invoke (same caller, node and key) within 5 minutes gets the first outcome instead
    # of running the command twice.
    claimed = await idempotency.claim(
        "node.invoke",
        f"{ctx.device_id or ctx.auth_method}:{node_id}",
        params.idempotencyKey,
        in_flight_ttl_s=timeout_ms / 1000 + 5,
    )
    if claimed.recorded is not None:
        return _replay(claimed.recorded)
    try:
        result = await _route_and_wait(ctx, params, node_id, command, target, timeout_ms)
    except BaseException:
        # Not delivered or not answered: the node may not have run it, so a retry may.
        await idempotency.release(claimed)
        raise
    if result.get("ok"):
        payload, payload_json = await _result_payload(result)
        response = {"ok": True, "nodeId": node_id, "command": command, "payload": payload}
        if payload_json is not None:
            response["payloadJSON"] = payload_json
        await idempotency.record(claimed, {"ok": True, "payload": response})
        return response
    error = result.get("error") or {}
    code = error.get("code") or "UNAVAILABLE"
    message = error.get("message") or "node invoke failed"
    details: dict[str, Any] = {"nodeError": {"code": code, "message": message}}
    failure = Unavailable(message, details=details)
    if code == "NOT_CONNECTED":
        details["code"] = "NOT_CONNECTED"
        await idempotency.release(claimed)
    else:
        await idempotency.record(claimed, {"ok": False, "error": failure.to_shape()})
    raise failure


def _replay(recorded: dict[str, Any]) -> dict:
    if recorded["ok"]:
        return recorded["payload"]
    shape = recorded["error"]
    raise Unavailable(shape["message"], details=shape.get("details"), code=shape["code"])


async def _result_payload(result: dict[str, Any]) -> tuple[Any, str | None]:
    """The node's payload, and its JSON text when it sent one (``payloadJSON``, decoded off the loop when big: a
    node may send up to the frame limit)."""
    payload_json = result.get("payloadJSON")
    if isinstance(payload_json, str):
        if is_big(payload_json):
            return await off_loop(_decoded_payload, payload_json), payload_json
        return _decoded_payload(payload_json), payload_json
    return result.get("payload"), None


def _decoded_payload(payload_json: str) -> Any:
    try:
        return json.loads(payload_json)
    except json.JSONDecodeError:
        return {"payloadJSON": payload_json}


async def _route_and_wait(
    ctx: RpcContext,
    params: NodeInvokeParams,
    node_id: str,
    command: str,
    target: InvokeTarget,
    timeout_ms: int,
) -> dict[str, Any]:
    """Send one invoke to the node's connection (on whichever process) and wait for its result."""
    invoke_id = str(uuid.uuid4())
    future = broker.create(invoke_id)
    try:
        await get_channel_layer().send(
            target.channel_name,
            {
                "type": REQUEST_MESSAGE,
                "id": invoke_id,
                "nodeId": node_id,
                "connId": target.conn_id,
                "command": command,
                "paramsJSON": json.dumps(params.params) if params.params is not None else None,
                "timeoutMs": timeout_ms,
                "idempotencyKey": params.idempotencyKey,
                "replyChannel": ctx.channel_name,
            },
        )
        try:
            return await asyncio.wait_for(future, timeout_ms / 1000)
        except TimeoutError:
            raise Unavailable(
                "node invoke timed out",
                details={"nodeError": {"code": "TIMEOUT", "message": "node invoke timed out"}},
            ) from None
    finally:
        broker.discard(invoke_id)


# --- the gateway's own invokes (private worker commands) ----------------------------------------


class NodeCommandFailed(Exception):
    """A private command did not succeed on the node: ``code`` is the node's (or ``NOT_CONNECTED``,
    ``TIMEOUT``), ``message`` is for people."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


ProgressCallback = Callable[[dict[str, Any]], Awaitable[None]]


async def invoke_private(
    node_id: str,
    command: str,
    params: dict[str, Any],
    *,
    timeout_ms: int,
    on_progress: ProgressCallback | None = None,
    conn_id: str | None = None,
    target: InvokeTarget | None = None,
    declared_worker_host: bool = False,
    idempotency_key: str | None = None,
) -> Any:
    """Run ``command`` on the node's live connection and return its payload; raises :class:`NodeCommandFailed`.

    ``conn_id`` pins the connection: a node that reconnected since is refused (its state may differ).
    ``target``: the node's connection as the caller just looked it up (saves the lookup here).
    ``declared_worker_host``: the caller proved the connection's worker-host declaration, so a private
    command goes out although the node does not list it (OpenClaw's node host never lists them).
    ``idempotency_key``: the request frame's key (default: the invoke's own id).
    Progress (``data`` of each ``node.invoke.progress``) goes to ``on_progress`` in ``seq`` order; one
    that arrives after a later one is dropped. ``timeout_ms`` is an idle timeout: progress resets it.
    """
    if target is None:
        target = await _invoke_target_off_loop(node_id)
    if target is None:
        raise NodeCommandFailed("NOT_CONNECTED", "node not connected")
    if conn_id is not None and target.conn_id != conn_id:
        raise NodeCommandFailed("NOT_CONNECTED", "node connection is no longer current")
    if command not in target.commands and not (declared_worker_host and is_private_node_command(command)):
        # Asked of a node that never offered it, the command would wait for its timeout unanswered.
        raise NodeCommandFailed("UNSUPPORTED", f"node does not offer {command}")
    layer = get_channel_layer()
    # The default prefix: channels_redis reads every process-local channel through one list per process.
    reply_channel = await layer.new_channel()
    invoke_id = str(uuid.uuid4())
    await layer.send(
        target.channel_name,
        {
            "type": REQUEST_MESSAGE,
            "id": invoke_id,
            "nodeId": node_id,
            "connId": target.conn_id,
            "command": command,
            "paramsJSON": json.dumps(params),
            "timeoutMs": timeout_ms,
            "idempotencyKey": idempotency_key or invoke_id,
            "replyChannel": reply_channel,
        },
    )
    last_seq = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise NodeCommandFailed("TIMEOUT", f"node did not answer {command} within {timeout_ms} ms")
        try:
            message = await asyncio.wait_for(layer.receive(reply_channel), min(remaining, LIVENESS_CHECK_S))
        except TimeoutError:
            # A connection that closed before it took the request (or whose process died) answers nothing:
            # the wait ends when the connection is gone, not at the timeout.
            current = await _invoke_target_off_loop(node_id)
            if current is None or current.conn_id != target.conn_id:
                raise NodeCommandFailed("NOT_CONNECTED", f"node disconnected ({command})") from None
            continue
        if message.get("id") != invoke_id:
            continue
        deadline = loop.time() + timeout_ms / 1000  # an idle timeout: any word from the node resets it
        if message.get("type") == PROGRESS_MESSAGE:
            seq = message.get("seq")
            if isinstance(seq, int) and seq > last_seq:
                last_seq = seq
                if on_progress is not None:
                    await on_progress(message.get("data") or {})
            continue
        if message.get("ok"):
            payload, _payload_json = await _result_payload(message)
            return payload
        error = message.get("error") or {}
        raise NodeCommandFailed(
            str(error.get("code") or "UNAVAILABLE"), str(error.get("message") or "node command failed")
        )


async def forward_progress(ctx: RpcContext, payload: Any) -> dict[str, Any]:
    """``node.event`` ``node.invoke.progress``: pass the node's progress on to whoever waits for that invoke.

    Forwards of one invoke leave in the order their frames arrived, and its result after them: the
    node sends its result right after its last progress, without waiting for answers.
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("id"), str):
        raise InvalidRequest("node.invoke.progress needs {id, seq, data}")
    seq, data = payload.get("seq"), payload.get("data")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1 or not isinstance(data, dict):
        raise InvalidRequest("node.invoke.progress needs a positive integer seq and an object data")
    invoke_id = payload["id"]
    pending = ctx.pending_invokes.get(invoke_id)
    if pending is None:
        return {"handled": False, "reason": "unknown-invoke"}
    reply_channel, _command = pending
    message = {"type": PROGRESS_MESSAGE, "id": invoke_id, "seq": seq, "data": data}
    # Registered before this coroutine first yields, so a result frame handled next finds it.
    forward = asyncio.ensure_future(_send_after(ctx.progress_forwards.get(invoke_id), reply_channel, message))
    ctx.progress_forwards[invoke_id] = forward
    forward.add_done_callback(lambda done: _forget_forward(ctx, invoke_id, done))
    await forward
    return {"handled": True}


async def _send_after(previous: asyncio.Task | None, channel: str, message: dict[str, Any]) -> None:
    if previous is not None:
        await asyncio.wait({previous})  # its outcome is its own request's; only the order matters here
    await get_channel_layer().send(channel, message)


def _forget_forward(ctx: RpcContext, invoke_id: str, forward: asyncio.Task) -> None:
    if ctx.progress_forwards.get(invoke_id) is forward:
        del ctx.progress_forwards[invoke_id]


def resolve(message: dict[str, Any]) -> None:
    """A routed ``gateway.invoke.result`` reached the caller's connection: wake the waiting call."""
    broker.resolve(message["id"], message)


# --- the node's side -----------------------------------------------------------------------------


async def forward_to_node(
    ctx: RpcContext | None, message: dict[str, Any], send_frame: Callable[[dict[str, Any]], Awaitable[None]]
) -> None:
    """Turn a routed request into a ``node.invoke.request`` event for the node behind ``ctx``.

    ``ctx`` is None when the connection is no longer open; a request for another node (the node
    reconnected elsewhere) is refused the same way, so the caller never waits for its timeout.
    """
    if ctx is None or ctx.node_id != message["nodeId"]:
        await get_channel_layer().send(
            message["replyChannel"], failure_message(message["id"], "NOT_CONNECTED", "node not connected")
        )
        return
    ctx.pending_invokes[message["id"]] = (message["replyChannel"], message["command"])
    payload = {k: message[k] for k in ("id", "nodeId", "command", "paramsJSON") if k in message}
    for optional in ("timeoutMs", "idempotencyKey"):
        if message.get(optional) is not None:
            payload[optional] = message[optional]
    await send_frame({"type": "event", "event": EVENT_NODE_INVOKE_REQUEST, "payload": payload})


async def node_invoke_result(ctx: RpcContext, params: NodeInvokeResultParams) -> dict:
    """``node.invoke.result``: forward the node's answer to the caller (a late or unknown one is ignored)."""
    if params.nodeId != ctx.node_id:
        raise InvalidRequest("nodeId mismatch")
    pending = ctx.pending_invokes.pop(params.id, None)
    if pending is None:
        return {"ok": True, "ignored": True}
    reply_channel, _command = pending
    last_forward = ctx.progress_forwards.pop(params.id, None)
    if last_forward is not None:
        await asyncio.wait({last_forward})
    payload, payload_json = params.payload, params.payloadJSON
    if payload_json is not None and not isinstance(payload_json, str):
        payload, payload_json = payload_json, None
    message: dict[str, Any] = {"type": RESULT_MESSAGE, "id": params.id, "ok": params.ok, "payload": payload}
    if payload_json is not None:
        message["payloadJSON"] = payload_json
    if params.error is not None:
        message["error"] = params.error.model_dump(exclude_none=True)
    await get_channel_layer().send(reply_channel, message)
    return {"ok": True}


async def fail_pending(ctx: RpcContext) -> None:
    """The node's connection closed: every call still waiting on it fails with ``NOT_CONNECTED``."""
    layer = get_channel_layer()
    for invoke_id, (reply_channel, command) in list(ctx.pending_invokes.items()):
        await layer.send(reply_channel, failure_message(invoke_id, "NOT_CONNECTED", f"node disconnected ({command})"))
    ctx.pending_invokes.clear()
