"""Verify checks from the console: owners add, edit and remove a space's checks on the Manage page
(CSRF, server-side validation naming the field and the limit, nothing half-written, the same
verb as the API and the admin); the task page shows every verification's results to anyone who
can see the space; other roles and other spaces are refused."""
from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from tests.console.helpers import call
from veronica.swarm import ledger
from veronica.engine import check_queue, checks, supervisor
from veronica.models import Event, Space, Task

MANAGE = reverse("console:manage", args=["alpha"])


def post(client, data: dict, url: str = MANAGE):
    client.get(url)
    return client.post(url, {**data, "csrfmiddlewaretoken": client.cookies["csrftoken"].value})


def stored(world) -> list[dict]:
    return Space.objects.get(pk=world.space.pk).verify_checks


@pytest.fixture
def owner(world):
    return world.client(world.owner, csrf=True)


def test_an_owner_adds_edits_and_removes_checks_through_the_verb(world, owner):
    assert post(owner, {"action": "add_check", "name": "tests", "command": "make test", "timeout": "120"}).status_code == 302
    assert post(owner, {"action": "add_check", "name": "lint", "command": "make lint", "timeout": ""}).status_code == 302
    assert stored(world) == [{"name": "tests", "command": "make test", "timeout": 120},
                             {"name": "lint", "command": "make lint", "timeout": checks.TIMEOUT_DEFAULT}]
    response = post(owner, {"action": "edit_check", "check": "tests", "name": "unit", "command": "pytest -q", "timeout": "300"})
    assert response.status_code == 302
    assert [c["name"] for c in stored(world)] == ["unit", "lint"], "renamed in place, order kept"
    assert stored(world)[0] == {"name": "unit", "command": "pytest -q", "timeout": 300}
    assert post(owner, {"action": "remove_check", "check": "lint"}).status_code == 302
    assert [c["name"] for c in stored(world)] == ["unit"]
    configured = Event.objects.filter(space=world.space, kind="space.checks_configured").order_by("seq")
    assert [e.payload["checks"] for e in configured] == [["tests"], ["tests", "lint"], ["unit", "lint"], ["unit"]]
    assert {e.payload["actor"] for e in configured} == {"user:owner"}
    page = owner.get(MANAGE).content.decode()
    assert 'id="checks"' in page and 'data-check="unit"' in page and "pytest -q" in page


@pytest.mark.parametrize("data,status,needle", [
    ({"name": "t", "command": "true", "timeout": "0"}, 400, "timeout: timeout must be an integer from 1 to 1800 (seconds)"),
    ({"name": "t", "command": "true", "timeout": "soon"}, 400, "timeout: timeout must be an integer from 1 to 1800 (seconds)"),
    ({"name": "t", "command": "true", "timeout": "99999"}, 400, "from 1 to 1800"),
    ({"name": "a b", "command": "true"}, 400, "name: name must be 1-60 letters, digits"),
    ({"name": "t", "command": "   "}, 400, "command: command must be a non-empty string of at most 2000 characters"),
    ({"name": "t", "command": "x" * 2001}, 400, "at most 2000 characters"),
    ({"name": "keep", "command": "true"}, 409, "name: a check named &#x27;keep&#x27; already exists"),
    ({"name": "big", "command": "true", "timeout": "900"}, 400, "the timeouts add up to 905 s"),
])
def test_bad_input_is_a_form_error_naming_the_field_and_limit_and_nothing_changes(world, owner, data, status, needle):
    checks.configure(world.space, [{"name": "keep", "command": "true", "timeout": 5}], actor="test")
    before = stored(world)
    events = Event.objects.filter(space=world.space).count()
    response = post(owner, {"action": "add_check", **data})
    assert response.status_code == status
    assert needle in response.content.decode()
    assert stored(world) == before and Event.objects.filter(space=world.space).count() == events, "nothing half-written"


def test_editing_or_removing_an_unknown_check_is_a_404_form_error(world, owner):
    response = post(owner, {"action": "remove_check", "check": "ghost"})
    assert response.status_code == 404 and "check: this space has no check named &#x27;ghost&#x27;" in response.content.decode()
    response = post(owner, {"action": "edit_check", "check": "ghost", "name": "x", "command": "true"})
    assert response.status_code == 404


def test_the_limit_on_the_number_of_checks_is_named(world, owner):
    checks.configure(world.space, [{"name": f"c{i}", "command": "true", "timeout": 1} for i in range(checks.MAX_CHECKS)], actor="t")
    response = post(owner, {"action": "add_check", "name": "one-more", "command": "true", "timeout": "1"})
    assert response.status_code == 400 and f"has {checks.MAX_CHECKS + 1} checks; the limit is {checks.MAX_CHECKS}" in response.content.decode()
    assert len(stored(world)) == checks.MAX_CHECKS


