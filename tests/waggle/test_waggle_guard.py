"""waggle.guard: a recorded call inside the host's transaction is one query, and whatever fails under the
guard is rolled back alone; the host's transaction and its own savepoints are untouched (both modes)."""
from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from waggle import guard, service
from waggle.config import WaggleConfig
from waggle.models import ForageCall

pytestmark = pytest.mark.django_db

QUIET = WaggleConfig(mine_period=10_000)


def observe(session: str, args: dict, tool: str = "read_file") -> None:
    service.observe("1", session, "m", tool, args, False, "out", config=QUIET)


def test_a_call_with_a_nul_is_kept_as_a_barrier_and_the_hosts_transaction_goes_on():
    with transaction.atomic():
        observe("s1", {"path": "a"})
        observe("s1", {"path": "a\x00b"})  # PostgreSQL's jsonb refuses NUL: kept with U+FFFD, as a barrier
        observe("s1", {"path": "c"})
        rows = list(ForageCall.objects.filter(session_key="s1").order_by("seq").values_list("seq", "oversized", "args"))
    assert [(seq, oversized) for seq, oversized, _ in rows] == [(1, False), (2, True), (3, False)]
    assert rows[1][2] == {"path": "a\ufffdb"}


def test_a_failing_statement_under_the_guard_is_rolled_back_alone(monkeypatch):
    def failing_insert(row):
        sql = "INSERT INTO waggle_no_such_table (x) VALUES (%s)"
        current = guard.current()
        with connection.cursor() as cur:
            cur.execute((current and current.one_trip(sql)) or sql, [1])

    with transaction.atomic():
        observe("s1", {"path": "a"})
        monkeypatch.setattr(service, "_insert_forage", failing_insert)
        observe("s1", {"path": "b"})  # swallowed, and rolled back to the guard's savepoint
        monkeypatch.undo()
        observe("s1", {"path": "c"})
        assert ForageCall.objects.filter(session_key="s1").count() == 2  # the transaction is still usable


def test_a_statement_before_the_insert_opens_the_savepoint_and_it_is_released(monkeypatch):
    real = service._insert_forage
    sent = []

    def read_then_insert(row):
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        current = guard.current()
        sent.append(current and current.open)  # the SELECT opened it
        real(row)

    monkeypatch.setattr(service, "_insert_forage", read_then_insert)
    with transaction.atomic():
        observe("s2", {"path": "a"})
        if connection.vendor == "postgresql":
            assert sent == [True]
            with pytest.raises(DatabaseError, match="waggle_write"), transaction.atomic():
                with connection.cursor() as cur:  # released: nothing of waggle's is left open in the host's transaction
                    cur.execute("ROLLBACK TO SAVEPOINT waggle_write")
        else:
            assert sent == [None]  # no guard on SQLite
        assert ForageCall.objects.filter(session_key="s2").count() == 1


def test_the_hosts_own_savepoint_still_rolls_back_what_waggle_wrote():
    with transaction.atomic():
        try:
            with transaction.atomic():
                observe("s3", {"path": "a"})
                raise RuntimeError("the host's step fails")
        except RuntimeError:
            pass
        assert not ForageCall.objects.filter(session_key="s3").exists()
        observe("s3", {"path": "b"})
    assert ForageCall.objects.filter(session_key="s3").count() == 1


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_there_is_no_savepoint():
    with CaptureQueriesContext(connection) as queries:
        observe("s4", {"path": "a"})
    assert not any("SAVEPOINT" in q["sql"] for q in queries.captured_queries)
    assert guard.current() is None
