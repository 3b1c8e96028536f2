"""Streamed text shows in the console as it is generated (timeline and member transcript), and the
retry state is visible; headless Chromium against a real daphne."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.console.test_browser import browser, csp_violations, elsewhere, login, open_space  # noqa: F401 - fixtures
from veronica.swarm import events
from veronica.agent import transcript
from veronica.engine import supervisor

pytestmark = pytest.mark.browser


def test_live_text_previews_in_the_timeline_and_yields_to_the_final_turn(login, live_world):  # noqa: F811
    page = login(live_world.operator)
    open_space(page)
    w1 = supervisor.get_member(live_world.space, "w1")
    elsewhere(events.emit, live_world.space.pk, "agent.delta", member=w1, offset=0, text="Hello <b>there</b>, ")
    elsewhere(events.emit, live_world.space.pk, "agent.delta", member=w1, offset=20, text="general")
    live = page.locator('#timeline li[data-live="w1"]')
    expect(live).to_contain_text("Hello <b>there</b>, general")  # appended, and text only
    assert page.locator("#timeline li.kind-agent-delta").count() == 1  # one preview, not an entry per delta
    elsewhere(events.emit, live_world.space.pk, "agent.retry", member=w1, delay=8.0, reason="HTTP 529 overloaded",
              text="retrying in 8 s: HTTP 529 overloaded")
    expect(page.locator("#timeline")).to_contain_text("retrying in 8 s: HTTP 529 overloaded")
    expect(live).to_have_count(0)  # the next attempt streams from the start
    elsewhere(events.emit, live_world.space.pk, "agent.delta", member=w1, offset=0, text="Second try")
    expect(live).to_contain_text("Second try")
    elsewhere(events.emit, live_world.space.pk, "agent.text", member=w1, text="Second try, complete.")
    expect(live).to_have_count(0)
    expect(page.locator("#timeline")).to_contain_text("Second try, complete.")


def test_live_text_appears_in_the_member_transcript(login, live_world):  # noqa: F811
    w1 = supervisor.get_member(live_world.space, "w1")
    elsewhere(transcript.open_session, w1)
    page = login(live_world.operator)
    page.goto(f"/spaces/{live_world.space.slug}/members/w1/")
    expect(page.locator("#stream-status")).to_have_text("live")
    elsewhere(events.emit, live_world.space.pk, "agent.delta", member=w1, offset=0, text="Thinking out loud")
    expect(page.locator("ol.transcript li.turn.live")).to_contain_text("Thinking out loud")
