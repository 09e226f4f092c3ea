"""ORM queries whose SQL is compiled once per database and run with new values on every call.

Compiling a query (columns, joins, ordering, converters) costs Django far more CPU than SQLite or
PostgreSQL take to run it: about 0.4 ms for a select of a wide model, against 0.05 ms for the
query itself. The gateway's read methods run the same few query shapes on every call, so each
shape is compiled once, from a queryset built with marker values in place of the caller's, and
later calls bind their values to the same SQL. Only SQL text is kept: every call reads the
database, so nothing here can serve one process's (or one moment's) data to another.

    _by_key = PreparedQuery(lambda key: Session.objects.filter(key=key), key=str)
    sessions = _by_key.fetch(key="agent:main:main")

``select_related`` relations are filled in as the ORM fills them. Parameter kinds: ``str``,
``int``, ``datetime`` and ``IdList`` (an ``__in`` list of integers, compiled once per length).
``limit=True`` adds ``LIMIT``/``OFFSET`` parameters (Django would write their values into the SQL
text). A builder must use each parameter as a plain value of a lookup (``exact``, ``gte``,
``in``…): one that rewrites it (``icontains``) is refused when compiled.

On SQLite the SQL is kept in the named (``%(p0)s``) parameter style: Django's SQLite cursor rewrites
format-style (``%s``) SQL into ``?`` with a regular expression on every execute, about 25 µs for a
wide select (more than SQLite takes to run it), while the named style costs it one ``%`` formatting.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connections, router
from django.db.models import Model, QuerySet
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query import get_related_populators
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init

# At most this many ``__in`` lengths are compiled per query; longer lists use the ORM each time.
MAX_ID_LIST = 256


class IdList:
    """An ``__in`` parameter: a list of distinct integers (primary keys)."""


_KINDS = (str, int, datetime, IdList)

# A format-style placeholder, or an escaped percent sign (left as it is: it means "%" in either style).
_PLACEHOLDER = re.compile(r"%%|%s")


def _marker(kind: type, index: int, position: int = 0) -> Any:
    # Values no caller passes, distinct per parameter, that survive Django's value preparation.
    if kind is str:
        return f"\x00prepared-{index}\x00"
    if kind is datetime:
        return datetime(1, 1, 1 + index, 0, 0, 0, 1 + position, tzinfo=UTC)
    return -(2**62) - index * 100_000 - position


@dataclass(frozen=True)
class _Compiled:
    sql: str
    # Per SQL parameter: (name, position in an IdList) of the caller's value, or (None, constant).
    slots: tuple[tuple[str | None, Any], ...]
    model: type[Model] | None
    init_list: tuple[str, ...]
    model_slice: slice
    converters: tuple[tuple[int, tuple[Callable, ...], Any], ...]
    # select_related: filled into each instance from the same row, as the ORM's iterator does.
    related_populators: tuple[Any, ...] = ()
    # The SQL is in the named style (SQLite): the parameters go as a mapping under these names.
    param_names: tuple[str, ...] | None = None


class PreparedQuery:
    def __init__(self, build: Callable[..., QuerySet], *, limit: bool = False, **kinds: type) -> None:
        if any(kind not in _KINDS for kind in kinds.values()):
            raise TypeError(f"PreparedQuery parameters take one kind of {_KINDS} each")
        self._build = build
        self._limit = limit
        self._kinds = kinds
        self._compiled: dict[tuple, _Compiled] = {}
        self._lock = threading.Lock()
        self._model: type[Model] | None = None

    def fetch(self, *, limit: int | None = None, offset: int = 0, **values: Any) -> list:
        """Model instances (a queryset of a model) or row tuples (``values_list``), in query order."""
        if self._limit != (limit is not None):
            raise TypeError("limit is required exactly when the query was prepared with limit=True")
        lengths = tuple(len(values[name]) for name, kind in self._kinds.items() if kind is IdList)
        if any(length > MAX_ID_LIST for length in lengths):
            return list(self._queryset(values, limit, offset))
        if any(length == 0 for length in lengths):
            return []  # what the ORM answers to an empty ``__in`` without asking the database
        queryset_alias = self._alias()
        compiled = self._compiled.get((queryset_alias, lengths))
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get((queryset_alias, lengths)) or self._compile(queryset_alias, lengths)
                self._compiled[(queryset_alias, lengths)] = compiled
        return self._run(compiled, queryset_alias, values, limit, offset, fixed_text=not lengths)

    def _queryset(self, values: dict[str, Any], limit: int | None, offset: int) -> QuerySet:
        queryset = self._build(**values)
        return queryset[offset : offset + limit] if limit is not None else queryset

    def _alias(self) -> str:
        # The router's choice for the model, as the queryset's own ``db`` would make it.
        if self._model is None:
            markers = {name: self._marker_value(name, kind, 1) for name, kind in self._kinds.items()}
            self._model = self._build(**markers).model
        return router.db_for_read(self._model)

    def _marker_value(self, name: str, kind: type, length: int) -> Any:
        index = list(self._kinds).index(name)
        if kind is IdList:
            return [_marker(int, index, position) for position in range(length)]
        return _marker(kind, index)

    def _compile(self, alias: str, lengths: tuple[int, ...]) -> _Compiled:
        connection = connections[alias]
        length_of = dict(zip((n for n, k in self._kinds.items() if k is IdList), lengths, strict=True))
        markers = {name: self._marker_value(name, kind, length_of.get(name, 1)) for name, kind in self._kinds.items()}
        queryset = self._build(**markers)
        compiler = queryset.query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        adapted: dict[Any, tuple[str, int]] = {}
        for name, marker in markers.items():
            for position, value in enumerate(marker if isinstance(marker, list) else [marker]):
                if isinstance(value, datetime):
                    value = connection.ops.adapt_datetimefield_value(value)
                adapted[value] = (name, position)
        slots = []
        for param in params:
            slot = adapted.get(param) if isinstance(param, str | int | datetime) else None
            slots.append(slot if slot is not None else (None, param))
        bound = {slot for slot in slots if slot[0] is not None}
        if len(bound) != len(adapted):
            raise TypeError("a PreparedQuery parameter is not a plain value of a lookup in the compiled SQL")
        if self._limit:
            sql += " LIMIT %s OFFSET %s"
        param_names = None
        if connection.vendor == "sqlite":
            sql, param_names = _named_style(sql, len(slots) + (2 if self._limit else 0))
        model, init_list, model_slice, populators = None, (), slice(0, 0), ()
        if compiler.klass_info is not None and not queryset._fields:
            model = compiler.klass_info["model"]
            fields = compiler.klass_info["select_fields"]
            model_slice = slice(fields[0], fields[-1] + 1)
            init_list = tuple(column[0].target.attname for column in compiler.select[model_slice])
            populators = tuple(get_related_populators(compiler.klass_info, compiler.select, alias))
        expressions = [column[0] for column in compiler.select[: compiler.col_count]]
        converters = tuple(
            (position, tuple(functions), expression)
            for position, (functions, expression) in compiler.get_converters(expressions).items()
        )
        return _Compiled(sql, tuple(slots), model, init_list, model_slice, converters, populators, param_names)

    def _run(
        self,
        compiled: _Compiled,
        alias: str,
        values: dict[str, Any],
        limit: int | None,
        offset: int,
        *,
        fixed_text: bool,
    ) -> list:
        connection = connections[alias]
        params = []
        for name, detail in compiled.slots:
            if name is None:
                params.append(detail)
                continue
            value = values[name]
            if self._kinds[name] is IdList:
                value = value[detail]
            elif isinstance(value, datetime):
                value = connection.ops.adapt_datetimefield_value(value)
            params.append(value)
        if limit is not None:
            params += [limit, offset]
        # On PostgreSQL a query of one SQL text whatever the values (no ``IdList``, compiled per length) is prepared
        # on the server once per connection (openclaw_site/postgresql: ``prepared_statement_cursor``).
        prepared_statement_cursor = getattr(connection, "prepared_statement_cursor", None)
        if prepared_statement_cursor is not None and fixed_text:
            cursor = prepared_statement_cursor()
        else:
            cursor = connection.cursor()
        with cursor:
            if compiled.param_names is not None:
                cursor.execute(compiled.sql, dict(zip(compiled.param_names, params, strict=True)))
            else:
                cursor.execute(compiled.sql, params)
            rows = cursor.fetchall()
        if compiled.converters:
            rows = [_converted(row, compiled.converters, connection) for row in rows]
        if compiled.model is None or not rows:
            return rows
        model, init_list, model_slice = compiled.model, list(compiled.init_list), compiled.model_slice
        if _plain_init(model, compiled.init_list):
            instances = [_instance(model, alias, init_list, row[model_slice]) for row in rows]
        else:
            instances = [model.from_db(alias, init_list, row[model_slice]) for row in rows]
        for populator in compiled.related_populators:
            for row, instance in zip(rows, instances, strict=True):
                populator.populate(row, instance)
        return instances


@functools.cache
def _plain_construction(model: type[Model], init_list: tuple[str, ...]) -> bool:
    """Whether ``model.from_db`` is Django's own for these columns: an instance whose fields are plain attributes
    (deferred ones absent), set in field order, and nothing else (no override, no field descriptor that acts on
    a set)."""
    if model.__init__ is not Model.__init__ or model.from_db.__func__ is not Model.from_db.__func__:
        return False
    if any("__init__" in vars(base) for base in model.__mro__ if base not in (model, Model, object)):
        return False
    concrete = tuple(field.attname for field in model._meta.concrete_fields)
    return init_list == tuple(attname for attname in concrete if attname in init_list) and all(
        type(getattr(model, attname, None)) in (DeferredAttribute, ForeignKeyDeferredAttribute) for attname in concrete
    )


def _plain_init(model: type[Model], init_list: tuple[str, ...]) -> bool:
    # Receivers of pre_init / post_init may be connected at any time, so this part is asked on every fetch.
    return _plain_construction(model, init_list) and not (
        pre_init.has_listeners(model) or post_init.has_listeners(model)
    )


def _instance(model: type[Model], alias: str, init_list: list[str], values: Sequence) -> Model:
    """What ``model.from_db(alias, init_list, values)`` returns, built without running ``Model.__init__`` (its
    per-field ``setattr`` loop is most of a wide row's cost), for the models :func:`_plain_init` admits."""
    instance = object.__new__(model)
    state = ModelState()
    state.adding = False
    state.db = alias
    instance._state = state
    instance.__dict__.update(zip(init_list, values, strict=True))
    return instance


def _named_style(sql: str, count: int) -> tuple[str, tuple[str, ...] | None]:
    """The SQL with its ``count`` placeholders named ``p0``, ``p1``…, and those names; the SQL unchanged (and
    None) when it holds a percent sign that is neither, which only the format style's rewriting passes through."""
    names: list[str] = []

    def named(match: re.Match) -> str:
        if match.group() == "%%":
            return "%%"
        names.append(f"p{len(names)}")
        return f"%({names[-1]})s"

    converted = _PLACEHOLDER.sub(named, sql)
    if len(names) != count:
        return sql, None
    try:
        converted % dict.fromkeys(names, "")
    except (ValueError, TypeError, KeyError):
        return sql, None
    return converted, tuple(names)


def _converted(row: Sequence, converters: tuple, connection: Any) -> list:
    row = list(row)
    for position, functions, expression in converters:
        value = row[position]
        for function in functions:
            value = function(value, expression, connection)
        row[position] = value
    return row


__all__ = ["IdList", "PreparedQuery"]