def test_the_form_needs_csrf_and_the_owner_role(world):
    data = {"action": "add_check", "name": "t", "command": "true", "timeout": "5"}
    assert world.client(world.owner, csrf=True).post(MANAGE, data).status_code == 403, "no CSRF token"
    assert post(world.client(world.operator, csrf=True), data).status_code == 403
    assert post(world.client(world.viewer, csrf=True), data).status_code == 403
    assert post(world.client(world.stranger, csrf=True), data).status_code == 404, "another space's user does not see it"
    other_manage = reverse("console:manage", args=[world.other.slug])
    assert post(world.client(world.owner, csrf=True), data, other_manage).status_code == 404
    assert stored(world) == [] and Space.objects.get(pk=world.other.pk).verify_checks == []


def test_the_api_and_the_admin_use_the_same_verb(world):
    api = call(world.client(world.owner), "PUT", "/api/spaces/alpha/checks/",
               {"checks": [{"name": "t", "command": "true", "timeout": 0}]})
    assert api.status_code == 400 and api.json() == {"error": "verify_checks[0].timeout must be an integer from 1 to 1800 (seconds)",
                                                      "field": "verify_checks"}
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    client = world.client(root)
    change = reverse("admin:veronica_space_change", args=[world.space.pk])
    form = client.get(change).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k not in ("event_seq", "created_at")}
    data.update({"verify_checks": json.dumps([{"name": "adm", "command": "true", "timeout": 3}]), "members-TOTAL_FORMS": "0",
                 "members-INITIAL_FORMS": "0", "access-TOTAL_FORMS": "0", "access-INITIAL_FORMS": "0"})
    data = {k: ("on" if v is True else v) for k, v in data.items() if v is not False}
    assert client.post(change, data).status_code == 302
    assert stored(world) == [{"name": "adm", "command": "true", "timeout": 3}]
    assert Event.objects.filter(space=world.space, kind="space.checks_configured").get().payload["actor"] == "admin:root"


def _verified_task(world) -> Task:
    checks.configure(world.space, [{"name": "ok", "command": "true", "timeout": 5},
                                   {"name": "has-file", "command": "echo '<b>missing</b>' && test -f nope.txt", "timeout": 5}],
                     actor="test")
    task = ledger.create_task(world.space, "boss", "ship it", assignee=supervisor.get_member(world.space, "w1"), verify_policy="checks")
    if task.status != "running":
        ledger.transition(task, "running", actor="boss")
    ledger.complete(task, actor="w1", result="shipped")
    checks.run_checks(task.pk)
    return Task.objects.get(pk=task.pk)


def test_the_task_page_shows_each_attempt_and_its_checks_to_viewers(world, monkeypatch, django_assert_max_num_queries):
    monkeypatch.setattr(check_queue, "enqueue", lambda task_id: None)
    task = _verified_task(world)
    assert task.status == "running"
    ledger.complete(task, actor="w1", result="again")
    checks.run_checks(task.pk)
    url = reverse("console:task", args=["alpha", task.pk])
    viewer = world.client(world.viewer)
    with django_assert_max_num_queries(6):  # session, user, space, access, task, all its check rows: not one per check
        page = viewer.get(url)
    html = page.content.decode()
    assert page.status_code == 200
    assert html.index('data-attempt="2"') < html.index('data-attempt="1"'), "newest attempt first"
    assert html.count('data-check="has-file" data-verdict="failed"') == 2 and html.count('data-check="ok" data-verdict="passed"') == 2
    assert "&lt;b&gt;missing&lt;/b&gt;" in html and "<b>missing</b>" not in html, "check output is escaped"
    assert "Add, edit or remove checks" not in html, "viewers do not get the manage link"
    assert "Add, edit or remove checks" in world.client(world.owner).get(url).content.decode()
    board = viewer.get(reverse("console:space-panel", args=["alpha", "tasks"])).content.decode()
    assert f'href="{url}"' in board


def test_the_task_page_is_404_for_strangers_and_for_another_spaces_task(world):
    task = ledger.create_task(world.space, "boss", "secret")
    assert world.client(world.stranger).get(reverse("console:task", args=["alpha", task.pk])).status_code == 404
    assert world.client(world.owner).get(reverse("console:task", args=[world.other.slug, task.pk])).status_code in (404,)
    assert world.client(world.owner).get(reverse("console:task", args=["alpha", 999999])).status_code == 404
    assert world.client(None).get(reverse("console:task", args=["alpha", task.pk])).status_code == 302, "login first"


def test_the_api_task_detail_carries_the_check_results_with_the_same_access(world, monkeypatch):
    monkeypatch.setattr(check_queue, "enqueue", lambda task_id: None)
    task = _verified_task(world)
    url = f"/api/spaces/alpha/tasks/{task.pk}/"
    body = world.client(world.viewer).get(url).json()
    assert body["id"] == task.pk and body["status"] == "running"
    (attempt,) = body["check_results"]
    assert attempt["attempt"] == 1 and attempt["passed"] is False
    assert [(c["name"], c["verdict"]) for c in attempt["checks"]] == [("ok", "passed"), ("has-file", "failed")]
    assert world.client(world.stranger).get(url).status_code == 404
    assert world.client(world.owner).get(f"/api/spaces/{world.other.slug}/tasks/{task.pk}/").status_code == 404
    missing = world.client(world.owner).get("/api/spaces/alpha/tasks/999999/")
    assert missing.status_code == 404 and missing.json()["field"] == "task_id"
