"""Starting, running and stopping one gateway process.

At start (``serve``): register the process, start the background loop (ticks, heartbeat, the
embedded profile's sweeps, the executor watches) and the process listener, run the apps' startup hooks. At
``SIGTERM``: tell every local connection ``shutdown``, close them, leave the process registry. Apps add their
own startup hooks, sweeps and watches with :func:`on_startup` / :func:`on_sweep` / :func:`on_watch` from their
``ready()``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.db import DatabaseSyncToAsync, database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache

from . import background, broadcast, pairing_wait, state, task_consumers
from .conf import gateway_setting
from .events import BROADCAST_GROUP
from .ports import connection_authority
from .protocol import EncodedEvent
from .services import connections as connection_services
from .services.sweep import gateway_sweep

logger = logging.getLogger(__name__)

# Redis group membership expires after a day (channels_redis ``group_expiry``); renew well before.
PROCESS_GROUP_RENEW_S = 3600

_sweeps: list[Callable[[], Any]] = []
_watches: list[Callable[[], Any]] = []
_startup_hooks: list[Callable[[], Any]] = []
# Taken by the gateway process that runs the watches of its turn queue this interval (the others skip it).
WATCH_TURN_KEY = "gateway:executor-watch:{queue}"


class _Tasks:
    def __init__(self) -> None:
        self.loop_task: asyncio.Task | None = None
        self.listener_task: asyncio.Task | None = None
        self.startup_task: asyncio.Task | None = None
        # Creates the process channel and joins it to the process and broadcast groups, once.
        self.subscription_task: asyncio.Task[str] | None = None
        self.registered = False


_tasks = _Tasks()


def on_sweep(fn: Callable[[], Any]) -> None:
    """A periodic recovery function run by the gateway loop when embedded (Celery beat otherwise)."""
    _sweeps.append(fn)


def on_watch(fn: Callable[[], Any]) -> None:
    """A check of the Celery worker processes' leases (``executor_leases``), run every
    ``EXECUTOR_WATCH_INTERVAL_MS`` by one gateway process of the deployment. Not a beat task: it must not wait
    behind a queue of turns for a free worker, nor stop with beat."""
    _watches.append(fn)


def on_startup(fn: Callable[[], Any]) -> None:
    """A sync function run once in the database thread when a gateway process starts."""
    _startup_hooks.append(fn)


def ensure_started() -> None:
    """Start this process's background loop and process listener (idempotent; on the running loop)."""
    loop = asyncio.get_running_loop()
    if state.main_loop() is None:
        state.set_main_loop(loop)
    if _tasks.loop_task is None or _tasks.loop_task.done():
        _tasks.loop_task = loop.create_task(_background_loop())
    if _tasks.listener_task is None or _tasks.listener_task.done():
        _tasks.listener_task = loop.create_task(_process_listener())


async def ensure_process_registered() -> None:
    if not _tasks.registered:
        await database_sync_to_async(connection_services.process_register)(boot_id=state.BOOT_ID)
        _tasks.registered = True


async def ensure_broadcast_subscribed() -> str:
    """This process's channel, once it is in the broadcast group (a connection opens only after that)."""
    loop = asyncio.get_running_loop()
    task = _tasks.subscription_task
    failed = task is not None and task.done() and (task.cancelled() or task.exception() is not None)
    if task is None or failed or task.get_loop() is not loop:
        task = _tasks.subscription_task = loop.create_task(_join_process_groups(None))
    # Shielded: a connection that goes away while waiting must not cancel it for the others.
    return await asyncio.shield(task)


async def _join_process_groups(channel: str | None) -> str:
    layer = get_channel_layer()
    # The default prefix on purpose: channels_redis runs one receive loop per layer for process-
    # specific channels, and a channel with another prefix would starve the consumers' channels.
    channel = channel or await layer.new_channel()
    for group in (state.PROCESS_GROUP, BROADCAST_GROUP):
        await layer.group_add(group, channel)
    return channel


