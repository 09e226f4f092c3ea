"""Databases made by commit 36b1ca4 (the layout before ``sessions_app``/``native_harness`` became
top-level packages) migrate to the current code without losing a row, and stay usable.

The fixtures under ``tests/fixtures/legacy_36b1ca4/`` were made by that commit's own code (see its
README and ``make_fixtures.py``). This test only talks to the current code from the outside:
``manage.py`` subprocesses, the raw stores (sqlite3, psycopg) and a real gateway process with the
protocol client, so it does not depend on where the apps' modules live.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from openclaw_client.client import ClientOptions, GatewayClient
from tests.support.clients import operator
from tests.support.processes import ROOT, start_gateway, stop_and_remove

# django_db: the suite's e2e teardown (tests/conftest.py) waits on the test database; this test's
# own databases are scratch copies of the fixtures, reached only through subprocesses and raw drivers.
pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FIXTURES = ROOT / "tests" / "fixtures" / "legacy_36b1ca4"
POSTGRES_SCHEMES = ("postgres", "postgresql", "pgsql")
# The platform the fixture's devices paired with (make_fixtures.py pins it).
DEVICE_PLATFORM = "linux"
# Tables the migration machinery appends to (new migrations, new models' content types and
# permissions), and those the operator-scope migration (gateway 0005: one group per scope, existing logins put in
# the group of what they could do before) appends to: every row that was there must still be there, unchanged, but
# rows may be added.
APPEND_ONLY_TABLES = frozenset(
    {
        "django_migrations",
        "django_content_type",
        "auth_permission",
        "auth_group",
        "auth_group_permissions",
        "auth_user_groups",
    }
)
# Models that moved to another app since: their content type rows are renamed in place (same id, so their
# permissions and admin history keep pointing at them); every other column of those rows is unchanged.
MOVED_MODELS = {("gateway", model): "devices_app" for model in ("paireddevice", "devicepairingrequest", "devicetoken")}
# Apps and models are found by label in the migrated database, never by module path.
LABEL_CHECK = """
import json
from django.apps import apps
counts = {
    label: apps.get_model(*label.split(".")).objects.using(alias).count()
    for label, alias in [
        ("sessions_app.Session", "default"), ("sessions_app.TranscriptEvent", "default"),
        ("sessions_app.Run", "default"), ("devices_app.PairedDevice", "default"),
        ("native_harness.NativeThread", "harness"), ("native_harness.NativeBinding", "harness"),
    ]
}
print("COUNTS=" + json.dumps(counts))
"""


# --- raw snapshots of a store ------------------------------------------------------------------


@dataclass(frozen=True)
class TableShape:
    columns: tuple[str, ...]
    key: tuple[str, ...]  # primary key columns: the row order of the checksum


@dataclass(frozen=True)
class TableRows:
    rows: tuple[str, ...]  # canonical JSON of each row, in primary-key order

    @property
    def count(self) -> int:
        return len(self.rows)

    @property
    def checksum(self) -> str:
        return hashlib.sha256("\n".join(self.rows).encode()).hexdigest()


def canonical(value: object) -> object:
    """One spelling per value, whichever driver type carries it (jsonb dicts, datetimes, bytes)."""
    if isinstance(value, memoryview):
        value = bytes(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    return value


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def select_rows(execute: Callable[[str], list[tuple]], table: str, shape: TableShape) -> TableRows:
    columns = ", ".join(quoted(c) for c in shape.columns)
    order = ", ".join(quoted(c) for c in shape.key) or columns
    rows = execute(f"SELECT {columns} FROM {quoted(table)} ORDER BY {order}")
    return TableRows(tuple(json.dumps([canonical(v) for v in row], default=str) for row in rows))


class SqliteStore:
    def __init__(self, path: Path):
        self.path = path
        self.name = path.name

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path)
        try:
            yield conn
        finally:
            conn.close()

    def shapes(self) -> dict[str, TableShape]:
        with self._connection() as conn:
            tables = [
                row[0]
                for row in conn.execute(
                    # sqlite_sequence & co. are SQLite's bookkeeping, not data.
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                )
            ]
            shapes = {}
            for table in tables:
                info = conn.execute(f"PRAGMA table_info({quoted(table)})").fetchall()
                key = tuple(row[1] for row in sorted((r for r in info if r[5]), key=lambda r: r[5]))
                shapes[table] = TableShape(tuple(row[1] for row in info), key)
            return shapes

    def read(self, shapes: dict[str, TableShape]) -> dict[str, TableRows | str]:
        with self._connection() as conn:

            def execute(query: str) -> list[tuple]:
                return conn.execute(query).fetchall()

            rows: dict[str, TableRows | str] = {}
            for table, shape in shapes.items():
                # SQLite reads a double-quoted name that is no column as a string literal, so a
                # dropped column would look like changed values: name it instead.
                present = {row[1] for row in conn.execute(f"PRAGMA table_info({quoted(table)})")}
                gone = [c for c in shape.columns if c not in present]
                if present and gone:
                    rows[table] = f"columns gone: {', '.join(gone)}"
                else:
                    rows[table] = _read_or_error(execute, table, shape)
            return rows


class PostgresStore:
    def __init__(self, url: str):
        self.url = url
        self.name = "gateway (PostgreSQL)"

    @contextlib.contextmanager
    def _connection(self):
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            # Timestamps come back in the session's zone: pin it so both reads spell them alike.
            conn.execute("SET TIME ZONE 'UTC'")
            yield conn

    def shapes(self) -> dict[str, TableShape]:
        with self._connection() as conn:
            tables = [
                row[0]
                for row in conn.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
                )
            ]
            shapes = {}
            for table in tables:
                columns = conn.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position",
                    [table],
                ).fetchall()
                key = conn.execute(
                    "SELECT a.attname FROM pg_index i "
                    "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                    "WHERE i.indrelid = %s::regclass AND i.indisprimary "
                    "ORDER BY array_position(i.indkey::int2[], a.attnum)",
                    [f"public.{quoted(table)}"],
                ).fetchall()
                shapes[table] = TableShape(tuple(c[0] for c in columns), tuple(k[0] for k in key))
            return shapes

    def read(self, shapes: dict[str, TableShape]) -> dict[str, TableRows | str]:
        with self._connection() as conn:

            def execute(query: str) -> list[tuple]:
                return conn.execute(query).fetchall()

            return {table: _read_or_error(execute, table, shape) for table, shape in shapes.items()}


def _read_or_error(execute: Callable[[str], list[tuple]], table: str, shape: TableShape) -> TableRows | str:
    """The rows, or why they cannot be read any more (table or column gone)."""
    try:
        return select_rows(execute, table, shape)
    except Exception as error:  # sqlite3.Error / psycopg.Error: reported as a lost table below
        return f"{type(error).__name__}: {error}".strip()


Store = SqliteStore | PostgresStore


@dataclass
class StoreSnapshot:
    store: Store
    shapes: dict[str, TableShape]
    before: dict[str, TableRows]


def take_snapshots(stores: list[Store]) -> list[StoreSnapshot]:
    snapshots = []
    for store in stores:
        shapes = store.shapes()
        before = store.read(shapes)
        unreadable = {t: r for t, r in before.items() if isinstance(r, str)}
        assert not unreadable, f"the fixture itself is unreadable: {unreadable}"
        snapshots.append(StoreSnapshot(store, shapes, before))  # type: ignore[arg-type]
    return snapshots


def lost_rows(snapshots: list[StoreSnapshot]) -> list[str]:
    """What the migration lost or changed, table by table (only the columns that existed before)."""
    problems = []
    for snapshot in snapshots:
        after = snapshot.store.read(snapshot.shapes)
        for table, before in sorted(snapshot.before.items()):
            where = f"{snapshot.store.name}: {table}"
            now = after[table]
            if isinstance(now, str):
                problems.append(f"{where}: {before.count} rows no longer readable ({now})")
                continue
            expected = before.rows
            if table == "django_content_type":
                expected = tuple(_moved(row, snapshot.shapes[table].columns) for row in expected)
            missing = Counter(expected) - Counter(now.rows)
            if table in APPEND_ONLY_TABLES:
                if missing:
                    problems.append(f"{where}: {sum(missing.values())} of {before.count} rows lost or changed")
            elif (now.count, now.checksum) != (before.count, before.checksum):
                problems.append(
                    f"{where}: {before.count} rows (sha256 {before.checksum[:12]}) became {now.count} "
                    f"(sha256 {now.checksum[:12]}); {sum(missing.values())} lost or changed, e.g. "
                    f"{next(iter(missing), '(reordered)')[:200]}"
                )
    return problems


def _moved(row: str, columns: tuple[str, ...]) -> str:
    """A content type row as the migration leaves it: a moved model's app label is its new app's."""
    values = json.loads(row)
    app_label, model = columns.index("app_label"), columns.index("model")
    values[app_label] = MOVED_MODELS.get((values[app_label], values[model]), values[app_label])
    return json.dumps(values)


def row_counts(snapshots: list[StoreSnapshot]) -> dict[str, int]:
    return {f"{s.store.name}:{t}": rows.count for s in snapshots for t, rows in s.before.items()}


# --- the current code, from the outside -------------------------------------------------------


def manage_env(state_dir: Path, database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # self-contained: no shared Redis
    env.update(
        OPENCLAW_STATE_DIR=str(state_dir),
        DATABASE_URL=database_url,
        HARNESS_DATABASE_URL=f"sqlite:///{state_dir / 'harness.sqlite3'}",
        DB_CONN_MAX_AGE="0",
        PYTHONUNBUFFERED="1",
    )
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def assert_succeeded(result: subprocess.CompletedProcess) -> None:
    command = " ".join(result.args[2:])
    assert result.returncode == 0, f"manage.py {command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"


def history_texts(messages: list[dict]) -> list[dict]:
    return [
        {
            "role": m["role"],
            "text": "".join(p.get("text", "") for p in m["content"] if p.get("type") == "text"),
            "id": m["__openclaw"]["id"],
        }
        for m in messages
    ]


async def use_migrated_gateway(server, state_dir: Path, expected: dict) -> dict:
    """Everything the legacy gateway showed, through the protocol, plus new writes on old rows."""
    admin = operator(server)
    await admin.connect()
    seen: dict = {"history": {}}
    try:
        seen["listed"] = await admin.request("sessions.list", {"limit": 1000, "archived": "all"})
        seen["active"] = await admin.request("sessions.list", {"limit": 1000})
        for row in expected["sessions"]:
            history = await admin.request("chat.history", {"sessionKey": row["key"], "limit": 1000})
            seen["history"][row["key"]] = history_texts(history["messages"])

        # A new turn appends after the legacy transcript (per-window seq and event cursor).
        main = expected["mainSessionKey"]
        await admin.request(
            "chat.send", {"sessionKey": main, "message": "Reply exactly: migrated", "idempotencyKey": "after-migrate"}
        )
        seen["turn"] = await admin.request("agent.wait", {"runId": "after-migrate", "timeoutMs": 60_000}, timeout=90)
        seen["main_after_turn"] = history_texts(
            (await admin.request("chat.history", {"sessionKey": main, "limit": 1000}))["messages"]
        )

        # The adopted native thread forks upstream again: its link, binding and thread rows work.
        adopted = expected["sessionKeys"]["adopted"]
        lisbon = next(m for m in expected["history"][adopted] if m["text"] == "Lisbon")
        forked = await admin.request("sessions.fork", {"sessionKey": adopted, "entryId": lisbon["id"]})
        seen["upstream_fork"] = history_texts(
            (await admin.request("chat.history", {"sessionKey": forked["sessionKey"]}))["messages"]
        )

        # The paired devices connect with their device tokens alone (no shared secret).
        cli = operator(server, identity=None, token=None, state_dir=str(state_dir / "cli"), platform=DEVICE_PLATFORM)
        seen["cli_hello"] = await cli.connect()
        await cli.close()
        node = GatewayClient(
            ClientOptions(
                url=server.url,
                token=None,
                role="node",
                client_id="node-host",
                client_mode="node",
                display_name="legacy-node",
                commands=["echo"],
                caps=["system"],
                state_dir=str(state_dir / "node-identity"),
                platform=DEVICE_PLATFORM,
            )
        )
        seen["node_hello"] = await node.connect()
        seen["nodes"] = await admin.request("node.list")
        await node.close()
    finally:
        await admin.close()
    return seen


def migrate_and_use(state_dir: Path, database_url: str, stores: list[Store]) -> None:
    """The whole check for one profile, on a copy of its fixture in ``state_dir``."""
    expected = json.loads((state_dir / "expected.json").read_text())
    snapshots = take_snapshots(stores)
    counts = row_counts(snapshots)
    # The fixture must hold what it claims to (guards against an emptied or truncated fixture).
    for table in ("sessions_app_session", "sessions_app_transcriptevent", "sessions_app_run", "gateway_paireddevice"):
        assert any(name.endswith(f":{table}") and n > 0 for name, n in counts.items()), (table, counts)
    for table in ("native_harness_nativethread", "native_harness_nativebinding", "sessions_app_sessionupstreamlink"):
        assert any(name.endswith(f":{table}") and n > 0 for name, n in counts.items()), (table, counts)

    env = manage_env(state_dir, database_url)
    assert_succeeded(manage(env, "migrate", "--no-input"))
    assert_succeeded(manage(env, "migrate", "--database", "harness", "--no-input"))

    lost = lost_rows(snapshots)
    assert not lost, "the migration lost or changed rows:\n" + "\n".join(lost)

    unmigrated = manage(env, "makemigrations", "--check", "--dry-run")
    assert unmigrated.returncode == 0, f"models and migrations differ:\n{unmigrated.stdout}\n{unmigrated.stderr}"

    # The apps are still there under their labels, on the stores their rows are in.
    labelled = manage(env, "shell", "-c", LABEL_CHECK)
    assert_succeeded(labelled)
    by_label = json.loads(next(line for line in labelled.stdout.splitlines() if line.startswith("COUNTS="))[7:])
    assert by_label["sessions_app.Session"] == len(expected["sessions"])
    assert all(by_label.values()), by_label

    token = (state_dir / "gateway-token").read_text().strip()
    server = start_gateway(
        extra_env={
            "DATABASE_URL": database_url,
            "HARNESS_DATABASE_URL": env["HARNESS_DATABASE_URL"],
            "OPENCLAW_STATE_DIR": str(state_dir),
            # The state dir's own gateway token, as `./dev run` would use it.
            "OPENCLAW_GATEWAY_TOKEN": token,
            # The built-in echo model, whatever the calling shell configured.
            "OPENCLAW_MODEL_PROVIDER": "",
            "OPENCLAW_MODEL_BASE_URL": "",
        }
    )
    try:
        seen = asyncio.run(use_migrated_gateway(server, state_dir, expected))
    except BaseException:
        print(server.log())
        raise
    finally:
        stop_and_remove([server])

    listed = {row["key"]: row for row in seen["listed"]["sessions"]}
    assert sorted(listed) == [row["key"] for row in expected["sessions"]]
    for row in expected["sessions"]:
        shown = listed[row["key"]]
        assert (shown["sessionId"], shown.get("label"), shown["archived"]) == (
            row["sessionId"],
            row["label"],
            row["archived"],
        ), row["key"]
    assert sorted(row["key"] for row in seen["active"]["sessions"]) == expected["activeSessionKeys"]
    assert seen["history"] == expected["history"]
    assert [m["text"] for m in expected["history"][expected["mainSessionKey"]]][:2] == [
        "Reply exactly: hello from 36b1ca4",
        "hello from 36b1ca4",
    ]

    assert seen["turn"]["status"] == "ok"
    new_messages = seen["main_after_turn"][len(expected["history"][expected["mainSessionKey"]]) :]
    assert seen["main_after_turn"][: -len(new_messages)] == expected["history"][expected["mainSessionKey"]]
    assert [(m["role"], m["text"]) for m in new_messages] == [
        ("user", "Reply exactly: migrated"),
        ("assistant", "migrated"),
    ]
    assert [m["text"] for m in seen["upstream_fork"]] == ["plan the trip", "where to?"]

    assert seen["cli_hello"]["auth"]["method"] == "device-token"
    assert seen["node_hello"]["auth"]["method"] == "device-token"
    assert seen["node_hello"]["auth"]["role"] == "node"
    (legacy_node,) = [n for n in seen["nodes"]["nodes"] if n["nodeId"] == expected["nodeDeviceId"]]
    assert (legacy_node["paired"], legacy_node["displayName"]) == (True, "Legacy node")


def copy_fixture(profile: str, target: Path) -> Path:
    shutil.copytree(FIXTURES / profile, target)
    return target


# --- the two profiles --------------------------------------------------------------------------


def test_every_row_survives_when_migrating_a_36b1ca4_sqlite_state_dir(tmp_path):
    state_dir = copy_fixture("sqlite", tmp_path / "state")
    gateway_db = state_dir / "gateway.sqlite3"
    migrate_and_use(
        state_dir,
        f"sqlite:///{gateway_db}",
        [SqliteStore(gateway_db), SqliteStore(state_dir / "harness.sqlite3")],
    )


def postgres_server_url() -> str | None:
    url = os.environ.get("DATABASE_URL", "")
    return url if urlsplit(url).scheme in POSTGRES_SCHEMES else None


@contextlib.contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A fresh database on the test run's PostgreSQL server, dropped afterwards whatever happens."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(server_url)
    name = f"openclaw_legacy_{os.getpid()}_{secrets.token_hex(4)}"
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            # FORCE: a gateway that was killed may still hold connections.
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.mark.skipif(postgres_server_url() is None, reason="needs a PostgreSQL DATABASE_URL (the test run's server)")
def test_every_row_survives_when_migrating_a_36b1ca4_postgres_database(tmp_path):
    import psycopg

    state_dir = copy_fixture("postgres", tmp_path / "state")
    with scratch_database(postgres_server_url()) as database_url:
        # The dump is plain SQL (no COPY blocks, no psql meta-commands): one simple-query batch, one transaction.
        with psycopg.connect(database_url) as conn:
            conn.execute((state_dir / "gateway.sql").read_text(encoding="utf-8"))
        migrate_and_use(
            state_dir,
            database_url,
            [PostgresStore(database_url), SqliteStore(state_dir / "harness.sqlite3")],
        )
