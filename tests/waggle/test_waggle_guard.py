"""waggle.guard: a recorded call inside the host's transaction is one query, and whatever fails under the
guard is rolled back alone; the host's transaction and its own savepoints are untouched (both modes)."""
from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from waggle import guard, recording, service
from waggle.config import WaggleConfig
from waggle.models import ForageCall
from tests.harness import round_trips

pytestmark = pytest.mark.django_db

QUIET = WaggleConfig(mine_period=10_000)
ONLY_PG = pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite needs no guard: each write is its own")


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
    def failing_insert(row, **kwargs):
        sql = "INSERT INTO waggle_no_such_table (x) VALUES (%s)"
        current = guard.current()
        if current is not None:
            return current.execute(sql, [1])
        with connection.cursor() as cur:
            cur.execute(sql, [1])

    with transaction.atomic():
        observe("s1", {"path": "a"})
        monkeypatch.setattr(recording, "_insert_forage", failing_insert)
        observe("s1", {"path": "b"})  # swallowed, and rolled back to the guard's savepoint
        monkeypatch.undo()
        observe("s1", {"path": "c"})
        assert ForageCall.objects.filter(session_key="s1").count() == 2  # the transaction is still usable


def test_a_statement_before_the_insert_opens_the_savepoint_and_it_is_released(monkeypatch):
    real = recording._insert_forage
    sent = []

    def read_then_insert(row, **kwargs):
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        current = guard.current()
        sent.append(current and current.open)  # the SELECT opened it
        real(row, **kwargs)

    monkeypatch.setattr(recording, "_insert_forage", read_then_insert)
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


@pytest.fixture(params=["server-side", "client-side"])
def binding(request):
    """PostgreSQL: run the test with parameters bound on the server (prepared statements, the hosted
    default) and on the client (VERONICA_DB_PREPARE_THRESHOLD=0)."""
    if connection.vendor != "postgresql":
        pytest.skip("the savepoint exists on PostgreSQL only")
    options = connection.settings_dict["OPTIONS"]
    saved = dict(options)
    connection.close()
    if request.param == "client-side":
        options.pop("server_side_binding", None)
        options.pop("prepare_threshold", None)
    else:
        options.update(server_side_binding=True, prepare_threshold=5)
    yield request.param
    connection.close()
    options.clear()
    options.update(saved)


@pytest.mark.django_db(transaction=True)
def test_either_binding_records_in_one_round_trip_and_contains_a_failure(binding, monkeypatch):
    with transaction.atomic(), service.pinned("1", "b1"):
        observe("b1", {"path": "first"})  # syncs the pinned session's ring (a read, then the INSERT)
        with round_trips() as sent:
            observe("b1", {"path": "a"})
        assert len(sent) == 1, sent  # one query (client-side binding) or one pipeline (server-side)
        assert [part.split(" (")[0] for part in sent[0].split("; ")] == [
            "SAVEPOINT waggle_write", 'INSERT INTO "waggle_foragecall"', "RELEASE SAVEPOINT waggle_write"]
        real = recording._insert_forage

        def broken(row, **kwargs):
            row.tool = "x" * 500  # longer than the column: the server refuses the INSERT
            real(row, **kwargs)

        monkeypatch.setattr(recording, "_insert_forage", broken)
        observe("b1", {"path": "b"})  # fails under the guard: rolled back to its savepoint, swallowed
        monkeypatch.undo()
        observe("b1", {"path": "c"})
        assert ForageCall.objects.filter(session_key="b1").count() == 3  # the host's transaction is still usable
    assert ForageCall.objects.filter(session_key="b1").count() == 3


