"""The spaces list (GET /api/spaces/ and the console home page) costs the same whatever a space holds.

Issue 21.4: the counts were three LEFT JOINs (members, tasks, approvals) with COUNT(DISTINCT), so
one space with 52 members, 403 tasks and 464 approvals produced ~9.7 million joined rows (7.7 s on
PostgreSQL, 12-20 s embedded). The pages must run a fixed number of queries, none of which joins
two of those tables, for staff and for users who see the space through a grant.
"""
from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.console.conftest import make_space
from veronica.swarm import access
from veronica.models import Approval, Member, Task

FANOUT_TABLES = re.compile(r'JOIN\s+"?veronica_(member|task|approval)"?\s', re.IGNORECASE)


def fill(space, members: int, tasks: int, approvals: int) -> None:
    """Bulk rows (no events, no verbs): the pages only count them."""
    Member.objects.bulk_create(Member(space=space, name=f"bulk{i}") for i in range(members))
    Task.objects.bulk_create(Task(space=space, title=f"t{i}", creator_name="boss") for i in range(tasks))
    someone = Member.objects.filter(space=space).first()
    Approval.objects.bulk_create(Approval(space=space, member=someone, tool_name="write_file") for _ in range(approvals))


@pytest.fixture
def readers(db, tmp_path):
    space = make_space(tmp_path, "gamma", workers=())
    reader = User.objects.create_user("reader")
    admin = User.objects.create_user("admin", is_staff=True, is_superuser=True)
    access.grant(space, "reader", "viewer", actor="test")
    return space, {"reader": reader, "admin": admin}


def measure(client, url: str) -> tuple[int, list[str]]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return len(ctx.captured_queries), [q["sql"] for q in ctx.captured_queries]


@pytest.mark.parametrize("url", ["/api/spaces/", "/"])
@pytest.mark.parametrize("who", ["reader", "admin"])
def test_the_spaces_list_is_a_fixed_number_of_queries_none_joining_members_tasks_or_approvals(readers, client, url, who):
    space, users = readers
    client.force_login(users[who])
    client.get(url)  # warm anything cached per process (content types, templates)
    small, _ = measure(client, url)
    fill(space, members=50, tasks=400, approvals=460)
    big, sqls = measure(client, url)
    assert big == small, f"{who} {url}: {small} queries with one member, {big} with 50 members / 400 tasks"
    assert big <= 8, f"{who} {url}: {big} queries"
    for sql in sqls:  # each joined table multiplies the others' rows: counts are per-table subqueries
        joined = FANOUT_TABLES.findall(sql)
        assert len(joined) <= 1, f"a query joins {joined}, costing their product: {sql[:400]}"


def test_the_counts_are_right(readers, client):
    space, users = readers
    fill(space, members=5, tasks=7, approvals=3)
    Task.objects.filter(space=space, title="t0").update(status="done")
    Member.objects.filter(space=space, name="bulk0").update(removed_at="2026-01-01T00:00:00Z")
    Approval.objects.filter(pk=Approval.objects.filter(space=space).first().pk).update(status="approved")
    client.force_login(users["reader"])
    [row] = client.get("/api/spaces/").json()["spaces"]
    assert (row["members"], row["open_tasks"], row["pending_approvals"]) == (1 + 4, 6, 2)
    assert row["role"] == "viewer"


def test_the_admins_space_list_counts_per_space_without_joining_members_and_tasks(readers, client, monkeypatch):
    """The admin's changelist counted members and open tasks through two JOINs with COUNT(DISTINCT): their product
    (50 members x 20,000 open tasks of a big space: 3.5 s). Open tasks are counted up to the spaces list's cap."""
    from veronica.api import selectors as sel

    monkeypatch.setattr(sel, "OPEN_TASKS_CAP", 5)
    space, users = readers
    fill(space, members=3, tasks=7, approvals=0)
    client.force_login(users["admin"])
    with CaptureQueriesContext(connection) as ctx:
        html = client.get("/admin/veronica/space/").content.decode()
    for sql in (q["sql"] for q in ctx.captured_queries):
        joined = FANOUT_TABLES.findall(sql)
        assert len(joined) <= 1, f"a query joins {joined}, costing their product: {sql[:400]}"
    assert '<td class="field-member_count">4</td>' in html and '<td class="field-open_tasks">5+</td>' in html
