"""UPDATE ... RETURNING through the ORM's own SQL: one statement that writes and reads back.

The ORM has no update-returning; both backends have the syntax (SQLite >= 3.35, PostgreSQL). The
statement is compiled by Django (so Now(), F() and durations come out right on each backend) once per
shape and cached: the hot path does not pay for SQL compilation on every step. Values that change
between executions are compiled as sentinels and bound by position.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import QuerySet
from django.db.models.sql import UpdateQuery

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


def update_returning(key: tuple, build: Callable[[Sentinels], tuple[QuerySet, dict]], columns: list[str],
                     values: dict[str, Any]):
    """Run the UPDATE that build(sentinels) describes (a queryset and its update values) with `values`
    in place of the sentinels; the first row of `columns`, or None when no row matched."""
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
    sql, params, bind = cached
    bound = list(params)
    for i, name in bind.items():
        bound[i] = values[name]
    with connection.cursor() as cur:
        cur.execute(sql, bound)
        return cur.fetchone()