def start_in_background(loop: asyncio.AbstractEventLoop) -> None:
    """Called by the server once it listens: :func:`startup` as a task (kept referenced while it runs)."""
    background.use_work_threads(loop)
    state.set_main_loop(loop)
    state.startup_begun()
    _tasks.startup_task = loop.create_task(startup())


async def startup() -> None:
    """Process start (``serve``): register the process, start the loops, run the apps' startup hooks
    (recovery among them). Until they have run, operators' reads wait (``state.wait_until_serving``)."""
    try:
        await _start()
    finally:
        # A hook that failed is logged; the periodic sweep retries what it left. Serving must not hang on it.
        state.startup_finished()


async def _start() -> None:
    ensure_started()
    await ensure_process_registered()
    # A predecessor killed on this host still looks live for a heartbeat timeout: its connections are
    # forgotten first, so that the apps' recovery does not take its nodes for connected.
    try:
        await _off_the_request_thread(gateway_sweep)
    except Exception:
        logger.exception("startup gateway sweep failed")
    for hook in _startup_hooks:
        try:
            await _off_the_request_thread(hook)
        except Exception:
            logger.exception("startup hook %s failed", hook)


# Threads of their own: recovery, sweeps and watches must run however busy the task pool and the default executor
# are (turns, and requests waiting on nodes and providers).
_recovery_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gateway-recovery")


async def _off_the_request_thread(fn: Callable[[], Any]) -> Any:
    """Recovery work in a pool of its own: a long sweep (or a provider it waits on) must not hold the one
    thread that every request's database work goes through, nor wait behind in-process tasks."""
    return await DatabaseSyncToAsync(fn, thread_sensitive=False, executor=_recovery_pool)()


# One thread of its own: the heartbeat must neither wait behind a long sweep (the process would look
# dead) nor hold up the ticks while the request thread is busy (every client's tick watchdog would close
# its connection at once, and their reconnects would keep the thread busy).
_heartbeat_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-heartbeat")


async def _heartbeat() -> None:
    try:
        await DatabaseSyncToAsync(
            connection_services.process_heartbeat, thread_sensitive=False, executor=_heartbeat_pool
        )(boot_id=state.BOOT_ID)
    except Exception:
        # The next round retries; a process that keeps failing goes stale, as it should.
        logger.exception("gateway process heartbeat failed")


async def _run_sweeps() -> None:
    for sweep in (gateway_sweep, *_sweeps):
        try:
            await _off_the_request_thread(sweep)
        except Exception:
            logger.exception("sweep %s failed", getattr(sweep, "__name__", sweep))


def watch_turn_key() -> str:
    return WATCH_TURN_KEY.format(queue=task_consumers.turn_queue())


def watch_turn_taken() -> bool:
    """Whether this process runs the watches this interval: the first process of its turn queue to ask in an
    interval does. Per queue: the pickup watch asks the broker about this process's queue, so processes that share
    a cache but not a queue (deployments sharing a Redis prefix, test gateways) must not take each other's turns, or
    the one a little ahead in its schedule would take every turn and the other queue's unclaimed turns would never
    fail. The watches act on the whole database: the gateways of one database serve one queue."""
    interval_s = gateway_setting("EXECUTOR_WATCH_INTERVAL_MS") / 1000
    return cache.add(watch_turn_key(), state.BOOT_ID, timeout=interval_s)


def run_watches() -> None:
    """The watches, when it is this process's turn."""
    if not watch_turn_taken():
        return
    for watch in _watches:
        try:
            watch()
        except Exception:
            logger.exception("watch %s failed", getattr(watch, "__name__", watch))


async def _run_watches() -> None:
    try:
        await _off_the_request_thread(run_watches)
    except Exception:
        # The cache is unreachable (the turn could not be taken): the next interval retries.
        logger.exception("executor watch failed")


