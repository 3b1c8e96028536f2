"""Lock order on PostgreSQL: member row, then space row. A run's fenced write renews its lease (the
member row) and then emits (the space row's event counter); a ledger write that emitted first and
then touched the member (current_task) deadlocked with it (bench/recovery.py, hosted: "deadlock
detected" creating a task for a member mid-run). SQLite serializes writers: nothing to order there."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from veronica.swarm import ledger
from veronica.engine import supervisor

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks are PostgreSQL's")


def first(queries, predicate) -> int:
    return next(i for i, q in enumerate(queries) if predicate(q["sql"]))


def locks_member_before_space(queries) -> bool:
    member = first(queries, lambda sql: 'FROM "veronica_member"' in sql and "FOR UPDATE" in sql)
    space = first(queries, lambda sql: sql.startswith('UPDATE "veronica_space"'))
    return member < space


def test_creating_and_assigning_a_task_locks_the_assignee_before_the_space(space):
    w1 = supervisor.get_member(space, "w1")
    with CaptureQueriesContext(connection) as created:
        ledger.create_task(space, "boss", "a job", assignee=w1)
    assert locks_member_before_space(created.captured_queries)
    task = ledger.create_task(space, "boss", "another job")
    with CaptureQueriesContext(connection) as assigned:
        ledger.assign(task, w1, actor="boss")
    assert locks_member_before_space(assigned.captured_queries)
    with CaptureQueriesContext(connection) as finished:
        ledger.transition(task, "done", actor="w1")
    assert locks_member_before_space(finished.captured_queries)
