"""Read-only methods answered on the event loop's thread: committed data, no writes, never holding the loop,
and a hop whenever the loop cannot answer at once (SQLite busy, every loop connection taken)."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path

import psycopg
import pytest
from django.db import OperationalError, connection, connections
from psycopg_pool import PoolTimeout

from gateway import loop_reads
from gateway import scopes as sc
from gateway.dispatch import run_request
from gateway.protocol import RequestFrame
from gateway.registry import EmptyParams, MethodRegistry, MethodSpec, registry
from sessions_app.models import Session
from sessions_app.services.sessions import session_ensure_main
from tests.support.connections import admin_operator_context
from tests.support.processes import current_database_url

SQLITE_ONLY = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="a SQLite reader's busy answer; PostgreSQL readers are never refused"
)
POSTGRESQL_ONLY = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="cooperative waits are PostgreSQL's (SQLite reads never wait)"
)


def _reads_only(monkeypatch, name: str, handler) -> None:
    spec = MethodSpec(
        name=name, handler=handler, params=EmptyParams, role="operator", scope=sc.READ, is_async=False, reads_only=True
    )
    monkeypatch.setitem(registry.methods, name, spec)


def _frame(method: str, request_id: str = "r", params: dict | None = None) -> RequestFrame:
    return RequestFrame(type="req", id=request_id, method=method, params=params)


def _on_the_loop(*frames: RequestFrame, concurrently: bool = False) -> list[dict]:
    """The frames' responses, answered by a loop that has loop reads enabled (one after another, or all at once)."""

    async def run() -> list[dict]:
        assert loop_reads.enable()
        try:
            if concurrently:
                return list(await asyncio.gather(*(run_request(admin_operator_context(), frame) for frame in frames)))
            return [await run_request(admin_operator_context(), frame) for frame in frames]
        finally:
            await loop_reads.disable()

    return asyncio.run(run())


# supported() only reads the two settings; no connection is made with the overridden ones.
@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_supported_with_sqlite_or_a_postgresql_pool(settings):
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/x.sqlite3"}

    def postgresql(pool):
        return {"ENGINE": "openclaw_site.postgresql", "NAME": "openclaw", "OPTIONS": {"pool": pool}}

    settings.DATABASES = {"default": sqlite, "harness": sqlite}
    assert loop_reads.supported()
    settings.DATABASES = {"default": postgresql({"max_size": 8}), "harness": sqlite}
    assert loop_reads.supported()
    settings.DATABASES = {"default": postgresql({"max_size": 1}), "harness": sqlite}  # too small a pool to share
    assert not loop_reads.supported()
    settings.DATABASES = {"default": postgresql(None), "harness": sqlite}
    assert not loop_reads.supported()
    settings.DATABASES = {"default": {"ENGINE": "django.db.backends.mysql", "NAME": "x"}, "harness": sqlite}
    assert not loop_reads.supported()


def test_methods_reading_the_cache_stay_on_the_loop_only_with_the_in_process_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://x"}}

    async def served() -> tuple[bool, bool]:
        assert loop_reads.enable()
        try:
            return loop_reads.serves(reads_cache=False), loop_reads.serves(reads_cache=True)
        finally:
            await loop_reads.disable()

    assert asyncio.run(served()) == (True, False)


def test_only_sync_handlers_can_be_reads_only():
    methods = MethodRegistry()

    async def handler(ctx, params):
        return {}

    with pytest.raises(RuntimeError, match="reads_only applies to sync handlers"):
        methods.method("test.async", reads_only=True)(handler)


def test_loop_reads_apply_to_the_loop_thread_only():
    async def enable_here() -> tuple[bool, bool, bool]:
        enabled = loop_reads.enable()
        here = loop_reads.serves(reads_cache=False)
        elsewhere = await asyncio.get_running_loop().run_in_executor(None, loop_reads.serves, False)
        await loop_reads.disable()
        return enabled, here, elsewhere

    assert asyncio.run(enable_here()) == (True, True, False)


