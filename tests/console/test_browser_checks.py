"""Verify checks in headless Chromium against a real daphne: an owner adds, edits and removes a
space's checks on the Manage page, sees a refusal the server makes, and reads a task's check
results on the task page it reaches from the board; a viewer gets no form."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.console.test_browser import browser, csp_violations, elsewhere, login  # noqa: F401 - fixtures
from veronica.swarm import ledger
from veronica.engine import checks, supervisor
from veronica.models import Space

pytestmark = pytest.mark.browser


def test_an_owner_manages_checks_and_reads_the_results_on_the_task_page(login, live_world):  # noqa: F811
    page = login(live_world.owner)
    page.goto("/spaces/alpha/manage/")
    add = page.locator("#add-check")
    add.locator("input[name=name]").fill("has-ok")
    add.locator("input[name=command]").fill("echo looking && test -f ok.txt")
    add.locator("input[name=timeout]").fill("5")
    add.locator("button[type=submit]").click()
    expect(page.locator(".flash")).to_contain_text("added check has-ok")
    expect(page.locator('#check-list tr[data-check="has-ok"]')).to_have_count(1)

    # the browser accepts this form; the server refuses it (the timeouts must fit one worker task)
    add = page.locator("#add-check")
    add.locator("input[name=name]").fill("slow")
    add.locator("input[name=command]").fill("sleep 1")
    add.locator("input[name=timeout]").fill("1800")
    add.locator("button[type=submit]").click()
    expect(page.locator(".flash")).to_contain_text("the timeouts add up to 1805 s")
    expect(page.locator('#check-list tr[data-check="slow"]')).to_have_count(0)

    row = page.locator('#check-list tr[data-check="has-ok"]')
    row.locator("input[name=timeout]").fill("7")
    row.locator("form.edit-check button[type=submit]").click()
    expect(page.locator(".flash")).to_contain_text("saved check has-ok")
    assert Space.objects.get(pk=live_world.space.pk).verify_checks == [
        {"name": "has-ok", "command": "echo looking && test -f ok.txt", "timeout": 7}]

    space = Space.objects.get(pk=live_world.space.pk)
    task = elsewhere(ledger.create_task, space, "boss", "write ok.txt", assignee=supervisor.get_member(space, "w1"),
                     verify_policy="checks")
    elsewhere(ledger.complete, task, actor="w1", result="written")
    elsewhere(checks.run_checks, task.pk)
    page.goto("/spaces/alpha/")
    page.locator(f'.taskcard[data-task="{task.pk}"] a').click()
    expect(page.locator("h1")).to_contain_text("write ok.txt")
    result = page.locator('#check-results tr[data-check="has-ok"]')
    expect(result).to_have_attribute("data-verdict", "failed")
    expect(page.locator("#check-results")).to_contain_text("looking")
    expect(page.locator("#check-results")).to_contain_text("Add, edit or remove checks")

    page.goto("/spaces/alpha/manage/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator('#check-list tr[data-check="has-ok"] button.danger').click()
    expect(page.locator(".flash")).to_contain_text("removed check has-ok")
    expect(page.locator("#check-list")).to_contain_text("No checks")
    assert Space.objects.get(pk=live_world.space.pk).verify_checks == []


def test_a_viewer_reads_the_task_page_but_gets_no_check_form(login, live_world):  # noqa: F811
    task = elsewhere(ledger.create_task, live_world.space, "boss", "plain task")
    page = login(live_world.viewer)
    page.goto(f"/spaces/alpha/tasks/{task.pk}/")
    expect(page.locator("#check-results")).to_contain_text('verified by "auto", not by checks')
    expect(page.locator("#check-results")).not_to_contain_text("Add, edit or remove checks")
    response = page.goto("/spaces/alpha/manage/")
    assert response.status == 403 and page.locator("#add-check").count() == 0
