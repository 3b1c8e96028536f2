"""The cockpit in headless Chromium: a task created from the board runs to done on the real engine;
a member is created and its persona edited from the console; a viewer gets no controls and a 403."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.console.test_browser import browser, csp_violations, login, open_space  # noqa: F401 (fixtures)
from veronica.engine import supervisor
from veronica.models import Event, Task

pytestmark = pytest.mark.browser


@pytest.mark.cluster
def test_a_task_created_from_the_board_runs_to_done(login, live_world, live_workers):
    page = login(live_world.operator)
    open_space(page)
    page.locator("#new-task summary").click()
    page.fill("#task-title", "survey the workspace")
    page.fill("#task-spec", "List what is in the workspace and report.")
    page.select_option("#task-assignee", "w1")
    page.click("#task-create")
    expect(page).to_have_url(re.compile(r"/spaces/alpha/tasks/\d+/$"))
    task = Task.objects.get(title="survey the workspace")
    assert task.creator_name == "user:operator" and task.assignee.name == "w1"
    open_space(page)
    card = page.locator(f'.column[data-status="done"] [data-task="{task.pk}"]')
    expect(card).to_be_visible(timeout=30000)  # the board follows the run live
    task.refresh_from_db()
    assert task.status == "done" and task.result
    assert Event.objects.filter(space=live_world.space, kind="task.status", payload__to="running",
                                payload__actor="user:operator").exists()


def test_an_owner_creates_a_member_and_edits_its_persona(login, live_world):
    page = login(live_world.owner)
    open_space(page)
    page.click("#new-member")
    page.fill("#member-name", "indexer")
    page.fill("#member-persona", "You index repositories.")
    page.fill("#member-tools", "read_file, send_message")
    page.click("#member-save")
    expect(page).to_have_url(re.compile(r"/spaces/alpha/members/indexer/$"))
    member = supervisor.get_member(live_world.space, "indexer")
    assert member.persona == "You index repositories." and member.tools == ["read_file", "send_message"]

    page.click("#edit-member")
    expect(page.locator("#member-persona")).to_have_value("You index repositories.")
    page.fill("#member-persona", "You index repositories, **carefully**.")
    page.click("#member-save")
    expect(page).to_have_url(re.compile(r"/spaces/alpha/members/indexer/$"))
    expect(page.locator(".flash")).to_contain_text("saved indexer")
    page.locator("summary", has_text="Persona").click()
    expect(page.locator("[data-panel=header] .md strong")).to_have_text("carefully")
    member.refresh_from_db()
    assert member.persona == "You index repositories, **carefully**." and member.runtime_fields == ["persona"]
    page.click("#prompt-link")  # the next model call's system prompt carries the edit, and only the offered tools
    expect(page.locator('[data-system-part="persona"]')).to_contain_text("You index repositories, **carefully**.")
    expect(page.locator("#prompt-share")).to_contain_text(re.compile(r"of [0-9,]+ tokens \([0-9.]+%\)"))
    page.go_back()

    page.click("#edit-member")  # a refused edit names the field and keeps what was typed
    page.fill("#member-tools", "teleport")
    page.click("#member-save")
    expect(page.locator(".flash")).to_contain_text("tools: unknown tool 'teleport'")
    expect(page.locator("#member-tools")).to_have_value("teleport")
    member.refresh_from_db()
    assert member.tools == ["read_file", "send_message"]


def test_a_viewer_sees_no_cockpit_controls_and_the_server_refuses_them(login, live_world):
    page = login(live_world.viewer)
    open_space(page)
    expect(page.locator("#new-task")).to_have_count(0)
    expect(page.locator("#new-member")).to_have_count(0)
    page.goto("/spaces/alpha/members/w1/")
    expect(page.locator("#edit-member")).to_have_count(0)
    token = page.evaluate("document.querySelector('meta[name=csrf-token]').content")
    api = page.request.post("/api/spaces/alpha/tasks/", headers={"X-CSRFToken": token}, data={"title": "sneaky"})
    form = page.request.post("/spaces/alpha/tasks/new/", headers={"X-CSRFToken": token}, form={"title": "sneaky"})
    edit = page.request.fetch("/api/spaces/alpha/members/w1/", method="PATCH", headers={"X-CSRFToken": token},
                              data={"persona": "x"})
    assert (api.status, form.status, edit.status) == (403, 403, 403)
    assert not Task.objects.filter(title="sneaky").exists()
