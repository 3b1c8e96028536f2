"""GET /api/spaces/<slug>/tasks/ (issue 25.4: a list that grows with the space): without a status it reads a
space's newest tasks through an index (space, -updated_at, -id), where it sorted every task of the space for
each call (110 ms at 100,000 tasks on PostgreSQL; the plan is PostgreSQL's, SQLite's planner is not asked);
of each task's assignee it reads only the name (the whole member row was 40% of a 200-task list's CPU)."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from veronica.engine import supervisor
from veronica.models import Task

pytestmark = pytest.mark.django_db


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plan")
def test_the_task_list_reads_the_newest_tasks_of_a_space_without_sorting_them_all(world):
    Task.objects.bulk_create(Task(space=world.space, title=f"t{i}", creator_name="boss", status=("done", "pending")[i % 2])
                             for i in range(300))
    client = world.client(world.viewer)
    with CaptureQueriesContext(connection) as queries:
        rows = client.get("/api/spaces/alpha/tasks/?limit=5").json()["tasks"]
    assert [r["id"] for r in rows] == list(Task.objects.filter(space=world.space).order_by("-updated_at", "-id")
                                           .values_list("id", flat=True)[:5])
    [listing] = [q["sql"] for q in queries.captured_queries if 'FROM "veronica_task"' in q["sql"]]
    with connection.cursor() as cur:
        cur.execute("ANALYZE veronica_task")  # the planner's row estimate, not whatever the stats held before the insert
        # a test-sized table is scanned whole, or bitmap-scanned then sorted, whatever its indexes
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("SET LOCAL enable_bitmapscan = off")
        cur.execute("EXPLAIN " + listing)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "task_recent_idx" in plan and "Sort" not in plan, plan


def test_the_task_list_reads_of_each_assignee_only_its_name(world):
    w1 = supervisor.get_member(world.space, "w1")
    type(w1).objects.filter(pk=w1.pk).update(persona="p" * 5000)
    Task.objects.create(space=world.space, title="mine", creator_name="boss", assignee=w1, spec="do it")
    Task.objects.create(space=world.space, title="nobody's", creator_name="boss")
    client = world.client(world.viewer)
    with CaptureQueriesContext(connection) as queries:
        rows = client.get("/api/spaces/alpha/tasks/").json()["tasks"]
    assert [(r["title"], r["assignee"], r["spec"]) for r in rows] == [("nobody's", None, ""), ("mine", "w1", "do it")]
    [listing] = [q["sql"] for q in queries.captured_queries if 'FROM "veronica_task"' in q["sql"]]
    assert '"veronica_member"."name"' in listing and '"veronica_member"."persona"' not in listing, listing
