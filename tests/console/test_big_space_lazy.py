"""Big spaces stay fast (issue 25.4): the space page leaves its board and usage bars to its script, and the
spaces list counts open tasks only up to a cap.

The space page rendered up to 50 cards per board column on every load (the board read two statements
and made a third of the page's HTML); it now serves a placeholder that the page's script fills from
/panels/tasks/, an endpoint with the same access check as the page (the usage bars likewise). GET /api/spaces/ and the home page
counted every open task of each space (20,000 index entries in a space of 100,000 tasks); they count up
to OPEN_TASKS_CAP and say more with open_tasks_more / "1,000+". tests/console/test_browser_lazy_board.py
loads the board in Chromium."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from veronica.api import selectors as sel
from veronica.models import Task

pytestmark = pytest.mark.django_db


def _tasks(space, status: str, n: int) -> list[Task]:
    return Task.objects.bulk_create(Task(space=space, title=f"{status} card {i}", creator_name="boss", status=status)
                                    for i in range(n))


def test_the_space_page_reads_no_task_for_its_board_and_points_its_script_at_the_board(world):
    _tasks(world.space, "done", 3)
    client = world.client(world.viewer)
    client.get("/spaces/alpha/")  # warm what is cached per process
    with CaptureQueriesContext(connection) as queries:
        html = client.get("/spaces/alpha/").content.decode()
    board_reads = [q["sql"][:120] for q in queries.captured_queries if 'FROM "veronica_task"' in q["sql"] or "FROM veronica_task" in q["sql"]]
    assert board_reads == [], board_reads
    assert "done card" not in html and 'class="taskcard"' not in html
    assert 'data-panel="tasks" data-lazy data-src="/spaces/alpha/panels/tasks/"' in html
    board = client.get("/spaces/alpha/panels/tasks/").content.decode()
    assert board.count('class="taskcard"') == 3 and "done card 2" in board


def test_the_space_page_leaves_the_usage_bars_to_its_script(world):
    client = world.client(world.viewer)
    client.get("/spaces/alpha/")
    with CaptureQueriesContext(connection) as queries:
        html = client.get("/spaces/alpha/").content.decode()
    usage_reads = [q["sql"][:120] for q in queries.captured_queries if "veronica_taskcheck" in q["sql"] or "waggle_" in q["sql"]]
    assert usage_reads == [], usage_reads
    assert 'data-panel="usage" data-lazy data-src="/spaces/alpha/panels/usage/"' in html and 'svg class="bar"' not in html
    panel = client.get("/spaces/alpha/panels/usage/").content.decode()
    assert panel.count('svg class="bar"') == 3 and 'id="check-counts"' in panel  # boss, w1, w2


def test_the_space_pages_statements_do_not_grow_with_the_board(world):
    client = world.client(world.viewer)
    client.get("/spaces/alpha/")
    with CaptureQueriesContext(connection) as empty:
        client.get("/spaces/alpha/")
    for status in ("pending", "running", "blocked", "done", "failed"):
        _tasks(world.space, status, 4)
    with CaptureQueriesContext(connection) as full:
        client.get("/spaces/alpha/")
    assert len(full) == len(empty), [q["sql"][:80] for q in full.captured_queries]


@pytest.mark.parametrize("panel", ["tasks", "usage"])
@pytest.mark.parametrize("who", ["stranger", None])
def test_the_panels_the_script_loads_keep_the_pages_access_check(world, who, panel):
    _tasks(world.space, "pending", 2)
    response = world.client(getattr(world, who) if who else None).get(f"/spaces/alpha/panels/{panel}/")
    if who is None:  # anonymous: to the login page, as the space page itself
        assert response.status_code == 302 and "/login/" in response["Location"]
    else:  # a user with no role in the space: it does not exist for them
        assert response.status_code == 404
    assert "pending card" not in response.content.decode() and 'class="bar"' not in response.content.decode()
    assert world.client(world.viewer).get(f"/spaces/alpha/panels/{panel}/").status_code == 200


def test_the_spaces_list_counts_open_tasks_up_to_its_cap_and_says_more(world, monkeypatch):
    monkeypatch.setattr(sel, "OPEN_TASKS_CAP", 5)
    _tasks(world.space, "pending", 4)
    _tasks(world.space, "running", 3)
    _tasks(world.space, "done", 9)  # not open: never counted
    _tasks(world.other, "blocked", 5)  # exactly the cap: exact
    client = world.client(world.staff)
    rows = {row["slug"]: row for row in client.get("/api/spaces/").json()["spaces"]}
    assert (rows["alpha"]["open_tasks"], rows["alpha"]["open_tasks_more"]) == (5, True)
    assert (rows["beta"]["open_tasks"], rows["beta"]["open_tasks_more"]) == (5, False)
    home = client.get("/").content.decode()
    assert "<td>5+</td>" in home and "<td>5</td>" in home


def test_the_spaces_list_reads_at_most_the_cap_of_open_tasks_per_space(world):
    with CaptureQueriesContext(connection) as queries:
        sel.space_list(type(world.space).objects.all(), {})
    [listing] = [q["sql"] for q in queries.captured_queries if "veronica_task" in q["sql"]]
    assert f"LIMIT {sel.OPEN_TASKS_CAP + 1}" in listing, listing
