"""The gateway WebSocket: transport only.

Frame size limits, JSON decoding, the handshake state machine, request task tracking and event
delivery with the per-connection ``seq``. Decisions live in ``handshake.py`` and ``dispatch.py``;
database work happens there, in one ``database_sync_to_async`` hop per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

from autobahn.exception import Disconnected
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer

from . import invoke, lifecycle, log_context, metrics, pairing_wait, state
from .conf import gateway_setting
from .context import RpcContext
from .dispatch import error_response, run_request
from .events import FOLLOW_UP_KEY, SUBSCRIPTION_KEY, subscription_group
from .exceptions import (
    FrameRejected,
    GatewayError,
    HandshakeRejected,
    InvalidRequest,
    Unavailable,
    internal_error,
)
from .handshake import ConnectContext, FirstFrameInvalid, failure_reason, parse_connect
from .hello import accept_connect, health_version_soon, presence_changed
from .intake import is_big, take_frame
from .ports import connection_authority
from .protocol import (
    DROP_IF_SLOW_KEY,
    INVALID_FRAME_ID,
    ConnectParams,
    EncodedEvent,
    RequestFrame,
    decode_frame,
    encode_frame,
    request_id_of,
    utf8_len_exceeds,
)
from .registry import registry
from .visibility import event_visible

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT_REQUESTS = 64
# A server fault ends a connection with 1011 and a reason naming the log entry, never silently.
INTERNAL_ERROR_CLOSE = 1011


class GatewayConsumer(AsyncWebsocketConsumer):
    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' own dispatch first closes stale database connections through the database
        thread, for every frame and channel-layer message. Every database hop of this consumer is a
        ``database_sync_to_async`` call, which does that on its own, so that extra hop would only put
        each frame, event and invoke through the one database thread (and queue it there)."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Also after a crash inside the consumer, where Daphne closes with 1011 and
            # `disconnect` is never called: the connection must not stay registered.
            await self._cleanup()

    async def connect(self) -> None:
        self.conn_id = str(uuid.uuid4())
        self.nonce = str(uuid.uuid4())
        self.cleaned_up = False
        self.phase = "handshake"  # → "authenticating" → "open" → "closed"
        self.counted_open = False
        self.ctx: RpcContext | None = None
        self.seq = 0
        self.request_tasks: dict[str, asyncio.Task] = {}
        client = self.scope.get("client") or (None, None)
        self.remote_ip = client[0]
        await self.accept()
        await self._send_frame(
            {
                "type": "event",
                "event": "connect.challenge",
                "payload": {"nonce": self.nonce, "ts": int(time.time() * 1000)},
            }
        )
        self.handshake_timer = asyncio.get_running_loop().call_later(
            gateway_setting("HANDSHAKE_TIMEOUT_MS") / 1000, self._on_handshake_timeout
        )

    def _on_handshake_timeout(self) -> None:
        if self.phase == "handshake":
            self.phase = "closed"
            metrics.record_handshake_failure("timeout")
            self.close_task = asyncio.ensure_future(self.close(code=1000, reason="handshake timeout"))

    async def _send_frame(self, frame: dict[str, Any], *, drop_if_slow: bool = False) -> None:
        """Send one frame. A frame that cannot be sent never leaves the connection silent.

        A response that cannot be encoded is replaced by a generic internal error for the same id
        (the request is answered, the connection stays usable); an event that cannot be encoded, or
        a transport that refuses a frame, closes the connection with 1011 and a reason.
        """
        if self.phase == "closed" and frame.get("type") == "event":
            return
        try:
            text = encode_frame(frame)
        except (TypeError, ValueError):
            error = internal_error(logger, f"encoding a {frame.get('type')} frame")
            if frame.get("type") != "res":
                await self._close_for_internal_error(error)
                return
            try:
                # Request ids are screened when the request is decoded, so this one encodes.
                text = encode_frame(error_response(frame.get("id") or INVALID_FRAME_ID, error))
            except (TypeError, ValueError):
                await self._close_for_internal_error(error)
                return
        await self._send_text(text, frame.get("type"), drop_if_slow=drop_if_slow)

    async def _send_text(self, text: str, frame_type: Any, *, drop_if_slow: bool = False) -> None:
        try:
            if drop_if_slow:
                # The transport skips it for a connection past maxBufferedBytes (daphne_server.py).
                await self.base_send({"type": "websocket.send", "text": text, DROP_IF_SLOW_KEY: True})
            else:
                await self.send(text_data=text)
        except Disconnected:
            # The socket closed before its disconnect reached this consumer (a tick or a broadcast got
            # there first): nothing is wrong, and the disconnect cleans up.
            self.phase = "closed"
        except Exception:
            # Daphne drops frames for sockets that already went away, so this is a transport that
            # refused the frame: close with a reason rather than keep a socket that stopped answering.
            await self._close_for_internal_error(internal_error(logger, f"sending a {frame_type} frame"))

    async def _close_for_internal_error(self, error: GatewayError) -> None:
        was_handshake = self.phase == "handshake"
        if self.phase in ("handshake", "authenticating"):
            metrics.record_handshake_failure("internal")
        self.phase = "closed"
        if was_handshake:
            self.handshake_timer.cancel()
        with contextlib.suppress(Exception):  # the transport may be gone already
            await self.close(code=INTERNAL_ERROR_CLOSE, reason=error.message)

    async def send_event(
        self, event: str, payload: Any, *, state_version: dict | None = None, drop_if_slow: bool = False
    ) -> None:
        """A broadcast event: stamped with this connection's next ``seq``."""
        if self.phase != "open":
            return
        self.seq += 1
        frame = {"type": "event", "event": event, "payload": payload, "seq": self.seq}
        if state_version is not None:
            frame["stateVersion"] = state_version
        await self._send_frame(frame, drop_if_slow=drop_if_slow)

    async def send_encoded_event(self, encoded: EncodedEvent) -> None:
        """An event encoded once for every local connection (ticks, broadcasts): stamped with this
        connection's next ``seq`` like :meth:`send_event`, without encoding it again."""
        if self.phase != "open":
            return
        if encoded.body is None:
            await self.send_event(
                encoded.event, encoded.payload, state_version=encoded.state_version, drop_if_slow=encoded.drop_if_slow
            )
            return
        self.seq += 1
        await self._send_text(encoded.frame_text(self.seq), "event", drop_if_slow=encoded.drop_if_slow)

    async def send_broadcast(self, encoded: EncodedEvent) -> None:
        """A broadcast-group event this process fans out to its connections (``broadcast.py``): the
        same gate as :meth:`gateway_event` applies to a copy that came through the channel layer."""
        ctx = self.ctx
        if self.phase != "open" or ctx is None:
            return
        if not event_visible(
            registry.events.get(encoded.event), role=ctx.role, scopes=ctx.scopes, subscriptions=ctx.subscriptions
        ):
            return
        await self.send_encoded_event(encoded)

    # --- inbound frames -------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            if self.phase == "handshake":
                await self._receive_handshake(text_data, bytes_data)
            elif self.phase == "open":
                await self._receive_open(text_data, bytes_data)
        except Exception:
            # Uncaught, Daphne would close with a bare 1011: say which log entry explains it.
            await self._close_for_internal_error(internal_error(logger, "handling a frame"))

    async def _receive_handshake(self, text_data: str | None, bytes_data: bytes | None) -> None:
        if bytes_data is not None or text_data is None:
            await self._close_handshake(1008, "invalid request frame", failure="invalid-frame")
            return
        if utf8_len_exceeds(text_data, gateway_setting("MAX_PREAUTH_PAYLOAD_BYTES")):
            await self._close_handshake(1009, "preauth payload too large", failure="payload-too-large")
            return
        try:
            raw = decode_frame(text_data)
        except FrameRejected as rejected:
            await self._close_handshake(
                1008, "invalid request frame" if rejected.malformed else rejected.message, failure="invalid-frame"
            )
            return
        try:
            request_id, params, protocol = parse_connect(raw)
        except FirstFrameInvalid:
            await self._close_handshake(1008, "invalid request frame", failure="invalid-frame")
            return
        except HandshakeRejected as rejected:
            await self._reject_handshake(request_id_of(raw), rejected)
            return
        self.handshake_timer.cancel()
        self.phase = "authenticating"
        # Read beside the database hop and its queue: hello-ok needs it, the connect's decision does not.
        health_version = health_version_soon()
        context = ConnectContext(
            conn_id=self.conn_id,
            boot_id=state.BOOT_ID,
            channel_name=self.channel_name,
            nonce=self.nonce,
            remote_ip=self.remote_ip,
            forwarded=_has_forwarded_headers(self.scope),
            browser_origin=_has_origin_header(self.scope),
        )
        try:
            await lifecycle.ensure_process_registered()
            try:
                self.ctx, hello, presence = await database_sync_to_async(accept_connect)(
                    params, context, protocol, health_version
                )
            except HandshakeRejected as rejected:
                if not _held_for_pairing(params, rejected):
                    raise
                self.ctx, hello, presence = await self._accept_once_approved(params, context, protocol, rejected)
        except HandshakeRejected as rejected:
            await self._reject_handshake(request_id, rejected)
            return
        except Exception:
            error = internal_error(logger, "connect")
            # The failure may have come after the registration committed (building hello-ok): a
            # connection that never opened must not stay routable or in presence.
            await self._unregister()
            await self._reject_handshake(
                request_id, HandshakeRejected(error, close_code=INTERNAL_ERROR_CLOSE), failure="internal"
            )
            return
        # Broadcasts reach this connection through the process's channel (broadcast.py): it must be
        # subscribed before the connection counts as open, or a broadcast right after could miss it.
        await lifecycle.ensure_broadcast_subscribed()
        self.phase = "open"
        # Frames of one connection are handled in its consumer's task: every line they log names the device.
        log_context.bind(device_id=self.ctx.device_id or self.ctx.node_id)
        lifecycle.ensure_started()
        state.local_connections.add(self)
        metrics.record_handshake_ok()
        metrics.connection_opened(self.ctx.role)
        self.counted_open = True
        await self._send_frame({"type": "res", "id": request_id, "ok": True, "payload": hello})
        presence_changed(presence)

    async def _accept_once_approved(
        self, params: ConnectParams, context: ConnectContext, protocol: int, refused: HandshakeRejected
    ) -> tuple[RpcContext, dict[str, Any], Any]:
        """A node refused only for its pending pairing: its connect is held until an operator decides or the hold
        ends (``pairing_wait``), and accepted once approved (its proof signed this connection's nonce)."""
        await lifecycle.ensure_broadcast_subscribed()  # the decision arrives as a broadcast to this process
        with pairing_wait.held(params.device.id) as decided:
            # An approval committed after the refusal and before the hold began was broadcast to no one: decided
            # again now that any later decision is heard.
            try:
                return await database_sync_to_async(accept_connect)(params, context, protocol)
            except HandshakeRejected as again:
                if not _held_for_pairing(params, again):
                    raise
                refused = again
            if await pairing_wait.outcome(decided, pairing_wait.hold_seconds()) != "approved":
                raise refused
        return await database_sync_to_async(accept_connect)(params, context, protocol)

    async def _reject_handshake(
        self, request_id: str, rejected: HandshakeRejected, *, failure: str | None = None
    ) -> None:
        await self._send_frame(error_response(request_id, rejected.error))
        await self._close_handshake(
            rejected.close_code, rejected.close_reason, failure=failure or failure_reason(rejected.error)
        )

    async def _close_handshake(self, code: int, reason: str, *, failure: str) -> None:
        if self.phase != "closed":  # else counted already, where the frame before this close failed
            metrics.record_handshake_failure(failure)
        self.phase = "closed"
        self.handshake_timer.cancel()
        await self.close(code=code, reason=reason)

    async def _receive_open(self, text_data: str | None, bytes_data: bytes | None) -> None:
        if text_data is None:
            await self._send_frame(error_response(INVALID_FRAME_ID, FrameRejected("text frames only")))
            return
        big = is_big(text_data)
        try:
            # Awaited before the next frame is taken (channels hands a consumer one message at a time), so a
            # big frame decoded off the loop does not let a later small one start first.
            frame = await take_frame(text_data, max_payload=gateway_setting("MAX_PAYLOAD_BYTES"))
        except FrameRejected as rejected:
            await self._send_frame(error_response(rejected.frame_id, rejected))
            return
        if self.phase != "open":
            return  # closed while the frame was decoded
        if frame.type == "cancel":
            task = self.request_tasks.get(frame.id)
            if task is not None:
                task.cancel()
            return
        if frame.id in self.request_tasks:
            await self._send_frame(error_response(frame.id, InvalidRequest("duplicate request id in flight")))
            return
        if len(self.request_tasks) >= MAX_IN_FLIGHT_REQUESTS:
            await self._send_frame(
                error_response(frame.id, Unavailable("too many requests in flight", retryable=True, retry_after_ms=100))
            )
            return
        loop = asyncio.get_running_loop()
        started = loop.create_future() if big else None
        task = loop.create_task(self._answer(frame, started))
        self.request_tasks[frame.id] = task
        if started is not None:
            # Its params are validated off the loop: the next frame waits until its handler has started.
            await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)

    async def _answer(self, frame: RequestFrame, started: asyncio.Future[None] | None) -> None:
        try:
            response = await run_request(self.ctx, frame, started=started)
            if self.phase == "open":
                await self._send_frame(response)
        except asyncio.CancelledError:
            pass
        finally:
            self.request_tasks.pop(frame.id, None)

    # --- channel-layer messages -----------------------------------------------------------

    async def gateway_event(self, message: dict[str, Any]) -> None:
        ctx = self.ctx
        if self.phase != "open" or ctx is None:
            return
        if not event_visible(
            registry.events.get(message["event"]),
            role=ctx.role,
            scopes=ctx.scopes,
            subscriptions=ctx.subscriptions,
            direct=bool(message.get("direct")),
            subscription=message.get(SUBSCRIPTION_KEY),
        ):
            return
        await self.send_event(
            message["event"],
            message["payload"],
            state_version=message.get("stateVersion"),
            drop_if_slow=bool(message.get(DROP_IF_SLOW_KEY)),
        )
        follow_up = message.get(FOLLOW_UP_KEY)
        if follow_up is not None and self.phase == "open":
            # The event is in the transport's buffer: an answer this lets out goes after it.
            handler = state.delivery_handler(follow_up.get("type", ""))
            if handler is not None:
                try:
                    handler(follow_up, self.channel_name)
                except Exception:
                    logger.exception("connection %s: failed to handle %s", self.conn_id, follow_up.get("type"))

    async def gateway_close(self, message: dict[str, Any]) -> None:
        if self.phase == "open":
            self.phase = "closed"
            await self.close(code=message.get("code", 1008), reason=message.get("reason") or None)

    async def gateway_invoke_request(self, message: dict[str, Any]) -> None:
        await invoke.forward_to_node(self.ctx if self.phase == "open" else None, message, self._send_frame)

    async def gateway_invoke_result(self, message: dict[str, Any]) -> None:
        invoke.resolve(message)

    async def gateway_invoke_progress(self, message: dict[str, Any]) -> None:
        """Progress of an operator's ``node.invoke``: the operator gets the result only (nothing streams)."""

    # --- teardown -------------------------------------------------------------------------

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        """Channels' own version then sends a stale-connection check through the database thread, as
        its ``dispatch`` does (see :meth:`dispatch`): every database hop of this consumer, the cleanup's
        included, is a ``database_sync_to_async`` call that checks on its own, and the extra hop held
        the next connect's database work up. The consumer joins no groups to leave."""
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def disconnect(self, code: int) -> None:
        await self._cleanup()

    async def _cleanup(self) -> None:
        if getattr(self, "cleaned_up", True):
            return  # never connected, or already cleaned up
        self.cleaned_up = True
        was_open = self.ctx is not None
        self.phase = "closed"
        timer = getattr(self, "handshake_timer", None)
        if timer is not None:
            timer.cancel()
        for task in list(self.request_tasks.values()):
            task.cancel()
        if not was_open:
            return
        state.local_connections.discard(self)
        if getattr(self, "counted_open", False):  # as cleaned_up: a consumer set up without connect() has none
            metrics.connection_closed(self.ctx.role)
        # Each step on its own: a channel layer that fails (Redis out of connections in a burst of
        # disconnects) must not keep the connection registered, or it stays routable and in presence.
        for subscription in list(self.ctx.subscriptions):
            try:
                await self.channel_layer.group_discard(subscription_group(subscription), self.channel_name)
            except Exception:
                logger.exception("connection %s: failed to leave %s", self.conn_id, subscription_group(subscription))
        try:
            await invoke.fail_pending(self.ctx)
        except Exception:
            logger.exception("connection %s: failed to fail its pending invokes", self.conn_id)
        if state.is_stopping():
            return
        await self._unregister()

    async def _unregister(self) -> None:
        try:
            if await database_sync_to_async(connection_authority().connection_unregister)(conn_id=self.conn_id):
                presence_changed(None)
        except Exception:
            logger.exception("failed to unregister connection %s", self.conn_id)


def _held_for_pairing(params: ConnectParams, rejected: HandshakeRejected) -> bool:
    """Whether the refusal is a node's pending pairing, whose connect waits for an operator (``pairing_wait``)."""
    details = rejected.error.details if isinstance(rejected.error.details, dict) else {}
    return (
        params.role == "node"
        and details.get("code") == "PAIRING_REQUIRED"
        and params.device is not None
        and pairing_wait.hold_seconds() > 0
    )


def _header_names(scope: dict[str, Any]) -> set[bytes]:
    return {name.lower() for name, _value in scope.get("headers") or ()}


def _has_forwarded_headers(scope: dict[str, Any]) -> bool:
    """A proxy in front (``Forwarded``, ``X-Real-IP``, ``X-Forwarded-*``): the peer is not the client."""
    return any(
        name in (b"forwarded", b"x-real-ip") or name.startswith(b"x-forwarded-") for name in _header_names(scope)
    )


def _has_origin_header(scope: dict[str, Any]) -> bool:
    """Browsers send ``Origin`` with every WebSocket upgrade; native clients do not."""
    return any(name == b"origin" and value.strip() for name, value in scope.get("headers") or ())


__all__ = ["GatewayConsumer", "GatewayError"]
