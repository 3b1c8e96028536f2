"""The engine keeps time by the database, never by a host.

Leases, claims and expiries already compare with `Now()` inside their statements. The tick's other
duties (cron, alarms, dispatch, the unread-mail sweep, watchdogs, notification retries) compare
rows stamped by many hosts with "now": that "now" is one reading of the database's clock per tick,
so a host whose clock runs ahead or behind neither fires early, spins, nor sweeps late.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timezone as dt_timezone
from typing import Iterator

from django.db import connection

_reading: ContextVar[datetime | None] = ContextVar("veronica_engine_now", default=None)


def db_now() -> datetime:
    """One statement: the database's current time, timezone-aware (UTC)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT statement_timestamp()")
            return cursor.fetchone()[0]
        cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
        return datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=dt_timezone.utc)


@contextmanager
def ticking() -> Iterator[datetime]:
    """Within a tick pass every duty sees the one reading taken at its start (a nested pass reuses it)."""
    outer = _reading.get()
    if outer is not None:
        yield outer
        return
    token = _reading.set(db_now())
    try:
        yield _reading.get()
    finally:
        _reading.reset(token)


def now() -> datetime:
    """The tick's reading of the database's clock, or a fresh one outside a tick."""
    return _reading.get() or db_now()