@pytest.mark.django_db(transaction=True)
def test_a_reads_only_method_reads_committed_data_on_the_loop_thread_with_a_connection_of_its_own(monkeypatch):
    session_ensure_main(agent_id="main")
    thread_connection = connections["default"]  # this thread's, which the loop's calls must leave alone
    seen: list[tuple[int, object, bool]] = []

    def handler(ctx, params):
        seen.append((threading.get_ident(), connections["default"], _loop_running()))
        return {"keys": list(Session.objects.values_list("key", flat=True))}

    _reads_only(monkeypatch, "test.read", handler)
    first, second = _on_the_loop(_frame("test.read", "r1"), _frame("test.read", "r2"))

    assert first["payload"] == second["payload"] == {"keys": ["agent:main:main"]}
    assert [thread for thread, _, _ in seen] == [threading.get_ident()] * 2
    loop_connection = seen[0][1]
    assert loop_connection is not thread_connection and seen[1][1] is loop_connection  # kept across calls
    assert [running for _, _, running in seen] == [False, False]  # Django's guard lifted for the call only
    assert connections["default"] is thread_connection


@SQLITE_ONLY
@pytest.mark.django_db(transaction=True)
def test_a_loop_thread_without_open_connections_keeps_the_loop_connection_bound_between_calls(monkeypatch):
    # The gateway's case: nothing on the loop's thread uses Django's connections but these calls, so they
    # stay bound (no bind and unbind per call) until loop reads are disabled.
    session_ensure_main(agent_id="main")
    seen: list[object] = []

    def handler(ctx, params):
        seen.append(connections["default"])
        return {"count": Session.objects.count()}

    _reads_only(monkeypatch, "test.count", handler)
    outcome: dict = {}

    def loop_thread() -> None:
        # As on the gateway's main thread: a wrapper was made (a vendor read) but never connected.
        assert connections["default"].connection is None

        async def run() -> None:
            assert loop_reads.enable()
            outcome["answers"] = [
                await run_request(admin_operator_context(), _frame("test.count", str(n))) for n in range(2)
            ]
            outcome["bound_between_calls"] = _bound_connection()
            await loop_reads.disable()
            outcome["bound_after"] = _bound_connection()

        asyncio.run(run())

    thread = threading.Thread(target=loop_thread)
    thread.start()
    thread.join()

    assert [answer["payload"] for answer in outcome["answers"]] == [{"count": 1}] * 2
    assert seen[0] is seen[1] and outcome["bound_between_calls"] is seen[0]
    assert outcome["bound_after"] is None
    assert connections["default"] is not seen[0]  # this thread's own, untouched


def _bound_connection():
    """The calling loop thread's sync-view connection of ``default`` (None: none), as Django sees it outside a loop."""
    loop = asyncio.get_running_loop()
    asyncio.events._set_running_loop(None)
    try:
        return getattr(connections._connections, "default", None)
    finally:
        asyncio.events._set_running_loop(loop)


@pytest.mark.django_db(transaction=True)
def test_sessions_list_on_the_loop_answers_as_by_a_hop():
    session_ensure_main(agent_id="main")
    frame = _frame("sessions.list", "l", {"limit": 10})
    (on_loop,) = _on_the_loop(frame)
    by_hop = asyncio.run(run_request(admin_operator_context(), frame))

    assert on_loop["ok"] is True
    assert [row["key"] for row in on_loop["payload"]["sessions"]] == ["agent:main:main"]
    on_loop["payload"].pop("ts"), by_hop["payload"].pop("ts")
    assert on_loop == by_hop


@pytest.mark.django_db(transaction=True)
def test_a_write_in_a_reads_only_method_fails_generically_and_writes_nothing(monkeypatch, caplog):
    session_ensure_main(agent_id="main")

    def handler(ctx, params):
        Session.objects.filter(key="agent:main:main").update(label="written on the loop")
        return {"ok": True}

    _reads_only(monkeypatch, "test.writes", handler)
    with caplog.at_level(logging.ERROR):
        (response,) = _on_the_loop(_frame("test.writes", "w"))

    assert response["ok"] is False and response["error"]["code"] == "UNAVAILABLE"
    text = json.dumps(response)
    assert "read" not in text.replace("reference", "") and "UPDATE" not in text
    causes = [str(record.exc_info[1]) for record in caplog.records if record.exc_info]
    assert any("readonly" in cause or "read-only" in cause for cause in causes)
    assert Session.objects.get(key="agent:main:main").label in ("", None)


