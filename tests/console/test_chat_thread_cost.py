"""A member's chat with the operator (issue 25.4: the member page in a big space). Each direction of the
thread is read through its own partial index and the two are merged: as one query with an OR, SQLite's
planner walked the space's every message backwards by id (the member page took 101 ms beside 500,000
messages, bench/fleet_scale.py embedded)."""
from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from veronica.engine import supervisor
from veronica.models import Message
from veronica.swarm import bus, chat

pytestmark = pytest.mark.django_db


def _thread_of(world):
    """w1's thread, both ways and interleaved, among mail that is not its chat with the operator."""
    w1, w2 = supervisor.get_member(world.space, "w1"), supervisor.get_member(world.space, "w2")
    ours = []
    for i in range(4):
        ours.append(bus.send(world.space, bus.OPERATOR, "w1", f"ask {i}")[0].pk)
        bus.send(world.space, "w2", "w1", f"noise {i}")
        bus.send(world.space, bus.OPERATOR, "w2", f"w2's {i}")
        ours.append(Message.objects.create(space=world.space, sender=w1, sender_name="w1", recipient_name=bus.OPERATOR,
                                           body=f"answer {i}").pk)
        Message.objects.create(space=world.space, sender=w2, sender_name="w2", recipient_name=bus.OPERATOR, body=f"w2 says {i}")
    return w1, ours


def test_the_thread_pages_back_through_both_directions_in_order(world):
    w1, ours = _thread_of(world)
    seen, before = [], None
    while True:
        page = chat.conversation(w1, before=before, limit=3)
        seen = [m["id"] for m in page["messages"]] + seen
        before = page["next_before"]
        if before is None:
            break
    assert seen == ours
    whole = chat.conversation(w1, limit=8)
    assert [m["body"] for m in whole["messages"]][:2] == ["ask 0", "answer 0"] and whole["next_before"] is None


def _plan(sql: str, params) -> str:
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("ANALYZE veronica_message")
            # a test-sized table is scanned whole, or bitmap-scanned, whatever its indexes
            cur.execute("SET LOCAL enable_seqscan = off")
            cur.execute("SET LOCAL enable_bitmapscan = off")
            cur.execute("EXPLAIN " + sql, params)
            return "\n".join(row[0] for row in cur.fetchall())
        cur.execute("EXPLAIN QUERY PLAN " + sql, params)
        return "\n".join(str(row[-1]) for row in cur.fetchall())


def test_each_direction_is_read_through_its_own_index_never_the_spaces_every_message(world):
    w1, _ = _thread_of(world)
    with CaptureQueriesContext(connection) as queries:
        chat.conversation(w1, limit=30)
    reads = [q["sql"] for q in queries.captured_queries if 'FROM "veronica_message"' in q["sql"]]
    assert len(reads) == 2, reads
    with transaction.atomic():  # (SET LOCAL lasts for it)
        plans = []
        for direction in chat.thread_directions(w1):
            sql, params = direction.order_by("-id")[:31].query.sql_with_params()
            plans.append(_plan(sql, params))
    assert "msg_from_operator_idx" in plans[0] and "msg_to_operator_idx" in plans[1], plans
    assert not any("msg_space_newest_idx" in plan for plan in plans), plans
