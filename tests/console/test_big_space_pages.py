"""Big spaces stay fast (issue 25.4): the bounds the space page, the board and the member page keep.

The board counts each column only up to BOARD_COUNT_CAP and says "N+" past it (an exact count read all
100,000 tasks of a big space on every refresh); the space page reads its roster once for the roster and
usage panels; the member page reads its member once for all of its panels (it read it ten times)."""
from __future__ import annotations

import pytest

from veronica.api import selectors as sel
from veronica.models import Task

pytestmark = pytest.mark.django_db


def _tasks(space, status: str, n: int) -> None:
    Task.objects.bulk_create(Task(space=space, title=f"{status} {i}", creator_name="boss", status=status) for i in range(n))


def test_a_board_column_past_the_cap_shows_the_cap_and_a_plus_and_one_under_it_is_exact(world, monkeypatch):
    monkeypatch.setattr(sel, "BOARD_COUNT_CAP", 60)
    _tasks(world.space, "done", 61)
    _tasks(world.space, "pending", 3)
    board = {col["status"]: col for col in sel.task_board(world.space)}
    assert (board["done"]["count"], board["done"]["more"], len(board["done"]["tasks"])) == (60, True, 50)
    assert (board["pending"]["count"], board["pending"]["more"]) == (3, False)
    assert (board["running"]["count"], board["running"]["tasks"]) == (0, [])
    html = world.client(world.viewer).get("/spaces/alpha/panels/tasks/").content.decode()
    assert '<span class="count">60+</span>' in html and "showing the latest 50 of 60+" in html
    assert '<span class="count">3</span>' in html
    assert f'href="/spaces/alpha/tasks/{Task.objects.filter(status="pending").last().pk}/"' in html


def test_a_column_at_exactly_the_cap_is_exact(world, monkeypatch):
    monkeypatch.setattr(sel, "BOARD_COUNT_CAP", 60)
    _tasks(world.space, "done", 60)
    done = next(col for col in sel.task_board(world.space) if col["status"] == "done")
    assert (done["count"], done["more"]) == (60, False)


def test_a_card_reads_neither_the_task_spec_nor_the_assignee_persona(world, django_assert_max_num_queries):
    Task.objects.create(space=world.space, title="t", creator_name="boss", status="running", spec="x" * 5000,
                        assignee=world.space.members.get(name="w1"))
    with django_assert_max_num_queries(2) as ctx:  # the counts, the one non-empty column
        board = sel.task_board(world.space)
    assert next(col for col in board if col["status"] == "running")["tasks"][0]["assignee"] == "w1"
    read = " ".join(q["sql"] for q in ctx.captured_queries)
    assert '"veronica_task"."spec"' not in read and '"veronica_member"."persona"' not in read


def test_the_board_counts_one_space_only(world):
    _tasks(world.other, "done", 4)
    _tasks(world.space, "done", 2)
    assert sel.capped_status_counts(world.space, 10)["done"] == 2


def test_the_space_page_reads_its_roster_once(world, django_assert_max_num_queries):
    client = world.client(world.viewer)
    client.get("/spaces/alpha/")  # warm what is cached per process
    with django_assert_max_num_queries(15) as ctx:  # 17 when the usage panel read the roster again (an empty board)
        assert client.get("/spaces/alpha/").status_code == 200
    rosters = [q["sql"] for q in ctx.captured_queries if 'FROM "veronica_usageday"' in q["sql"]]
    assert len(rosters) == 1, rosters


def test_the_member_page_reads_its_member_once_for_all_panels(world, django_assert_max_num_queries):
    client = world.client(world.viewer)
    client.get("/spaces/alpha/members/w1/")
    with django_assert_max_num_queries(20) as ctx:  # 32 when each panel read the member (and its space) again
        assert client.get("/spaces/alpha/members/w1/").status_code == 200
    lookups = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith('SELECT "veronica_member"."id"') and "'w1'" in q["sql"]]
    assert len(lookups) <= 2, lookups  # the page's 404 check and the panels' one read
