"""UPDATE ... RETURNING through the ORM's own SQL: one statement that writes and reads back.

The ORM has no update-returning; both backends have the syntax (SQLite >= 3.35, PostgreSQL). The
statement is compiled by Django (so Now(), F() and durations come out right on each backend) once per
shape and cached: the hot path does not pay for SQL compilation on every step. Values that change
between executions are compiled as sentinels and bound by position.
"""
from __future__ import annotations

import itertools
import json
from typing import Any, Callable

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import QuerySet
from django.db.models.sql import UpdateQuery

from veronica.plumbing.begin_rides import riding

_cache: dict[tuple, tuple[str, list, dict[int, str]]] = {}
_ids = itertools.count(1)


class Sentinels:
    """Typed placeholders for build(): str(name) and int(name) return values nobody else uses."""

    def __init__(self) -> None:
        self.names: dict[Any, str] = {}

    def str(self, name: str) -> str:
        value = f"\x1fslot-{next(_ids)}-{name}"
        self.names[value] = name
        return value

    def date(self, name: str):
        """Bind it as an ISO string (both backends take one for a date column)."""
        import datetime

        value = datetime.date(1, 1, 1) + datetime.timedelta(days=next(_ids))
        self.names[value] = self.names[value.isoformat()] = name
        return value

    def decimal(self, name: str):
        from decimal import Decimal

        value = Decimal(-(10**12) - next(_ids))
        self.names[value] = name
        return value

    def int(self, name: str) -> int:
        value = -(10**15) - next(_ids)
        self.names[value] = name
        return value


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def compiled(key: tuple, build: Callable[[Sentinels], tuple[QuerySet, dict]], columns: list[str]):
    """The UPDATE ... RETURNING that build(sentinels) describes: (sql, params, bind), compiled once per key."""
    connection = connections[DEFAULT_DB_ALIAS]
    cache_key = (connection.vendor, *key)
    cached = _cache.get(cache_key)
    if cached is None:
        slots = Sentinels()
        qs, updates = build(slots)
        query = qs.query.chain(UpdateQuery)
        query.add_update_values(updates)
        sql, params = query.get_compiler(DEFAULT_DB_ALIAS).as_sql()
        sql += " RETURNING " + ", ".join(connection.ops.quote_name(c) for c in columns)
        params = list(params)
        bind = {i: slots.names[p] for i, p in enumerate(params) if not isinstance(p, bool) and _hashable(p) and p in slots.names}
        if len(set(bind.values())) != len(set(slots.names.values())):
            raise RuntimeError(f"update_returning {key}: a sentinel did not survive compilation")
        cached = _cache[cache_key] = (sql, params, bind)
    return cached


def bound(cached, values: dict[str, Any]) -> list:
    sql, params, bind = cached
    out = list(params)
    for i, name in bind.items():
        out[i] = values[name]
    return out


def update_returning(key: tuple, build: Callable[[Sentinels], tuple[QuerySet, dict]], columns: list[str],
                     values: dict[str, Any]):
    """Run the UPDATE that build(sentinels) describes (a queryset and its update values) with `values`
    in place of the sentinels; the first row of `columns`, or None when no row matched."""
    return update_returning_compiled(compiled(key, build, columns), values)


def update_returning_compiled(cached, values: dict[str, Any]):
    """update_returning() of a statement compiled already (compiled())."""
    conn = connections[DEFAULT_DB_ALIAS]
    with conn.cursor() as cur:
        with riding(conn):  # a fence opening its transaction: its BEGIN rides along
            cur.execute(cached[0], bound(cached, values))
        return cur.fetchone()


# In a second statement's SQL (update_then), where the condition "the first matched its row" goes.
GATE = " /*gate*/"


def update_then(first, first_values: dict[str, Any], second, second_values: dict[str, Any]):
    """PostgreSQL: two compiled UPDATE ... RETURNING in ONE statement, the second applied only when the
    first matched its row (data-modifying CTEs). The second may be any statement ending in RETURNING
    that marks with GATE where that condition goes. Returns (first's row, second's row or None), or None
    when the first matched nothing (then neither wrote)."""
    (sql1, _, _), (sql2, _, _) = first, second
    head, sep, returning = sql2.rpartition(" RETURNING ")
    if GATE in head:  # a statement that says where its condition goes (an upsert's SELECT, not its DO UPDATE)
        head = head.replace(GATE, " AND EXISTS (SELECT 1 FROM a)")
    elif not sep or " WHERE " not in head:
        raise RuntimeError("update_then: the second UPDATE has no WHERE ... RETURNING")
    else:
        head += " AND EXISTS (SELECT 1 FROM a)"
    sql = f"WITH a AS ({sql1}), b AS ({head} RETURNING {returning}) SELECT a.*, b.* FROM a LEFT JOIN b ON TRUE"
    conn = connections[DEFAULT_DB_ALIAS]
    with conn.cursor() as cur:
        with riding(conn):
            cur.execute(sql, bound(first, first_values) + bound(second, second_values))
        row = cur.fetchone()
    if row is None:
        return None
    n1 = len(row) - len(returning.split(", "))
    tail = row[n1:]
    return row[:n1], (None if all(v is None for v in tail) else tail)  # the second's columns are NOT NULL


# --- INSERT ... VALUES (...), (...) RETURNING id, written once per model and row count ---------------------

