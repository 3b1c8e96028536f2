"""A session pinned by its run (issue 13): waggle trusts its own view of the session for the length
of the pin, so a read-only call costs one INSERT, not ~8 statements (on PostgreSQL inside the host's
transaction its savepoint travels in the same round trip: waggle.guard); the rows it writes are the
same as without the pin."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from waggle import service
from waggle.config import WaggleConfig
from waggle.models import ForageCall

pytestmark = pytest.mark.django_db

QUIET = WaggleConfig(mine_period=10_000)
PER_CALL = 1  # the INSERT (on PostgreSQL: SAVEPOINT; INSERT; RELEASE in one query, or one pipeline)
TRIPLE = ("SAVEPOINT waggle_write", 'INSERT INTO "waggle_foragecall"', "RELEASE SAVEPOINT waggle_write")


def round_trips(piped: list) -> int:
    """Statements sent inside one psycopg pipeline (server-side binding) go in one round trip; piped holds
    each statement's pipeline (None: sent on its own)."""
    return sum(1 for i, pipe in enumerate(piped) if pipe is None or i == 0 or piped[i - 1] is not pipe)


def call(i):
    service.observe("1", "s1", "m1", "read_file", {"path": f"f{i}"}, False, f"out {i}", config=QUIET)
    assert service.follow("1", "s1", lambda name, args: "x", config=QUIET) is None
    service.judge_reply("1", "s1", [("read_file", {"path": f"f{i + 1}"})], config=QUIET)


def test_a_pinned_session_costs_one_insert_per_read_only_call():
    piped: list = []

    def in_pipeline(execute, sql, params, many, context):
        piped.append(getattr(connection.connection, "_pipeline", None))  # psycopg's open pipeline, if any
        return execute(sql, params, many, context)

    with service.pinned("1", "s1"):
        call(0)  # the first call syncs the ring and reads the routes once
        with CaptureQueriesContext(connection) as queries, connection.execute_wrapper(in_pipeline):
            for i in range(1, 6):
                call(i)
    sqls = [q["sql"] for q in queries.captured_queries]
    assert round_trips(piped) == 5 * PER_CALL, [s[:60] for s in sqls]
    if connection.vendor == "postgresql":  # the test's transaction is the host's: the savepoint rode along
        one_query = all(s.startswith("SAVEPOINT waggle_write; INSERT") for s in sqls)
        piped_triples = len(sqls) == 15 and all(s.startswith(TRIPLE[i % 3]) for i, s in enumerate(sqls)) and all(p is not None for p in piped)
        assert one_query or piped_triples, [s[:60] for s in sqls]
    else:
        assert piped == [None] * len(sqls)
    assert list(ForageCall.objects.filter(session_key="s1").order_by("seq").values_list("seq", flat=True)) == [1, 2, 3, 4, 5, 6]


def test_without_the_pin_every_call_checks_the_database():
    call(0)
    with CaptureQueriesContext(connection) as queries:
        call(1)
    assert len(queries.captured_queries) > PER_CALL


def test_a_pin_ends_with_its_run_and_the_next_one_resyncs():
    with service.pinned("1", "s1"):
        call(0)
    ForageCall.objects.create(space_key="1", session_key="s1", member_key="m1", seq=2, tool="list_dir", args={},
                              mutates=False, out_hash="h", est_tokens=1)  # another process, between two runs
    with service.pinned("1", "s1"):
        call(1)
    assert list(ForageCall.objects.filter(session_key="s1").order_by("seq").values_list("seq", flat=True)) == [1, 2, 3]
