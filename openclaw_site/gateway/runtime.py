"""Process-local gateway state: boot id, live consumers, pending node invokes, background loop.

Everything here lives in one gateway process; what other processes must see goes through the
database (``GatewayConnection``) or the channel layer.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from channels.db import database_sync_to_async
from django.conf import settings

from .conf import gateway_setting

if TYPE_CHECKING:
    from .consumers import GatewayConsumer

logger = logging.getLogger(__name__)

BOOT_ID = str(uuid.uuid4())
STARTED_AT = time.time()
# Kept so the startup task is not garbage-collected while it runs.
STARTUP_TASK: asyncio.Task | None = None


def uptime_ms() -> int:
    return int((time.time() - STARTED_AT) * 1000)


class LocalConnections:
    """The authenticated consumers of this process, for ticks and the shutdown broadcast."""

    def __init__(self) -> None:
        self._consumers: set[GatewayConsumer] = set()

    def add(self, consumer: GatewayConsumer) -> None:
        self._consumers.add(consumer)
        ensure_background_loop()

    def discard(self, consumer: GatewayConsumer) -> None:
        self._consumers.discard(consumer)

    def __iter__(self):
        return iter(list(self._consumers))

    def __len__(self) -> int:
        return len(self._consumers)


local_connections = LocalConnections()


class InvokeBroker:
    """Futures of ``node.invoke`` calls made on this process, resolved by routed results."""

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


invoke_broker = InvokeBroker()

_state: dict[str, Any] = {
    "loop_task": None,
    "listener_task": None,
    "registered": False,
    "stopping": False,
    "main_loop": None,
}

# Gateway processes join this group with one process-level channel each, for notifications that
# are about the process rather than a connection (a run finished: wake agent.wait callers).
PROCESS_GROUP = "gateway.processes"


# --- the event loop of this process and in-process background work --------------------------

_in_process_worker: contextvars.ContextVar[bool] = contextvars.ContextVar("in_process_worker", default=False)


def in_process_worker() -> bool:
    return _in_process_worker.get() or threading.current_thread().name.startswith("openclaw-task")


def set_main_loop(loop: asyncio.AbstractEventLoop) -> None:
    _state["main_loop"] = loop


def main_loop() -> asyncio.AbstractEventLoop | None:
    loop = _state["main_loop"]
    return loop if loop is not None and loop.is_running() else None


def run_in_process(fn: Callable[..., Any], *args: Any) -> None:
    """Run a sync task function in a worker thread of this process.

    On the gateway's event loop when there is one, so that what the task publishes through the
    channel layer reaches this process's consumers; otherwise (a shell, a unit test) in a thread.
    """
    loop = main_loop()
    if loop is None:
        thread = threading.Thread(target=_run_task_in_thread, args=(fn, args), name="openclaw-task", daemon=True)
        thread.start()
        return
    from channels.db import DatabaseSyncToAsync

    async def runner() -> None:
        try:
            await DatabaseSyncToAsync(_run_task, thread_sensitive=False)(fn, args)
        except Exception:
            logger.exception("in-process task %s failed", getattr(fn, "name", fn))

    asyncio.run_coroutine_threadsafe(runner(), loop)


def _run_task_in_thread(fn: Callable[..., Any], args: tuple) -> None:
    from django.db import connections

    try:
        _run_task(fn, args)
    finally:
        # This thread ends now: its connections would otherwise stay open until garbage collection.
        connections.close_all()


def _run_task(fn: Callable[..., Any], args: tuple) -> None:
    from django.db import close_old_connections

    token = _in_process_worker.set(True)
    try:
        fn(*args)
    except Exception:
        logger.exception("in-process task %s failed", getattr(fn, "name", fn))
    finally:
        _in_process_worker.reset(token)
        close_old_connections()


# --- process-level notifications ------------------------------------------------------------

_process_handlers: dict[str, Callable[[dict[str, Any]], None]] = {}


def on_process_message(message_type: str, handler: Callable[[dict[str, Any]], None]) -> None:
    """Handle channel-layer messages sent to every gateway process (see :data:`PROCESS_GROUP`)."""
    _process_handlers[message_type] = handler


def ensure_process_listener() -> None:
    task = _state["listener_task"]
    if task is None or task.done():
        _state["listener_task"] = asyncio.get_running_loop().create_task(_process_listener())


async def _process_listener() -> None:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    # The default prefix on purpose: channels_redis runs one receive loop per layer for process-
    # specific channels, and a channel with another prefix would starve the consumers' channels.
    channel = await layer.new_channel()
    joined_at = 0.0
    while not _state["stopping"]:
        try:
            if time.monotonic() - joined_at > 3600:
                # Redis group membership expires after a day; renew it well before.
                await layer.group_add(PROCESS_GROUP, channel)
                joined_at = time.monotonic()
            message = await layer.receive(channel)
            handler = _process_handlers.get(message.get("type", ""))
            if handler is not None:
                handler(message)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("process listener failed; retrying")
            await asyncio.sleep(1)


HEALTH_MAX_AGE_S = 1.0
_health: dict[str, Any] = {"snapshot": None, "probed_at": 0.0, "lock": None}


def last_health() -> dict[str, Any] | None:
    return _health["snapshot"]


async def health_snapshot(probe) -> dict[str, Any]:
    """The latest health probe, re-run (once, whoever asks) when older than a second.

    Like OpenClaw's gateway, ``health`` answers from a recent probe instead of probing the
    database on every call; ``probedAtMs`` says how fresh it is.
    """
    if _health["lock"] is None:
        _health["lock"] = asyncio.Lock()
    if time.monotonic() - _health["probed_at"] > HEALTH_MAX_AGE_S:
        async with _health["lock"]:
            if time.monotonic() - _health["probed_at"] > HEALTH_MAX_AGE_S:
                _health["snapshot"] = await database_sync_to_async(probe)()
                _health["probed_at"] = time.monotonic()
    return _health["snapshot"]


def ensure_background_loop() -> None:
    loop = asyncio.get_running_loop()
    if _state["main_loop"] is None:
        _state["main_loop"] = loop
    task = _state["loop_task"]
    if task is None or task.done():
        _state["loop_task"] = loop.create_task(_background_loop())
    ensure_process_listener()


def is_stopping() -> bool:
    return bool(_state["stopping"])


async def ensure_process_registered() -> None:
    if not _state["registered"]:
        from . import services

        await database_sync_to_async(services.process_register)(boot_id=BOOT_ID)
        _state["registered"] = True


SWEEP_INTERVAL_S = 15
_sweeps: list[Callable[[], Any]] = []
_startup_hooks: list[Callable[[], Any]] = []


def on_sweep(fn: Callable[[], Any]) -> None:
    """A periodic recovery function run by the gateway loop when embedded (Celery beat otherwise)."""
    _sweeps.append(fn)


def on_startup(fn: Callable[[], Any]) -> None:
    """A sync function run once in the database thread when a gateway process starts."""
    _startup_hooks.append(fn)


async def startup() -> None:
    """Process start (``serve``): register the process, start the loops, run the apps' startup hooks."""
    ensure_background_loop()
    await ensure_process_registered()
    for hook in _startup_hooks:
        try:
            await database_sync_to_async(hook)()
        except Exception:
            logger.exception("startup hook %s failed", hook)