@pytest.mark.django_db(transaction=True)
def test_without_pipelines_the_savepoint_still_contains_a_failure(binding, monkeypatch):
    """A libpq older than 14 has no pipeline mode: the three statements go one by one, still contained."""
    import psycopg

    monkeypatch.setattr(psycopg.capabilities, "has_pipeline", lambda check=False: False)
    with transaction.atomic(), service.pinned("1", "b2"):
        observe("b2", {"path": "first"})
        real = recording._insert_forage

        def broken(row):
            row.tool = "x" * 500
            real(row)

        monkeypatch.setattr(recording, "_insert_forage", broken)
        observe("b2", {"path": "b"})
        monkeypatch.setattr(recording, "_insert_forage", real)
        observe("b2", {"path": "c"})
        assert ForageCall.objects.filter(session_key="b2").count() == 2


# --- the host's deferred writer: a row that cannot fail rides the host's last statement ----------------

@pytest.fixture
def host(monkeypatch):
    """A host that takes every row it is offered (or, with host.take = False, none), and keeps them."""
    class Host:
        take = True
        rows: list = []

        def __call__(self, model, rows):
            if self.take:
                self.rows.extend(rows)
            return self.take
    fake = Host()
    monkeypatch.setattr(guard, "_host_defer", fake)
    return fake


@ONLY_PG
def test_a_pinned_sessions_call_rides_the_hosts_statement_and_sends_nothing(host):
    with transaction.atomic(), service.pinned("1", "d1"):
        observe("d1", {"path": "first"})  # syncs the ring: a read, which opens the savepoint: written here
        with round_trips() as sent:
            observe("d1", {"path": "a"})
            observe("d1", {"path": "b"})
        assert sent == []
        assert [(r.seq, r.args) for r in host.rows] == [(2, {"path": "a"}), (3, {"path": "b"})]
        assert ForageCall.objects.filter(session_key="d1").count() == 1  # the two are the host's to write


@ONLY_PG
def test_a_call_the_host_refuses_or_that_is_not_pinned_is_written_at_once(host):
    with transaction.atomic():
        observe("d2", {"path": "a"})  # not pinned: each call reads the ring's last seq back from the table
        observe("d2", {"path": "b"})
        assert host.rows == []
        assert list(ForageCall.objects.filter(session_key="d2").order_by("seq").values_list("seq", flat=True)) == [1, 2]
        host.take = False
        with service.pinned("1", "d2"):
            observe("d2", {"path": "c"})
            observe("d2", {"path": "d"})
        assert list(ForageCall.objects.filter(session_key="d2").order_by("seq").values_list("seq", flat=True)) == [1, 2, 3, 4]


@ONLY_PG
def test_the_call_an_inline_sweep_mines_right_after_is_written_at_once(host):
    cfg = WaggleConfig(mine_period=3, sweep_async=False)
    with transaction.atomic(), service.pinned("1", "d3"):
        for path in "abcd":
            service.observe("1", "d3", "m", "read_file", {"path": path}, False, "out", config=cfg)
        assert [r.seq for r in host.rows] == [2, 4]  # 1 synced the ring; the sweep after 3 reads the table
        assert list(ForageCall.objects.filter(session_key="d3").values_list("seq", flat=True).order_by("seq")) == [1, 3]


def test_only_a_row_whose_every_value_fits_its_column_is_handed_over():
    def row(**kw):
        values = dict(space_key="1", session_key="s", member_key="m", seq=1, tool="read_file", out_hash="ab" * 8,
                      est_tokens=10, mutates=False, oversized=False, replayed=False, args={"path": "a \\u0000 é"},
                      out_refs=[[["n"], 1.5]])
        values.update(kw)
        return ForageCall(**values)
    assert recording._fits(row())
    for bad in (dict(space_key=""), dict(session_key="s" * 65), dict(member_key="m" * 65), dict(tool="t" * 201),
                dict(out_hash="a" * 17), dict(seq=-1), dict(seq=2 ** 63), dict(est_tokens=2 ** 31), dict(est_tokens=-1),
                dict(est_tokens=1.5), dict(mutates=None), dict(tool="a\x00b"), dict(member_key="\ud800"),
                dict(args={"x": float("nan")}), dict(args={"x": "a\x00b"}), dict(args={"x": "\udc00"}),
                dict(out_refs=[[["k"], float("inf")]]), dict(args={"x": object()})):
        assert not recording._fits(row(**bad)), bad
