"""An asyncio client for the gateway protocol.

Handshake (challenge → signed ``connect`` → ``hello-ok``), request/response correlation by id,
events (queue and callback), ``node.invoke.request`` handling for node-role clients, a tick
watchdog and reconnection with exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import platform as platform_module
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from . import CLIENT_VERSION, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION
from .identity import DeviceIdentity, IdentityStore, build_device_auth_payload

logger = logging.getLogger(__name__)

EventCallback = Callable[[dict[str, Any]], Awaitable[None] | None]
# (command, params) -> result payload; raise NodeCommandError to answer ok:false.
# While it runs, ``current_invoke.get()`` is the invoke being answered (to report progress).
InvokeHandler = Callable[[str, Any], Awaitable[Any]]
# Sends one progress payload; returns the response still to come (None: nothing to wait for).
ProgressSender = Callable[[dict[str, Any]], Awaitable["asyncio.Future[Any] | None"]]

PROGRESS_EVENT = "node.invoke.progress"
# While a pairing request waits for an operator: retry after 1 s, then each wait 1.25 times the last, up to 5 s
# (a connect is cheap for the gateway; the node connects within seconds of the approval).
PAIRING_RETRY_INITIAL_S = 1.0
PAIRING_RETRY_FACTOR = 1.25
PAIRING_RETRY_MAX_S = 5.0


class GatewayError(Exception):
    """An error ``res`` from the gateway."""

    def __init__(self, shape: dict[str, Any]):
        self.shape = shape
        self.code = shape.get("code", "UNAVAILABLE")
        self.message = shape.get("message", "")
        self.details = shape.get("details")
        self.retryable = shape.get("retryable")
        self.retry_after_ms = shape.get("retryAfterMs")
        super().__init__(f"{self.code}: {self.message}")


class ConnectError(GatewayError):
    """The gateway refused the handshake; ``close_code``/``close_reason`` tell how it closed."""

    def __init__(self, shape: dict[str, Any], close_code: int | None = None, close_reason: str | None = None):
        super().__init__(shape)
        self.close_code = close_code
        self.close_reason = close_reason


class HandshakeClosed(ConnectError):
    """The connection closed during the handshake, before the gateway answered ``connect``."""


class ConnectionClosed(Exception):
    def __init__(self, code: int | None, reason: str | None):
        super().__init__(f"connection closed ({code}): {reason or ''}")
        self.code = code
        self.reason = reason


class NodeCommandError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class InvokeContext:
    """The ``node.invoke.request`` a handler is answering: its ids, and a way to report progress.

    Progress goes out as ``node.event`` requests ``{event: "node.invoke.progress", payload: {id, seq,
    data}}`` with ``seq`` 1, 2, … in call order. :meth:`progress` returns once the frame is written
    to the socket, not after the gateway's answer: a streaming reply does not pay a round trip per
    piece, nor its result one for the last piece (the gateway forwards an invoke's result after the
    progress that arrived before it). Failing to send (the connection closed) is logged and
    swallowed: progress is advisory, the result is what counts.
    """

    def __init__(self, invoke_id: str, node_id: str, send: ProgressSender | None = None):
        self.invoke_id = invoke_id
        self.node_id = node_id
        self._send = send
        self._seq = 0
        self._lock = asyncio.Lock()

    @property
    def sent(self) -> int:
        """How many progress reports were handed to the connection so far."""
        return self._seq

    async def progress(self, data: dict[str, Any]) -> None:
        if self._send is None:
            return
        async with self._lock:  # seq order is send order, even when several tasks report
            self._seq += 1
            payload = {"id": self.invoke_id, "seq": self._seq, "data": data}
            try:
                answer = await self._send(payload)
            except (ConnectionClosed, websockets.ConnectionClosed) as closed:
                logger.debug("progress of invoke %s not sent: %s", self.invoke_id, closed)
                return
        if answer is not None:
            answer.add_done_callback(self._answered)

    def _answered(self, answer: asyncio.Future[Any]) -> None:
        if answer.cancelled():
            return
        error = answer.exception()  # retrieved, so a lost answer is never reported as unhandled
        if error is not None:
            logger.debug("progress of invoke %s got no answer: %s", self.invoke_id, error)
        elif not answer.result().get("ok"):
            logger.warning("gateway refused progress of invoke %s: %s", self.invoke_id, answer.result().get("error"))


current_invoke: contextvars.ContextVar[InvokeContext | None] = contextvars.ContextVar("current_invoke", default=None)


@dataclass
class ClientOptions:
    url: str
    token: str | None = None
    password: str | None = None
    role: str = "operator"
    scopes: list[str] | None = None
    client_id: str = "cli"
    client_mode: str = "cli"
    client_version: str = CLIENT_VERSION
    platform: str = field(default_factory=lambda: platform_module.system().lower() or "unknown")
    device_family: str | None = None
    display_name: str | None = None
    instance_id: str | None = None
    caps: list[str] = field(default_factory=list)
    commands: list[str] | None = None
    permissions: dict[str, bool] | None = None
    path_env: str | None = None
    # Device identity: an explicit one, or one kept in a state directory, or none.
    identity: DeviceIdentity | None = None
    state_dir: str | None = None
    use_device_token: bool = True
    payload_version: str = "v3"
    min_protocol: int = MIN_PROTOCOL_VERSION
    max_protocol: int = PROTOCOL_VERSION
    request_timeout: float = 30.0
    connect_timeout: float = 15.0
    max_message_bytes: int = 64 * 1024 * 1024


class GatewayClient:
    def __init__(
        self,
        options: ClientOptions,
        *,
        on_event: EventCallback | None = None,
        invoke_handler: InvokeHandler | None = None,
    ):
        self.options = options
        self.on_event = on_event
        self.invoke_handler = invoke_handler
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.hello: dict[str, Any] | None = None
        self._ws: ClientConnection | None = None
        self._pending: dict[str, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None
        self._invoke_tasks: set[asyncio.Task] = set()
        self._store = IdentityStore(options.state_dir) if options.state_dir else None
        self._identity = options.identity
        if self._identity is None and self._store is not None:
            self._identity = self._store.load_or_create()
        self._last_tick = time.monotonic()
        self.closed = asyncio.Event()
        self.close_code: int | None = None
        self.close_reason: str | None = None

    @property
    def identity(self) -> DeviceIdentity | None:
        return self._identity

    @property
    def device_id(self) -> str | None:
        return self._identity.device_id if self._identity else None

    # --- handshake ------------------------------------------------------------------------

    def _stored_device_token(self) -> str | None:
        if self._store is None or not self.options.use_device_token:
            return None
        return self._store.device_token(self.options.role)

    def build_connect_params(self, nonce: str, challenge_ts: int | None = None) -> dict[str, Any]:
        opts = self.options
        auth: dict[str, Any] = {}
        if opts.token:
            auth["token"] = opts.token
        if opts.password:
            auth["password"] = opts.password
        device_token = self._stored_device_token()
        if device_token:
            auth["deviceToken"] = device_token
        client: dict[str, Any] = {
            "id": opts.client_id,
            "version": opts.client_version,
            "platform": opts.platform,
            "mode": opts.client_mode,
        }
        for key, value in (
            ("displayName", opts.display_name),
            ("deviceFamily", opts.device_family),
            ("instanceId", opts.instance_id),
        ):
            if value:
                client[key] = value
        scopes = list(opts.scopes or [])
        params: dict[str, Any] = {
            "minProtocol": opts.min_protocol,
            "maxProtocol": opts.max_protocol,
            "client": client,
            "caps": list(opts.caps),
            "role": opts.role,
            "scopes": scopes,
        }
        if auth:
            params["auth"] = auth
        if opts.commands is not None:
            params["commands"] = list(opts.commands)
        if opts.permissions is not None:
            params["permissions"] = dict(opts.permissions)
        if opts.path_env is not None:
            params["pathEnv"] = opts.path_env
        if self._identity is not None:
            signed_at = int(time.time() * 1000)
            payload = build_device_auth_payload(
                version=opts.payload_version,
                device_id=self._identity.device_id,
                client_id=opts.client_id,
                client_mode=opts.client_mode,
                role=opts.role,
                scopes=scopes,
                signed_at_ms=signed_at,
                token=auth.get("token") or auth.get("deviceToken"),
                nonce=nonce,
                platform=opts.platform,
                device_family=opts.device_family,
            )
            params["device"] = {
                "id": self._identity.device_id,
                "publicKey": self._identity.public_key,
                "signature": self._identity.sign(payload),
                "signedAt": signed_at,
                "nonce": nonce,
            }
        return params

    async def connect(self, *, params_hook: Callable[[dict], dict] | None = None) -> dict[str, Any]:
        """Open the socket and complete the handshake; returns the ``hello-ok`` payload.

        ``params_hook`` lets tests tamper with the signed connect params before sending.
        """
        opts = self.options
        self.closed.clear()
        self._ws = await websockets.connect(
            opts.url, max_size=opts.max_message_bytes, open_timeout=opts.connect_timeout, ping_interval=None
        )
        try:
            challenge = await asyncio.wait_for(self._recv_json(), opts.connect_timeout)
            if challenge.get("event") != "connect.challenge":
                raise ConnectError({"code": "INVALID_REQUEST", "message": "expected connect.challenge"})
            nonce = challenge["payload"]["nonce"]
            params = self.build_connect_params(nonce, challenge["payload"].get("ts"))
            if params_hook is not None:
                params = params_hook(params)
            request_id = str(uuid.uuid4())
            await self._ws.send(json.dumps({"type": "req", "id": request_id, "method": "connect", "params": params}))
            while True:
                frame = await asyncio.wait_for(self._recv_json(), opts.connect_timeout)
                if frame.get("type") == "res" and frame.get("id") == request_id:
                    break
        except websockets.ConnectionClosed as closed:
            code, reason = _close_info(closed)
            raise HandshakeClosed(
                {"code": "UNAVAILABLE", "message": f"connection closed during handshake ({code}): {reason}"},
                close_code=code,
                close_reason=reason,
            ) from None
        if not frame.get("ok"):
            code, reason = await self._await_close()
            raise ConnectError(frame.get("error") or {}, close_code=code, close_reason=reason)
        self.hello = frame["payload"]
        token = (self.hello.get("auth") or {}).get("deviceToken")
        if token and self._store is not None:
            self._store.save_device_token(opts.role, token, self.hello["auth"].get("scopes", []))
        self._last_tick = time.monotonic()
        self._reader = asyncio.create_task(self._read_loop())
        self._watchdog = asyncio.create_task(self._tick_watchdog())
        return self.hello

    async def _await_close(self, timeout: float = 5.0) -> tuple[int | None, str | None]:
        assert self._ws is not None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    await self._ws.recv()
        except websockets.ConnectionClosed as closed:
            return _close_info(closed)
        except TimeoutError:
            return None, None

    async def _recv_json(self) -> dict[str, Any]:
        assert self._ws is not None
        raw = await self._ws.recv()
        return json.loads(raw)

    # --- steady state ---------------------------------------------------------------------

    async def _read_loop(self) -> None:
        assert self._ws is not None
        try:
            async for raw in self._ws:
                try:
                    frame = json.loads(raw)
                except (TypeError, ValueError):
                    logger.warning("gateway sent a non-JSON frame")
                    continue
                kind = frame.get("type")
                if kind == "res":
                    future = self._pending.pop(frame.get("id"), None)
                    if future is not None and not future.done():
                        future.set_result(frame)
                elif kind == "event":
                    await self._handle_event(frame)
        except websockets.ConnectionClosed:
            pass
        finally:
            code = self._ws.close_code
            reason = self._ws.close_reason
            self._mark_closed(code, reason)

    def _mark_closed(self, code: int | None, reason: str | None) -> None:
        self.close_code, self.close_reason = code, reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionClosed(code, reason))
        self._pending.clear()
        self.closed.set()

    async def _handle_event(self, frame: dict[str, Any]) -> None:
        if frame.get("event") == "tick":
            self._last_tick = time.monotonic()
        if frame.get("event") == "node.invoke.request" and self.invoke_handler is not None:
            task = asyncio.create_task(self._answer_invoke(frame.get("payload") or {}))
            self._invoke_tasks.add(task)
            task.add_done_callback(self._invoke_tasks.discard)
        await self.events.put(frame)
        if self.on_event is not None:
            result = self.on_event(frame)
            if asyncio.iscoroutine(result):
                await result

    async def _answer_invoke(self, request: dict[str, Any]) -> None:
        params_json = request.get("paramsJSON")
        params = json.loads(params_json) if isinstance(params_json, str) else None
        result: dict[str, Any] = {"id": request["id"], "nodeId": request["nodeId"]}
        invoke = InvokeContext(request["id"], request["nodeId"], self._send_progress)
        token = current_invoke.set(invoke)  # the handler (and the tasks it starts) see it
        try:
            payload = await self.invoke_handler(request["command"], params)
            result.update(ok=True, payloadJSON=json.dumps(payload))
        except NodeCommandError as error:
            result.update(ok=False, error={"code": error.code, "message": error.message})
        except Exception as exc:  # the node must always answer, or the caller waits for its timeout
            logger.exception("node command %s failed", request.get("command"))
            result.update(ok=False, error={"code": "UNAVAILABLE", "message": f"{type(exc).__name__}: {exc}"})
        finally:
            current_invoke.reset(token)
        with contextlib.suppress(ConnectionClosed, GatewayError, websockets.ConnectionClosed):
            await self.request("node.invoke.result", result)

    async def _send_progress(self, payload: dict[str, Any]) -> asyncio.Future[Any]:
        return await self.send_request("node.event", {"event": PROGRESS_EVENT, "payload": payload})

    async def _tick_watchdog(self) -> None:
        interval = ((self.hello or {}).get("policy") or {}).get("tickIntervalMs", 30_000) / 1000
        while self._ws is not None and not self.closed.is_set():
            await asyncio.sleep(interval)
            if time.monotonic() - self._last_tick > 2 * interval:
                logger.warning("no tick for %.0fs; closing", 2 * interval)
                await self._ws.close(code=4000, reason="tick timeout")
                return

    async def request(self, method: str, params: Any = None, *, timeout: float | None = None) -> Any:
        """Send a request and return its payload; raises :class:`GatewayError` on an error ``res``."""
        frame = await self.request_frame(method, params, timeout=timeout)
        if not frame.get("ok"):
            raise GatewayError(frame.get("error") or {})
        return frame.get("payload")

    async def request_frame(self, method: str, params: Any = None, *, timeout: float | None = None) -> dict:
        request_id, future = await self._send_request(method, params)
        try:
            return await asyncio.wait_for(future, timeout or self.options.request_timeout)
        except TimeoutError:
            with contextlib.suppress(websockets.ConnectionClosed):
                await self._ws.send(json.dumps({"type": "cancel", "id": request_id}))
            raise
        finally:
            self._pending.pop(request_id, None)

    async def send_request(self, method: str, params: Any = None) -> asyncio.Future[dict[str, Any]]:
        """Write a request frame now and return the future of its response frame, without waiting for it.

        Frames are written in call order. The future fails with :class:`ConnectionClosed` when the
        connection ends first; a caller that drops it should still retrieve that (``add_done_callback``).
        """
        _request_id, future = await self._send_request(method, params)
        return future

    async def _send_request(self, method: str, params: Any) -> tuple[str, asyncio.Future[dict[str, Any]]]:
        if self._ws is None or self.closed.is_set():
            raise ConnectionClosed(self.close_code, self.close_reason)
        request_id = str(uuid.uuid4())
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        message = {"type": "req", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            await self._ws.send(json.dumps(message))
        except BaseException:
            self._pending.pop(request_id, None)
            future.cancel()
            raise
        return request_id, future

    async def send_raw(self, data: str | bytes) -> None:
        """Send an arbitrary frame (tests of malformed input)."""
        assert self._ws is not None
        await self._ws.send(data)

    async def next_event(
        self, name: str | None = None, *, timeout: float = 10.0, predicate: Callable[[dict], bool] | None = None
    ) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.events.get()
                if (name is None or frame.get("event") == name) and (predicate is None or predicate(frame)):
                    return frame

    def drain_events(self) -> list[dict[str, Any]]:
        """Every event received and not taken yet, oldest first; taken now."""
        frames = []
        while True:
            try:
                frames.append(self.events.get_nowait())
            except asyncio.QueueEmpty:
                return frames

    async def close(self, code: int = 1000, reason: str = "") -> None:
        for task in (self._watchdog,):
            if task is not None:
                task.cancel()
        if self._ws is not None:
            await self._ws.close(code=code, reason=reason)
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def __aenter__(self) -> GatewayClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    # --- reconnecting runner --------------------------------------------------------------

    async def run_forever(
        self,
        *,
        on_connected: Callable[[GatewayClient], Awaitable[None]] | None = None,
        on_refused: Callable[[ConnectError], Awaitable[None] | None] | None = None,
        on_closed: Callable[[int | None, str | None], Awaitable[None]] | None = None,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
        pairing_retry_initial: float = PAIRING_RETRY_INITIAL_S,
        pairing_retry_max: float = PAIRING_RETRY_MAX_S,
        stop: asyncio.Event | None = None,
    ) -> None:
        """Stay connected: reconnect with exponential backoff (1 s → 30 s, jittered).

        A refused pairing keeps retrying (an operator may approve meanwhile), and faster: while the
        gateway answers "pairing required", every 1 s growing slowly to 5 s, so the connection follows an
        approval within seconds rather than after a 30 s backoff. Other refusals that retrying cannot fix
        (bad credentials, protocol mismatch) are raised.
        """
        delay = backoff_initial
        pairing_delay = pairing_retry_initial
        stop = stop or asyncio.Event()
        while not stop.is_set():
            wait, waiting_for_pairing = delay, False
            try:
                await self.connect()
                delay, pairing_delay = backoff_initial, pairing_retry_initial
                if on_connected is not None:
                    await on_connected(self)
                stop_wait = asyncio.create_task(stop.wait())
                closed_wait = asyncio.create_task(self.closed.wait())
                await asyncio.wait({stop_wait, closed_wait}, return_when=asyncio.FIRST_COMPLETED)
                stop_wait.cancel()
                closed_wait.cancel()
                if stop.is_set():
                    await self.close()
                    return
                logger.warning("gateway connection closed (%s %s); reconnecting", self.close_code, self.close_reason)
                if on_closed is not None:
                    await on_closed(self.close_code, self.close_reason)
            except ConnectError as error:
                if on_refused is not None:
                    refused = on_refused(error)
                    if asyncio.iscoroutine(refused):
                        await refused
                if (error.code != "NOT_PAIRED" and error.close_code in (1002,)) or (error.details or {}).get(
                    "code"
                ) in ("AUTH_TOKEN_MISMATCH", "AUTH_PASSWORD_MISMATCH"):
                    raise
                waiting_for_pairing = awaits_pairing(error)
                if waiting_for_pairing:
                    wait, pairing_delay = pairing_delay, min(pairing_retry_max, pairing_delay * PAIRING_RETRY_FACTOR)
                    # Said once per request by the caller (``on_refused``); a line per retry would be noise.
                    logger.debug("pairing pending: %s; retrying in %.1fs", error, wait)
                    delay = backoff_initial
                else:
                    logger.warning("connect refused: %s; retrying in %.1fs", error, wait)
            except (OSError, websockets.WebSocketException, TimeoutError) as error:
                logger.warning("gateway unreachable (%s); retrying in %.1fs", error, wait)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait * (0.8 + 0.4 * random.random())):
                    await stop.wait()
            if not waiting_for_pairing:
                delay = min(backoff_max, delay * 2)


def awaits_pairing(error: ConnectError) -> bool:
    """The gateway refused the connect only because an operator has not approved this device yet (the
    refusal OpenClaw's gateway sends as ``NOT_PAIRED`` with details ``PAIRING_REQUIRED``), and did not ask
    the client to stop reconnecting."""
    details = error.details or {}
    return (
        error.code == "NOT_PAIRED"
        and details.get("code") == "PAIRING_REQUIRED"
        and details.get("pauseReconnect") is not True
    )


def _close_info(closed: websockets.ConnectionClosed) -> tuple[int | None, str | None]:
    frame = closed.rcvd
    if frame is None:
        return None, None
    return frame.code, frame.reason
