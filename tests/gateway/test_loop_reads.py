"""Read-only methods answered on the event loop (embedded profile): committed data, no writes, busy → hop."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
from pathlib import Path

import pytest
from django.db import OperationalError, connections

from openclaw_site.gateway import loop_reads
from openclaw_site.gateway import scopes as sc
from openclaw_site.gateway.context import RpcContext
from openclaw_site.gateway.dispatch import run_request
from openclaw_site.gateway.protocol import RequestFrame
from openclaw_site.gateway.registry import EmptyParams, MethodRegistry, MethodSpec, registry
from sessions_app.models import Session
from sessions_app.services.sessions import session_ensure_main

EMBEDDED_ONLY = pytest.mark.skipif(
    not loop_reads.supported(),
    reason="answering on the event loop is the embedded profile's (SQLite); on PostgreSQL these methods hop",
)


def _ctx() -> RpcContext:
    return RpcContext(
        conn_id="c",
        channel_name="inmemory!c",
        role=sc.ROLE_OPERATOR,
        scopes=[sc.ADMIN],
        auth_method="token",
        client_id="test",
        client_mode="test",
    )


def _reads_only(monkeypatch, name: str, handler) -> None:
    spec = MethodSpec(
        name=name, handler=handler, params=EmptyParams, role="operator", scope=sc.READ, is_async=False, reads_only=True
    )
    monkeypatch.setitem(registry.methods, name, spec)


def _on_the_loop(*frames: RequestFrame) -> list[dict]:
    """The frames' responses, answered one after another by a loop that has loop reads enabled."""

    async def run() -> list[dict]:
        assert loop_reads.enable()
        try:
            return [await run_request(_ctx(), frame) for frame in frames]
        finally:
            loop_reads.disable()

    return asyncio.run(run())


# supported() only reads the two settings; no connection is made with the overridden ones.
@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_supported_only_on_sqlite_with_the_in_process_cache(settings):
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/x.sqlite3"}
    postgresql = {"ENGINE": "openclaw_site.postgresql", "NAME": "openclaw"}
    memory = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    redis = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:6379/0"}

    settings.DATABASES = {"default": sqlite, "harness": sqlite}
    settings.CACHES = {"default": memory}
    assert loop_reads.supported()
    settings.DATABASES = {"default": sqlite, "harness": postgresql}
    assert not loop_reads.supported()
    settings.DATABASES = {"default": sqlite, "harness": sqlite}
    settings.CACHES = {"default": redis}
    assert not loop_reads.supported()


def test_only_sync_handlers_can_be_reads_only():
    methods = MethodRegistry()

    async def handler(ctx, params):
        return {}

    with pytest.raises(RuntimeError, match="reads_only applies to sync handlers"):
        methods.method("test.async", reads_only=True)(handler)


def test_loop_reads_apply_to_the_loop_thread_only():
    async def enable_here() -> bool:
        enabled = loop_reads.enable()
        seen_elsewhere = await asyncio.get_running_loop().run_in_executor(None, loop_reads.enabled)
        loop_reads.disable()
        return enabled and loop_reads.enabled() is False and seen_elsewhere is False

    assert asyncio.run(enable_here()) is loop_reads.supported()


@EMBEDDED_ONLY
@pytest.mark.django_db(transaction=True)
def test_a_reads_only_method_reads_committed_data_on_the_loop_thread_with_a_connection_of_its_own(monkeypatch):
    session_ensure_main(agent_id="main")
    thread_connection = connections["default"]  # this thread's, which the loop's calls must leave alone
    seen: list[tuple[int, object, bool]] = []

    def handler(ctx, params):
        seen.append((threading.get_ident(), connections["default"], _loop_running()))
        return {"keys": list(Session.objects.values_list("key", flat=True))}

    _reads_only(monkeypatch, "test.read", handler)
    first, second = _on_the_loop(
        RequestFrame(type="req", id="r1", method="test.read"), RequestFrame(type="req", id="r2", method="test.read")
    )

    assert first["payload"] == second["payload"] == {"keys": ["agent:main:main"]}
    assert [thread for thread, _, _ in seen] == [threading.get_ident()] * 2
    loop_connection = seen[0][1]
    assert loop_connection is not thread_connection and seen[1][1] is loop_connection  # kept across calls
    assert [running for _, _, running in seen] == [False, False]  # Django's guard lifted for the call only
    assert connections["default"] is thread_connection


@EMBEDDED_ONLY
@pytest.mark.django_db(transaction=True)
def test_sessions_list_on_the_loop_answers_as_by_a_hop():
    session_ensure_main(agent_id="main")
    frame = RequestFrame(type="req", id="l", method="sessions.list", params={"limit": 10})
    (on_loop,) = _on_the_loop(frame)
    by_hop = asyncio.run(run_request(_ctx(), frame))

    assert on_loop["ok"] is True
    assert [row["key"] for row in on_loop["payload"]["sessions"]] == ["agent:main:main"]
    on_loop["payload"].pop("ts"), by_hop["payload"].pop("ts")
    assert on_loop == by_hop


@EMBEDDED_ONLY
@pytest.mark.django_db(transaction=True)
def test_a_write_in_a_reads_only_method_fails_generically_and_writes_nothing(monkeypatch, caplog):
    session_ensure_main(agent_id="main")

    def handler(ctx, params):
        Session.objects.filter(key="agent:main:main").update(label="written on the loop")
        return {"ok": True}

    _reads_only(monkeypatch, "test.writes", handler)
    with caplog.at_level(logging.ERROR):
        (response,) = _on_the_loop(RequestFrame(type="req", id="w", method="test.writes"))

    assert response["ok"] is False and response["error"]["code"] == "UNAVAILABLE"
    assert "readonly" not in json.dumps(response) and "UPDATE" not in json.dumps(response)
    assert any("readonly" in str(record.exc_info[1]) for record in caplog.records if record.exc_info)
    assert Session.objects.get(key="agent:main:main").label in ("", None)


@EMBEDDED_ONLY
@pytest.mark.django_db(transaction=True)
def test_a_busy_database_sends_the_call_to_a_hop(monkeypatch, tmp_path: Path):
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
        (response,) = _on_the_loop(RequestFrame(type="req", id="b", method="test.busy"))
    finally:
        holder.close()

    assert response == {"type": "res", "id": "b", "ok": True, "payload": {"answeredBy": "hop"}}
    assert threads[0] == threading.get_ident() and threads[1] != threads[0]


@EMBEDDED_ONLY
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
                loop_reads.call(handler)
            assert asyncio.get_running_loop() is not None  # given back after the failure
            assert calls == [1]
        finally:
            loop_reads.disable()

    asyncio.run(run())


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