async def _background_loop() -> None:
    """Ticks to local connections, this process's heartbeat and (embedded profile) the sweep."""
    from . import services

    tick_s = gateway_setting("TICK_INTERVAL_MS") / 1000
    heartbeat_s = gateway_setting("PROCESS_HEARTBEAT_INTERVAL_MS") / 1000
    run_sweeps_here = not settings.REDIS_URL  # production runs the sweep in Celery beat
    now = time.monotonic()
    next_tick, next_heartbeat, next_sweep = now + tick_s, now + heartbeat_s, now + SWEEP_INTERVAL_S
    while not _state["stopping"]:
        await asyncio.sleep(max(0.05, min(next_tick, next_heartbeat, next_sweep) - time.monotonic()))
        now = time.monotonic()
        try:
            if now >= next_tick:
                next_tick = now + tick_s
                ts = int(time.time() * 1000)
                for consumer in local_connections:
                    await consumer.send_event("tick", {"ts": ts})
            if now >= next_heartbeat:
                next_heartbeat = now + heartbeat_s
                await database_sync_to_async(services.process_heartbeat)(boot_id=BOOT_ID)
            if run_sweeps_here and now >= next_sweep:
                next_sweep = now + SWEEP_INTERVAL_S
                await database_sync_to_async(services.gateway_sweep)()
                for sweep in _sweeps:
                    await database_sync_to_async(sweep)()
        except asyncio.CancelledError:
            raise
        except Exception:
            # The loop must outlive a database hiccup; the next round retries.
            logger.exception("gateway background loop round failed")


async def shutdown(reason: str = "gateway stopping", restart_expected_ms: int | None = None) -> None:
    """Tell every local connection we are going away, close them, and leave the registry."""
    from . import services

    _state["stopping"] = True
    payload: dict[str, Any] = {"reason": reason}
    if restart_expected_ms is not None:
        payload["restartExpectedMs"] = restart_expected_ms
    consumers = list(local_connections)
    for consumer in consumers:
        try:
            await consumer.send_event("shutdown", payload)
            await consumer.close(code=1012, reason="gateway shutdown")
        except Exception:
            logger.exception("failed to send shutdown to a connection")
    try:
        await database_sync_to_async(services.process_unregister)(boot_id=BOOT_ID)
    except Exception:
        logger.exception("failed to unregister gateway process")
    for name in ("loop_task", "listener_task"):
        task = _state[name]
        if task is not None:
            task.cancel()
