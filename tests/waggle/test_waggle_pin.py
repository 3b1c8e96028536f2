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
from tests.harness import round_trips

pytestmark = pytest.mark.django_db

QUIET = WaggleConfig(mine_period=10_000)
PER_CALL = 1  # the INSERT (on PostgreSQL: SAVEPOINT; INSERT; RELEASE in one query, or in one pipeline)


def call(i):
    service.observe("1", "s1", "m1", "read_file", {"path": f"f{i}"}, False, f"out {i}", config=QUIET)
    assert service.follow("1", "s1", lambda name, args: "x", config=QUIET) is None
    service.judge_reply("1", "s1", [("read_file", {"path": f"f{i + 1}"})], config=QUIET)


def test_a_pinned_session_costs_one_insert_per_read_only_call():
    with service.pinned("1", "s1"):
        call(0)  # the first call syncs the ring and reads the routes once
        with round_trips() as sent:
            for i in range(1, 6):
                call(i)
    assert len(sent) == 5 * PER_CALL, [s[:60] for s in sent]
    if connection.vendor == "postgresql":  # the test's transaction is the host's: the savepoint rode along
        assert all(s.startswith("SAVEPOINT waggle_write; INSERT") and s.endswith("RELEASE SAVEPOINT waggle_write")
                   for s in sent), [s[:60] for s in sent]
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
