"""Waggle's writes on a member's path never break the host's transaction, at no round trip of their own.

On PostgreSQL a failed statement aborts the whole transaction it runs in, so waggle's writes inside
the host's transaction go in a savepoint. A plain savepoint (SAVEPOINT, the INSERT, RELEASE) is three
round trips for one row on every tool call; here the common case is one: the recorded call's INSERT
goes to the server as ``SAVEPOINT; INSERT; RELEASE`` in a single simple-protocol query (what Django's
default psycopg cursor, which binds parameters client-side, sends). Any other statement run under the
guard first opens the savepoint on its own, so whatever waggle runs there is contained. SQLite rolls
back only the failing statement, and outside a transaction each statement is its own: no savepoint.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from django.db import DatabaseError, connection

NAME = "waggle_write"


class Guard:
    """The active guard: whether its savepoint is open (it opens with the first statement) and whether
    it is released already (the one-trip query releases its own)."""

    def __init__(self) -> None:
        self.open = self.released = False

    def __call__(self, execute, sql, params, many, context):  # a Django execute_wrapper
        if not self.open:
            execute(f"SAVEPOINT {NAME}", None, False, context)
            self.open = True
        return execute(sql, params, many, context)

    def one_trip(self, sql: str) -> str | None:
        """``sql`` wrapped in the savepoint, as one query (the guard then has nothing left to do), or
        None when it must run as it is (the savepoint is already open, or parameters are bound on the
        server, where one prepared statement cannot hold three)."""
        if self.open or connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
            return None
        self.open = True
        self.released = True
        return f"SAVEPOINT {NAME}; {sql}; RELEASE SAVEPOINT {NAME}"


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
