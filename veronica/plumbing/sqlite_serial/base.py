"""SQLite with a process's writers queued on a lock of the process, not in SQLite's busy handler.

Embedded mode takes SQLite's one write lock at every transaction's BEGIN (IMMEDIATE). A writer that
finds it taken waits in SQLite's busy handler, which sleeps and tries again on a growing schedule
(1 ms, 2, 5, ... up to 100 ms a try): a lock freed after 2 ms went to whichever sleeper woke first,
often tens of ms later, and with a run pool's hundreds of threads in one worker (bench/fleet.py,
embedded, 500 members) a step's commit waited seconds at the tail. Here a transaction first takes a
lock its process's threads share: they wait for it in the kernel and the next one goes as soon as it
is released, and only one writer per process meets the other processes in SQLite's handler.

The wait is bounded by the busy timeout: past it the transaction begins anyway, and SQLite's own wait
and error apply as before, so no wait here turns into a deadlock that SQLite would have timed out. A
thread that already holds the lock (a second connection of its own) does not wait for itself.
"""
from __future__ import annotations

import os
import threading

from django.db.backends.sqlite3 import base

_writers = threading.Lock()
_held = threading.local()  # .holding: this thread holds _writers


def _after_fork() -> None:
    """A forked child has none of its parent's threads: none holds its lock."""
    global _writers
    _writers = threading.Lock()
    _held.__dict__.clear()


os.register_at_fork(after_in_child=_after_fork)


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_writers = False

    def _start_transaction_under_autocommit(self):
        if not getattr(_held, "holding", False):
            self._holds_writers = _held.holding = _writers.acquire(timeout=float(self.settings_dict["OPTIONS"].get("timeout", 5)))
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._let_writers_go()
            raise

    def _let_writers_go(self) -> None:
        if self._holds_writers:
            self._holds_writers = _held.holding = False
            _writers.release()

    def _commit(self):
        try:
            return super()._commit()
        finally:
            self._let_writers_go()

    def _rollback(self):
        try:
            return super()._rollback()
        finally:
            self._let_writers_go()

    def close(self):
        try:
            super().close()
        finally:
            self._let_writers_go()