_PLAIN = ("AutoField", "BigAutoField", "CharField", "TextField", "IntegerField", "BigIntegerField",
          "PositiveIntegerField", "SmallIntegerField", "BooleanField")
_insert_cache: dict[tuple, str] = {}
_columns_of: dict = {}


def _columns(model) -> list:
    """(field, plain) for every concrete non-pk column; plain: a str, int or bool (or the id of one)
    goes to the driver as it is, so the ORM's per-value preparation is skipped for it."""
    cols = _columns_of.get(model)
    if cols is None:
        cols = _columns_of[model] = [
            (f, (f.target_field if f.is_relation else f).get_internal_type() in _PLAIN)
            for f in model._meta.concrete_fields if not f.primary_key]
    return cols


def insert_statement(model, rows: list) -> tuple[str, list]:
    """The multi-row INSERT ... RETURNING id of these new instances (its SQL written once per model and
    row count) and its parameters. Defaults and auto_now_add are the fields' own (pre_save)."""
    connection = connections[DEFAULT_DB_ALIAS]
    cols = _columns(model)
    key = (connection.vendor, model, len(rows))
    sql = _insert_cache.get(key)
    if sql is None:
        qn = connection.ops.quote_name
        row = "(" + ", ".join(["%s"] * len(cols)) + ")"
        sql = (f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(f.column) for f, _ in cols)}) "
               f"VALUES {', '.join([row] * len(rows))} RETURNING {qn(model._meta.pk.column)}")
        if len(_insert_cache) > 256:
            _insert_cache.clear()
        _insert_cache[key] = sql
    params = []
    for obj in rows:
        for f, plain in cols:
            value = f.pre_save(obj, True)
            params.append(value if plain and value is not None else f.get_db_prep_save(value, connection))
    return sql, params


def inserted(model, rows: list, ids: list) -> None:
    """Mark the instances written with their ids, in VALUES order (a plain INSERT's RETURNING keeps it;
    bulk_create relies on that too)."""
    if len(ids) != len(rows):
        raise RuntimeError(f"{model.__name__}: {len(ids)} of {len(rows)} rows written")
    alias = connections[DEFAULT_DB_ALIAS].alias
    for obj, pk in zip(rows, ids):
        obj.pk = pk
        obj._state.adding, obj._state.db = False, alias


def insert_rows(model, rows: list) -> None:
    """One multi-row INSERT of new model instances, their ids set from RETURNING: what bulk_create does,
    without compiling the statement on every call (and, on PostgreSQL, without sending every column
    as an array through UNNEST)."""
    sql, params = insert_statement(model, rows)
    with connections[DEFAULT_DB_ALIAS].cursor() as cur:
        cur.execute(sql, params)
        ids = [r[0] for r in cur.fetchall()]
    inserted(model, rows, ids)


# --- PostgreSQL: INSERT ... SELECT FROM json_to_recordset(one parameter) ------------------------------------

_JSON_AS_IS = frozenset(_PLAIN) | {"ForeignKey", "PositiveBigIntegerField", "PositiveSmallIntegerField", "SmallAutoField"}
_json_cache: dict = {}


def _json_columns(model):
    """(the INSERT's SQL, [(field, kind)] per concrete non-pk column, kind "as_is" | "json" | "datetime"),
    or None when a column's value has no plain JSON form (the caller then uses insert_statement)."""
    if model in _json_cache:
        return _json_cache[model]
    connection = connections[DEFAULT_DB_ALIAS]
    cols = []
    for f in model._meta.concrete_fields:
        if f.primary_key:
            continue
        kind = f.get_internal_type()
        if kind == "JSONField" and f.encoder is None:
            cols.append((f, "json"))
        elif kind == "DateTimeField":
            cols.append((f, "datetime"))
        elif kind in _JSON_AS_IS:
            cols.append((f, "as_is"))
        else:
            cols = None
            break
    if cols is not None:
        qn = connection.ops.quote_name
        names = ", ".join(qn(f.column) for f, _ in cols)
        record = ", ".join(f"{qn(f.column)} {f.db_type(connection)}" for f, _ in cols)
        head = (f"INSERT INTO {qn(model._meta.db_table)} ({names}) SELECT {names} FROM json_to_recordset(%s::json) "
                f"AS r(_ord int, {record}) ORDER BY r._ord RETURNING {qn(model._meta.pk.column)}")
        cols = (head, cols)
    _json_cache[model] = cols
    return cols


def json_rows(rows: list, cols) -> str:
    """The rows as one JSON array of objects keyed by column (what json_to_recordset reads), in order."""
    out = []
    for i, obj in enumerate(rows):
        record = {"_ord": i}
        for f, kind in cols:
            value = f.pre_save(obj, True)
            if kind == "datetime" and value is not None:
                value = value.isoformat()
            record[f.column] = value
        out.append(record)
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def json_insert_statement(model, rows: list) -> tuple[str, list]:
    """PostgreSQL: the INSERT ... RETURNING id of these new instances with every row in ONE parameter (a
    JSON array read by json_to_recordset, in order). Its SQL is the same for any number of rows, so the
    driver caches its conversion and the server its plan, and its one parameter costs one json.dumps
    instead of the field-by-field preparation of a VALUES list (what a step's statement spent most of
    its client time on). Falls back to insert_statement for a model with a column of another kind."""
    cols = _json_columns(model)
    if cols is None:
        return insert_statement(model, rows)
    head, fields = cols
    return head, [json_rows(rows, fields)]