@SQLITE_ONLY
@pytest.mark.django_db(transaction=True)
def test_a_busy_sqlite_database_sends_the_call_to_a_hop(monkeypatch, tmp_path: Path):
    # A WAL reader is refused (SQLITE_BUSY) only while another connection holds the database in exclusive
    # locking mode; the loop never waits for it (busy_timeout 0): the call is run again by a hop.
    locked = tmp_path / "locked.sqlite3"
    holder = sqlite3.connect(locked, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("CREATE TABLE t (x)")
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    threads: list[int] = []

    def handler(ctx, params):
        threads.append(threading.get_ident())
        if len(threads) == 1:
            with connections["default"].wrap_database_errors:
                sqlite3.connect(locked, timeout=0).execute("SELECT * FROM t")
        return {"answeredBy": "hop" if threads[-1] != threads[0] else "loop"}

    _reads_only(monkeypatch, "test.busy", handler)
    try:
        (response,) = _on_the_loop(_frame("test.busy", "b"))
    finally:
        holder.close()

    assert response == {"type": "res", "id": "b", "ok": True, "payload": {"answeredBy": "hop"}}
    assert threads[0] == threading.get_ident() and threads[1] != threads[0]


@pytest.mark.django_db(transaction=True)
def test_an_error_other_than_busy_is_not_retried():
    async def run() -> None:
        loop_reads.enable()
        calls: list[int] = []

        def handler():
            calls.append(1)
            raise OperationalError("no such table: nowhere")

        try:
            with pytest.raises(OperationalError, match="no such table"):
                await loop_reads.call(handler)
            asyncio.get_running_loop()  # given back after the failure
            assert calls == [1]
        finally:
            await loop_reads.disable()

    asyncio.run(run())


@POSTGRESQL_ONLY
@pytest.mark.django_db(transaction=True)
def test_postgresql_reads_wait_on_the_loop_and_a_call_beyond_the_loop_connections_hops(monkeypatch):
    ticks = 0
    seen: list[tuple[int, int, int]] = []  # (thread, ticks before the query, ticks after)

    def handler(ctx, params):
        before = ticks
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_sleep(0.2)")
        seen.append((threading.get_ident(), before, ticks))
        return {"ok": True}

    _reads_only(monkeypatch, "test.sleep", handler)

    async def run() -> list[dict]:
        nonlocal ticks
        assert loop_reads.enable()
        slots = len(loop_reads._state.slots)
        # A slot takes an idle pooled connection or none (the call hops): the pool is grown first.
        await asyncio.to_thread(_grow_pool, slots + 1)

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        ticking = asyncio.get_running_loop().create_task(ticker())
        try:
            return list(
                await asyncio.gather(
                    *(run_request(admin_operator_context(), _frame("test.sleep", str(n))) for n in range(slots + 1))
                )
            )
        finally:
            ticking.cancel()
            await loop_reads.disable()

    responses = asyncio.run(run())

    assert all(response["ok"] for response in responses)
    on_loop = [entry for entry in seen if entry[0] == threading.get_ident()]
    by_hop = [entry for entry in seen if entry[0] != threading.get_ident()]
    assert len(by_hop) == 1 and len(on_loop) == len(responses) - 1
    # The loop kept running (the ticker ticked) while each of its own queries waited for the server.
    assert all(after > before for _, before, after in on_loop)
    _assert_pool_connections_writable()


@POSTGRESQL_ONLY
@pytest.mark.django_db(transaction=True)
def test_postgresql_a_call_cancelled_mid_query_frees_its_connection(monkeypatch):
    started = threading.Event()

    def slow(ctx, params):
        started.set()
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_sleep(5)")
        return {"ok": True}

    def quick(ctx, params):
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
            return {"value": cursor.fetchone()[0]}

    _reads_only(monkeypatch, "test.slow", slow)
    _reads_only(monkeypatch, "test.quick", quick)

    async def run() -> tuple[bool, list[dict]]:
        assert loop_reads.enable()
        try:
            slow_call = asyncio.get_running_loop().create_task(
                run_request(admin_operator_context(), _frame("test.slow"))
            )
            while not started.is_set():
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            slow_call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow_call
            free = all(not slot.busy for slot in loop_reads._state.slots)
            return free, [await run_request(admin_operator_context(), _frame("test.quick", str(n))) for n in range(3)]
        finally:
            await loop_reads.disable()

    free, answers = asyncio.run(run())

    assert free
    assert [answer["payload"] for answer in answers] == [{"value": 1}] * 3
    _assert_pool_connections_writable()


@POSTGRESQL_ONLY
@pytest.mark.django_db(transaction=True)
def test_postgresql_a_loop_connection_killed_between_calls_is_replaced(monkeypatch):
    def backend(ctx, params):
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return {"pid": cursor.fetchone()[0]}

    _reads_only(monkeypatch, "test.backend", backend)

    async def run() -> tuple[dict, list[dict]]:
        assert loop_reads.enable()
        try:
            first = await run_request(admin_operator_context(), _frame("test.backend", "first"))
            await asyncio.to_thread(_terminate, first["payload"]["pid"])
            later = [await run_request(admin_operator_context(), _frame("test.backend", str(n))) for n in range(3)]
            return first, later
        finally:
            await loop_reads.disable()

    first, later = asyncio.run(run())

    # At most one call fails (generically) on the killed connection; after it, calls run on another.
    assert sum(not answer["ok"] for answer in later) <= 1
    assert all(answer["error"]["code"] == "UNAVAILABLE" for answer in later if not answer["ok"])
    assert later[-1]["ok"] and later[-1]["payload"]["pid"] != first["payload"]["pid"]
    _assert_pool_connections_writable()


@POSTGRESQL_ONLY
@pytest.mark.django_db(transaction=True)
def test_postgresql_an_exhausted_pool_sends_calls_to_a_hop_without_holding_the_loop(monkeypatch):
    threads: list[int] = []

    def handler(ctx, params):
        threads.append(threading.get_ident())
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"ok": True}

    _reads_only(monkeypatch, "test.pool", handler)
    pool = connections["default"].pool
    pool.open()
    taken = []
    while True:  # every connection the pool may open, checked out by this test
        try:
            taken.append(pool.getconn(timeout=0.5))
        except PoolTimeout:
            break

    def give_back_soon() -> None:
        time.sleep(0.3)
        for pooled in taken:
            pool.putconn(pooled)

    async def run() -> tuple[dict, bool]:
        assert loop_reads.enable()
        try:
            releaser = threading.Thread(target=give_back_soon)
            releaser.start()
            answer = await run_request(admin_operator_context(), _frame("test.pool"))
            await asyncio.to_thread(releaser.join)
            backing_off = any(slot.idle_pool_after > time.monotonic() for slot in loop_reads._state.slots)
            return answer, backing_off
        finally:
            await loop_reads.disable()

    answer, backing_off = asyncio.run(run())

    assert taken and answer["ok"] is True
    # Tried on the loop (no idle connection: no wait), then answered by the hop once the pool had one again.
    assert len(threads) == 2 and threads[0] == threading.get_ident() and threads[1] != threads[0]
    assert backing_off  # the slot is not tried again at once: one short checkout attempt per second at most
    _assert_pool_connections_writable()


def _grow_pool(size: int) -> None:
    pool = connections["default"].pool
    pool.open()
    taken = [pool.getconn(timeout=10) for _ in range(size)]
    for pooled in taken:
        pool.putconn(pooled)


def _terminate(pid: int) -> None:
    with psycopg.connect(current_database_url(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def _assert_pool_connections_writable() -> None:
    """Every idle connection of the pool is as the pool gave it out: not left read-only by the loop."""
    pool = connections["default"].pool
    taken = []
    try:
        while pool.get_stats().get("pool_available", 0) > 0:
            taken.append(pool.getconn(timeout=1))
        for pooled in taken:
            assert pooled.execute("SHOW default_transaction_read_only").fetchone()[0] == "off"
    finally:
        for pooled in taken:
            pool.putconn(pooled)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
