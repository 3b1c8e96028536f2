"""The rows a hosted step writes (issue 25: ~4 events, 2 turns and a waggle observation per tool step) update
every index of their table, one index entry and WAL record each: those tables carry only the indexes their
reads use (migrations veronica 0033 and waggle 0003 dropped event.space_id, event.kind and its pattern-ops
twin, turn.session_id and foragecall.space_key and its twin, each led by a composite index or read by none),
and the reads still find their rows through an index."""
from __future__ import annotations

import pytest
from django.db import connection

from veronica.models import Event, Turn
from waggle.models import ForageCall

pytestmark = pytest.mark.django_db

EXPECTED = {
    "veronica_event": {("id",), ("space_id", "seq"), ("member_id", "seq"), ("member_id", "kind", "seq")},
    "veronica_turn": {("id",), ("session_id", "seq")},
    "waggle_foragecall": {("id",), ("space_key", "session_key", "seq"), ("space_key", "id"), ("created",)},
}


def indexed(table: str) -> list[tuple[str, ...]]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table).values()
    return [tuple(c["columns"]) for c in found if c["index"] or c["unique"] or c["primary_key"]]


@pytest.mark.parametrize("table", sorted(EXPECTED))
def test_a_step_written_table_has_only_the_indexes_its_reads_use(table):
    assert sorted(indexed(table)) == sorted(EXPECTED[table])
    if connection.vendor == "postgresql":  # introspection leaves out a varchar_pattern_ops twin; pg_index does not
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass", [table])
            assert cursor.fetchone()[0] == len(EXPECTED[table])


def plan_of(queryset) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a few rows: the plan a big table gets
    return queryset.explain()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="index plans are PostgreSQL's")
def test_the_reads_of_those_tables_use_the_composite_indexes(space):
    cases = [
        # the socket feed and the events API: a space's events after a seq
        (Event.objects.filter(space_id=space.pk, seq__gt=10).order_by("seq")[:500], "event_seq_unique_per_space"),
        # the lease watchdog's recount of killed runs' calls (veronica.engine.leases._recount)
        (Event.objects.filter(member_id__in=[1, 2], kind="model.called", payload__run__in=[3]), "event_member_seq_idx"),
        # a run's marks (veronica.web.run_trace)
        (Event.objects.filter(member_id=1, kind="run.started", payload__run=3).order_by("-seq")[:1], "event_run_marks_idx"),
        # a transcript (veronica.agent.transcript) and a session's deletion
        (Turn.objects.filter(session_id=1).order_by("seq"), "turn_seq_unique"),
        (Turn.objects.filter(session_id__in=[1, 2]), "turn_seq_unique"),
        # waggle's window and trim (waggle.window, waggle.sweeping) and a session's calls (waggle.recording)
        (ForageCall.objects.filter(space_key="1").order_by("-id")[:200], "waggle_fc_space_id"),
        (ForageCall.objects.filter(space_key="1", id__lt=50), "waggle_fc_space_id"),
        (ForageCall.objects.filter(space_key="1", session_key="2").order_by("-seq")[:1], "waggle_fc_session_seq"),
    ]
    for queryset, index in cases:
        plan = plan_of(queryset)
        assert index in plan, (str(queryset.query), plan)
