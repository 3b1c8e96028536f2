"""Waggle's writes on a member's path never break the host's transaction, at no round trip of their own.

On PostgreSQL a failed statement aborts the whole transaction it runs in, so waggle's writes inside
the host's transaction go in a savepoint. A plain savepoint (SAVEPOINT, the INSERT, RELEASE) is three
round trips for one row on every tool call; here the common case is one: the recorded call's INSERT
goes to the server as ``SAVEPOINT; INSERT; RELEASE`` in a single simple-protocol query (what Django's
default psycopg cursor, which binds parameters client-side, sends; a connection that binds on the
server sends the three as one pipeline). Any other statement run under the
guard first opens the savepoint on its own, so whatever waggle runs there is contained. SQLite rolls
back only the failing statement, and outside a transaction each statement is its own: no savepoint.

A host that writes its own step in one last statement before the commit may take waggle's row into
that statement instead (``host_defers``, e.g. veronica.swarm.events.defer_insert): no round trip at all. Only
a row that cannot fail on its own data is handed over (the caller checks every value against its
column first: lengths, ranges, text the database stores), and only while the savepoint is not open.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator

from django.db import DatabaseError, connection

NAME = "waggle_write"

# The host's writer of new rows into its transaction's last statement: fn(model, rows) -> bool (False:
# not taken, write them now). None: every row is written where it is recorded.
_host_defer: Callable[[type, list], bool] | None = None


def host_defers(fn: Callable[[type, list], bool] | None) -> None:
    """Register (or, with None, drop) the host's deferred writer (see the module docstring)."""
    global _host_defer
    _host_defer = fn


class Guard:
    """The active guard: whether its savepoint is open (it opens with the first statement) and whether
    it is released already (the one-trip query of execute() releases its own)."""

    def __init__(self) -> None:
        self.open = self.released = False

    def __call__(self, execute, sql, params, many, context):  # a Django execute_wrapper
        if not self.open:
            execute(f"SAVEPOINT {NAME}", None, False, context)
            self.open = True
        return execute(sql, params, many, context)

    def defer(self, model: type, rows: list) -> bool:
        """Hand these new rows to the host's last statement; False when not taken (write them now). The
        caller vouches that they cannot fail on their own data; nothing may read them back before
        the host's transaction ends."""
        return not self.open and _host_defer is not None and bool(_host_defer(model, rows))

    def execute(self, sql: str, params) -> None:
        """Run ``sql`` (one statement, no result) in the savepoint, in one round trip when the savepoint
        is not open yet: ``SAVEPOINT; sql; RELEASE`` as one simple-protocol query when parameters are
        bound on the client; a connection that binds them on the server (prepared statements, veronica's
        hosted default) sends the three statements as one pipeline."""
        if self.open:
            with connection.cursor() as cur:
                cur.execute(sql, params)
            return
        self.open = self.released = True
        if not connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
            with connection.cursor() as cur:
                cur.execute(f"SAVEPOINT {NAME}; {sql}; RELEASE SAVEPOINT {NAME}", params)
            return
        # Server-side binding: the three as one pipeline (psycopg sends them together, syncs once), so
        # the INSERT is still a prepared statement; psycopg's errors come out as Django's. A libpq too
        # old for pipelines (< 14) sends them one by one.
        import psycopg

        connection.ensure_connection()
        piped = connection.connection.pipeline() if psycopg.capabilities.has_pipeline() else nullcontext()
        with connection.wrap_database_errors, piped:
            with connection.cursor() as cur:
                cur.execute(f"SAVEPOINT {NAME}")
                cur.execute(sql, params)
                cur.execute(f"RELEASE SAVEPOINT {NAME}")


_local = threading.local()


def current() -> Guard | None:
    """The guard of the block this thread is in, if any."""
    return getattr(_local, "guard", None)


@contextmanager
def write_guard() -> Iterator[Guard | None]:
    """Contain waggle's statements in the block (see the module docstring); yields the guard or None."""
    if connection.vendor == "sqlite" or not connection.in_atomic_block:
        yield None
        return
    guard = _local.guard = Guard()
    try:
        with connection.execute_wrapper(guard):
            try:
                yield guard
            except Exception:
                if guard.open:
                    _rollback()
                raise
    finally:
        _local.guard = None
    if guard.open and not guard.released:
        with connection.cursor() as cur:
            cur.execute(f"RELEASE SAVEPOINT {NAME}")


def _rollback() -> None:
    """Back to the savepoint, if it exists: a SAVEPOINT sent in one query with a failing INSERT may
    itself have failed (the host's transaction was aborted before), and then there is nothing to undo."""
    try:
        with connection.cursor() as cur:
            cur.execute(f"ROLLBACK TO SAVEPOINT {NAME}")
            cur.execute(f"RELEASE SAVEPOINT {NAME}")
    except DatabaseError:
        pass