async def _process_listener() -> None:
    """Receives what is sent to this process as a whole: notifications and the broadcast events."""
    layer = get_channel_layer()
    channel: str | None = None
    joined_at = 0.0
    while not state.is_stopping():
        try:
            if channel is None:
                channel = await ensure_broadcast_subscribed()
                joined_at = time.monotonic()
            elif time.monotonic() - joined_at > PROCESS_GROUP_RENEW_S:
                await _join_process_groups(channel)
                joined_at = time.monotonic()
            message = await layer.receive(channel)
            if broadcast.is_broadcast(message):
                pairing_wait.notice(message)
                await broadcast.fan_out(message)
                continue
            handler = state.process_message_handler(message.get("type", ""))
            if handler is not None:
                handler(message)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("process listener failed; retrying")
            await asyncio.sleep(1)


async def _background_loop() -> None:
    """Ticks to local connections, this process's heartbeat, the executor watches (when turns run in Celery
    workers) and (embedded profile) the sweeps."""
    tick_s = gateway_setting("TICK_INTERVAL_MS") / 1000
    heartbeat_s = gateway_setting("PROCESS_HEARTBEAT_INTERVAL_MS") / 1000
    run_sweeps_here = not settings.REDIS_URL  # production runs the sweeps in Celery beat
    sweep_s = gateway_setting("SWEEP_INTERVAL_MS") / 1000
    run_watches_here = background.task_mode() == "celery"
    watch_s = gateway_setting("EXECUTOR_WATCH_INTERVAL_MS") / 1000
    now = time.monotonic()
    next_tick, next_heartbeat, next_sweep, next_watch = now + tick_s, now + heartbeat_s, now + sweep_s, now + watch_s
    # A sweep, a watch and the heartbeat run beside the ticks, never in their way.
    sweeping: asyncio.Task | None = None
    watching: asyncio.Task | None = None
    heartbeating: asyncio.Task | None = None
    while not state.is_stopping():
        wake_at = min(next_tick, next_heartbeat, next_sweep, next_watch if run_watches_here else next_tick)
        await asyncio.sleep(max(0.05, wake_at - time.monotonic()))
        now = time.monotonic()
        try:
            if now >= next_tick:
                next_tick = now + tick_s
                tick = EncodedEvent.of("tick", {"ts": int(time.time() * 1000)})
                for consumer in state.local_connections:
                    await consumer.send_encoded_event(tick)
            if now >= next_heartbeat:
                next_heartbeat = now + heartbeat_s
                if heartbeating is None or heartbeating.done():
                    heartbeating = asyncio.create_task(_heartbeat())
            if run_sweeps_here and now >= next_sweep:
                next_sweep = now + sweep_s
                if sweeping is None or sweeping.done():
                    sweeping = asyncio.create_task(_run_sweeps())
            if run_watches_here and now >= next_watch:
                next_watch = now + watch_s
                if watching is None or watching.done():
                    watching = asyncio.create_task(_run_watches())
        except asyncio.CancelledError:
            raise
        except Exception:
            # The loop must outlive a database hiccup; the next round retries.
            logger.exception("gateway background loop round failed")


async def shutdown(reason: str = "gateway stopping", restart_expected_ms: int | None = None) -> None:
    """Tell every local connection we are going away, close them, and leave the registry."""
    state.mark_stopping()
    payload: dict[str, Any] = {"reason": reason}
    if restart_expected_ms is not None:
        payload["restartExpectedMs"] = restart_expected_ms
    for consumer in list(state.local_connections):
        try:
            await consumer.send_event("shutdown", payload)
            await consumer.close(code=1012, reason="gateway shutdown")
        except Exception:
            logger.exception("failed to send shutdown to a connection")
    try:
        await database_sync_to_async(connection_authority().process_unregister)(boot_id=state.BOOT_ID)
    except Exception:
        logger.exception("failed to unregister gateway process")
    for task in (_tasks.loop_task, _tasks.listener_task):
        if task is not None:
            task.cancel()
