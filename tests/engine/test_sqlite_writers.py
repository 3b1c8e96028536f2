"""Embedded mode: a process's SQLite writers queue on a lock of the process (veronica.plumbing.sqlite_serial),
not in SQLite's sleeping busy handler; the lock is given back however the transaction ends, and a
wait on it is bounded by the busy timeout."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from veronica.models import Space

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "sqlite", reason="embedded mode's database")]


def writers():
    from veronica.plumbing.sqlite_serial import base

    return base


def test_a_transaction_holds_the_process_lock_until_it_ends_however_it_ends():
    base = writers()
    with transaction.atomic():
        Space.objects.create(name="a", slug="a", workdir="/tmp/a")
        assert base._writers.locked()
    assert not base._writers.locked()
    with pytest.raises(ValueError):
        with transaction.atomic():
            assert base._writers.locked()
            raise ValueError
    assert not base._writers.locked(), "a rollback gives it back"
    with transaction.atomic():
        with transaction.atomic():  # a savepoint: no second take of the lock by its holder
            assert base._writers.locked()
    assert not base._writers.locked()


def test_a_second_threads_transaction_waits_on_the_lock_and_goes_when_the_first_commits():
    base = writers()
    began, done = threading.Event(), threading.Event()
    statements: list[str] = []

    def second() -> None:
        def record(execute, sql, params, many, context):
            statements.append(sql)
            return execute(sql, params, many, context)

        try:
            with connection.execute_wrapper(record):
                began.set()
                with transaction.atomic():
                    Space.objects.create(name="b", slug="b", workdir="/tmp/b")
            done.set()
        finally:
            connections.close_all()

    with transaction.atomic():
        Space.objects.create(name="a", slug="a", workdir="/tmp/a")
        thread = threading.Thread(target=second)
        thread.start()
        began.wait(5)
        time.sleep(0.3)
        assert not done.is_set() and not any("INSERT" in sql for sql in statements), "it waited"
        assert base._writers.locked()
    assert done.wait(5), "it went once the first committed"
    thread.join(5)
    assert Space.objects.filter(slug__in=["a", "b"]).count() == 2


def test_a_wait_past_the_busy_timeout_begins_anyway(monkeypatch):
    base = writers()
    assert base._writers.acquire(timeout=1)  # a holder that never lets go (as a thread stuck mid-transaction)
    try:
        monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.2)
        started = time.monotonic()
        with transaction.atomic():
            Space.objects.create(name="c", slug="c", workdir="/tmp/c")
        assert time.monotonic() - started < 2
    finally:
        base._writers.release()
    assert Space.objects.filter(slug="c").exists()
