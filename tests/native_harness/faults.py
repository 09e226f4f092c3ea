"""Fault injection at real boundaries for the initialization tests: database triggers (both
vendors) and stage listeners. Nothing here changes the code under test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connections

TRIGGERS = {
    # name: (alias, table, timing/event, sqlite WHEN, postgres WHEN, message)
    "reject_import": (
        "default",
        "sessions_app_transcriptevent",
        "BEFORE INSERT",
        "NEW.type = 'message'",
        "NEW.type = 'message'",
        "injected import failure",
    ),
    "reject_readiness": (
        "default",
        "sessions_app_session",
        "BEFORE UPDATE",
        "OLD.initialization_pending = 1 AND NEW.initialization_pending = 0",
        "OLD.initialization_pending AND NOT NEW.initialization_pending",
        "injected readiness failure",
    ),
    "reject_rollback_delete": (
        "default",
        "sessions_app_session",
        "BEFORE DELETE",
        "OLD.initialization_pending = 1",
        "OLD.initialization_pending",
        "injected rollback failure",
    ),
    "reject_binding": (
        "harness",
        "native_harness_nativebinding",
        "BEFORE INSERT",
        "1 = 1",
        "TRUE",
        "injected binding write failure",
    ),
    "reject_archive": (
        "harness",
        "native_harness_nativethread",
        "BEFORE UPDATE",
        "NEW.archived_at IS NOT NULL",
        "NEW.archived_at IS NOT NULL",
        "injected archive failure",
    ),
}


@contextlib.contextmanager
def trigger(name: str) -> Iterator[None]:
    alias, table, timing, sqlite_when, pg_when, message = TRIGGERS[name]
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                f"CREATE TRIGGER {name} {timing} ON {table} WHEN {sqlite_when} "
                f"BEGIN SELECT RAISE(ABORT, '{message}'); END"
            )
        else:
            cursor.execute(
                f"CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION '{message}'; END $$ "
                "LANGUAGE plpgsql"
            )
            cursor.execute(
                f"CREATE TRIGGER {name} {timing} ON {table} FOR EACH ROW WHEN ({pg_when}) EXECUTE FUNCTION {name}()"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
            else:
                cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
                cursor.execute(f"DROP FUNCTION IF EXISTS {name}()")
