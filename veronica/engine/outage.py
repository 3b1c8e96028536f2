"""A worker host's note that it cannot reach the database, shared by its qcluster's processes.

A cut-off host must stop taking wakes it cannot run (DESIGN §3: a wake is a doorbell, any host that
can reach the database may answer it). The note is one small file named by VERONICA_DB_OUTAGE_MARK,
which `manage.py qcluster` sets before q2 forks its pusher and workers: a worker whose claim fails
on a connection error writes it, the pusher (veronica.engine.qbroker.GatedRedis) fetches nothing
while it stands, and the engine ticker, whose every beat is a statement on the database, writes it
when a beat fails that way and removes it at the first beat that gets through. The file holds the
monotonic time (system-wide on Linux) until which it stands, so a host whose ticker died resumes
fetching after HOLD_SECONDS instead of never. Without the variable (no qcluster around: tests, a
shell) the note is the process's own and stands LOCAL_SECONDS, as nothing else would lift it.
"""
from __future__ import annotations

import os
import time

MARK_ENV = "VERONICA_DB_OUTAGE_MARK"
HOLD_SECONDS = 30.0  # re-written at every failed beat (each takes the connect timeout), so it never lapses mid-outage
LOCAL_SECONDS = 5.0

_local_until = 0.0


def _path() -> str:
    return os.environ.get(MARK_ENV, "")


def network_database() -> bool:
    """A database across a network can be cut off; SQLite's "database is locked" is no partition
    (the note is then the failing process's own: the host's other workers carry on)."""
    from django.db import connection

    return connection.vendor != "sqlite"


def mark_down() -> None:
    global _local_until
    path = _path()
    if not path or not network_database():
        _local_until = time.monotonic() + LOCAL_SECONDS
        return
    until = time.monotonic() + HOLD_SECONDS
    tmp = f"{path}.{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            fh.write(repr(until))
        os.replace(tmp, path)  # readers see the old note or the new one, never half of one
    except OSError:
        _local_until = until


def mark_up() -> None:
    global _local_until
    _local_until = 0.0
    path = _path()
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def is_down() -> bool:
    if time.monotonic() < _local_until:
        return True
    path = _path()
    if not path:
        return False
    try:
        with open(path) as fh:
            until = float(fh.read())
    except (OSError, ValueError):
        return False
    return time.monotonic() < until
