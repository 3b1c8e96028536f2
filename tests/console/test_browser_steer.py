"""The operator's cockpit in headless Chromium (issue 22): a member's reply in the chat, resume all,
a budget reopened, the prompt inspector. The run engine is called in-process (runner.wake, on a
thread of its own, as a worker would run it) where a test needs a run; no cluster is started."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.console.test_browser import browser, csp_violations, elsewhere, login, open_space  # noqa: F401  (fixtures)
from veronica.engine import budget, runner, supervisor
from veronica.models import Member

pytestmark = pytest.mark.browser
REPLY = "No task for me in this mail; nothing to do."  # the offline worker's answer to mail with no task in it


def test_a_members_reply_shows_in_its_chat_and_in_the_spaces_chat(login, live_world):
    page = login(live_world.operator)
    page.goto("/spaces/alpha/members/w1/")
    expect(page.locator("#stream-status")).to_have_text("live")
    page.fill("#chat-body", "anything for me today?")
    page.click("#member-chat-send")
    thread = page.locator("[data-panel=chat]")
    expect(thread).to_contain_text("anything for me today?")
    w1 = supervisor.get_member(live_world.space, "w1")
    assert elsewhere(runner.wake, w1.pk, "message") == "done"  # the run the message woke, as a worker runs it
    expect(thread.locator(".message.reply")).to_contain_text(REPLY)  # live: its message.sent event re-fetched the panel
    expect(thread.locator(".message.reply .meta")).to_contain_text("replying to #")
    open_space(page)
    expect(page.locator(".chat-log .message.reply")).to_contain_text(REPLY)


def test_resume_all_after_halt_all(login, live_world):
    page = login(live_world.operator)
    page.on("dialog", lambda dialog: dialog.accept())
    open_space(page)
    chips = page.locator("[data-member-chip]")
    page.click("text=Halt all")
    for name in ("boss", "w1", "w2"):
        expect(page.locator(f'[data-member-chip="{name}"]')).to_have_text("suspended")
    page.click("#resume-all")
    for name in ("boss", "w1", "w2"):
        expect(page.locator(f'[data-member-chip="{name}"]')).not_to_have_text("suspended")
    expect(page.locator("#timeline")).to_contain_text("member.resumed")
    assert chips.count() == 3
    assert not Member.objects.filter(space=live_world.space, run_status="suspended").exists()


def test_a_tripped_budget_is_reopened_by_a_reset_and_by_a_raise(login, live_world):
    for name in ("w1", "w2"):
        Member.objects.filter(space=live_world.space, name=name).update(budget_override=100)
        member = supervisor.get_member(live_world.space, name)
        budget.meter(member, input_tokens=500, output_tokens=0)
        assert budget.check_breaker(member)
    page = login(live_world.owner)
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto("/spaces/alpha/members/w1/")
    expect(page.locator("#stream-status")).to_have_text("live")
    expect(page.locator("[data-budget-tripped]")).to_be_visible()
    page.click("#budget-reset")
    expect(page.locator("[data-budget-open]")).to_be_visible()
    expect(page.locator("#timeline")).to_contain_text("budget.reopened")
    page.goto("/spaces/alpha/members/w2/")
    expect(page.locator("[data-budget-tripped]")).to_be_visible()
    page.fill("#budget-form input[name=budget_override]", "1000")
    page.click("#budget-form button[type=submit]")
    expect(page.locator("[data-budget-open]")).to_be_visible()
    expect(page.locator("[data-budget]")).to_contain_text(re.compile(r"Budget\s*1,000"))
    assert not budget.is_tripped(supervisor.get_member(live_world.space, "w2"))


def test_the_prompt_inspector_shows_an_edited_persona_and_the_windows_share(login, live_world):
    # the persona is edited as the admin's form saves it (a console editor is another helper's job)
    Member.objects.filter(space=live_world.space, name="w1").update(persona="You are W1. Answer in haiku only.")
    page = login(live_world.viewer)
    page.goto("/spaces/alpha/members/w1/")
    page.click("#prompt-link")
    expect(page.locator('[data-system-part="persona"]')).to_contain_text("Answer in haiku only.")
    expect(page.locator('#prompt-parts tr[data-part="persona"]')).to_contain_text("8")  # 33 chars: 8 tokens
    expect(page.locator("#prompt-share")).to_contain_text(re.compile(r"of [0-9,]+ tokens \([0-9.]+%\)"))


def test_raising_the_space_ceiling_on_the_usage_page_reopens_the_day(login, live_world):
    from veronica.models import Space

    Space.objects.filter(pk=live_world.space.pk).update(daily_token_ceiling=300)
    w1 = supervisor.get_member(live_world.space, "w1")
    budget.meter(w1, input_tokens=500, output_tokens=0)
    assert budget.check_breaker(w1)
    page = login(live_world.owner)
    page.goto("/spaces/alpha/usage/")
    page.click("details.budget-limits summary")
    page.fill("#space-budget-form input[name=daily_token_ceiling]", "5000")
    page.click("#space-budget-form button[type=submit]")
    expect(page.locator("#usage-totals")).to_contain_text("5,000 tokens")  # the page reloads with the new ceiling
    assert not budget.is_tripped(w1)
