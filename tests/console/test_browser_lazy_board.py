"""The space page leaves its board (and its usage bars) to its script (issue 25.4: a big space's cards made the page wait), in
headless Chromium against a real daphne: the board loads after the page, follows task events like any
panel, and says so when it could not be loaded instead of waiting forever."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.console.test_browser import browser, csp_violations, elsewhere, login  # noqa: F401 - fixtures
from veronica.swarm import ledger

pytestmark = pytest.mark.browser


def test_the_board_loads_after_the_space_page_and_follows_task_events(login, live_world):  # noqa: F811
    first = elsewhere(ledger.create_task, live_world.space, "boss", "the first card")
    page = login(live_world.viewer)
    response = page.goto("/spaces/alpha/")
    assert "the first card" not in response.text()  # not in the page's own HTML: the script fetched it
    expect(page.locator(f'.taskcard[data-task="{first.pk}"]')).to_contain_text("the first card")
    expect(page.locator("[data-panel=usage] svg.bar")).to_have_count(3)  # boss, w1, w2: the usage bars load likewise
    expect(page.locator(".lazy-wait")).to_have_count(0)
    expect(page.locator("#stream-status")).to_have_text("live")
    second = elsewhere(ledger.create_task, live_world.space, "boss", "the second card")
    expect(page.locator(f'.taskcard[data-task="{second.pk}"]')).to_contain_text("the second card")


def test_a_board_that_cannot_be_loaded_says_so(login, live_world):  # noqa: F811
    elsewhere(ledger.create_task, live_world.space, "boss", "never shown")
    page = login(live_world.viewer)
    page.route("**/panels/tasks/", lambda route: route.fulfill(status=500, body="down"))
    page.goto("/spaces/alpha/")
    expect(page.locator("[data-panel=tasks] .lazy-wait")).to_contain_text("Could not load this panel")
    expect(page.locator(".taskcard")).to_have_count(0)
