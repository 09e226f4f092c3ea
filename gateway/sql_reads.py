"""Hand-written read queries whose rows become model instances, for the few reads on every call's path.

Django compiles a queryset into SQL on every evaluation, and for a wide model that costs far more than
running the query: on the machines this runs on, ~0.45 ms for a page of sessions against ~0.05 ms for
its SQL. The hottest reads (a ``sessions.list`` page, the placements of its sessions) are therefore SQL
text written once, run through Django's cursor ("Executing custom SQL directly"), with each column's
value passed through its field's ``from_db_value`` and each row made an instance by ``Model.from_db``
(the documented way the ORM itself loads a row). Parameters go through ``Field.get_db_prep_value``, as the
ORM prepares them. Every call reads the database: only the SQL text is kept.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import connections, router
from django.db.models import Field, Model


def columns(fields: Sequence[Field], *, table: str | None = None) -> str:
    """The quoted column list of ``fields`` (qualified by ``table`` when given)."""
    prefix = f'"{table}".' if table else ""
    return ", ".join(f'{prefix}"{field.column}"' for field in fields)


def prepared(field: Field, value: Any, model: type[Model]) -> Any:
    """``value`` as the ORM would send it for ``field`` (a datetime as this database stores it, say)."""
    return field.get_db_prep_value(value, connections[router.db_for_read(model)], prepared=False)


def instances(model: type[Model], fields: Sequence[Field], sql: str, params: Sequence[Any]) -> list[Model]:
    """``model`` instances of the rows of ``sql``, whose columns are ``fields`` in that order."""
    alias, rows = read(model, sql, params)
    return from_rows(model, fields, rows, alias=alias)


def read(model: type[Model], sql: str, params: Sequence[Any]) -> tuple[str, list[tuple]]:
    """The database alias ``model`` is read from, and the raw rows of ``sql`` there (for :func:`from_rows`)."""
    alias = router.db_for_read(model)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return alias, cursor.fetchall()


def from_rows(model: type[Model], fields: Sequence[Field], rows: Sequence[Sequence[Any]], *, alias: str) -> list[Model]:
    """``model`` instances of rows read elsewhere (columns ``fields``, in that order)."""
    if not rows:
        return []
    connection = connections[alias]
    convert = [_converter(field, connection) for field in fields]
    names = [field.attname for field in fields]
    return [
        model.from_db(alias, names, [c(value) if c else value for c, value in zip(convert, row, strict=True)])
        for row in rows
    ]


# Column types whose values the database driver already hands out as the ORM would (after from_db_value): others
# (UUIDs, decimals, dates on SQLite…) need the backend's own converters, which this does not apply.
PLAIN_TYPES = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "BigIntegerField",
        "BooleanField",
        "CharField",
        "DateTimeField",
        "ForeignKey",
        "IntegerField",
        "JSONField",
        "OneToOneField",
        "PositiveBigIntegerField",
        "PositiveIntegerField",
        "SmallIntegerField",
        "TextField",
    }
)


def _converter(field: Field, connection: Any):
    if field.get_internal_type() not in PLAIN_TYPES:
        raise TypeError(f"sql_reads does not convert {field.get_internal_type()} columns ({field})")
    from_db_value = getattr(field, "from_db_value", None)
    if from_db_value is not None:
        return lambda value: from_db_value(value, None, connection)
    if field.get_internal_type() == "DateTimeField" and settings.USE_TZ and connection.vendor == "sqlite":
        # SQLite keeps UTC without an offset (Django writes it so); the ORM hands it out aware.
        return _aware_utc
    return None


def _aware_utc(value: datetime.datetime | None) -> datetime.datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=datetime.UTC)
