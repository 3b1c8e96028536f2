"""The console in headless Chromium against a real daphne: live chat, phase chips, approvals, roles.

Fixtures: `live_web` (daphne on the test DB, module scope) and `browser` (one Chromium per module);
`login(user)` opens a logged-in page; a test that needs the run engine also takes `live_workers`
(a django-q2 cluster on the same database and queue as the daphne).
"""
from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections
from django.utils import timezone
from playwright.sync_api import Page, expect, sync_playwright

from tests.console.conftest import PASSWORD
from tests.console.helpers import pending_approval
from veronica.swarm import access, bus, events
from veronica.engine import supervisor
from veronica.models import Approval, Member

pytestmark = pytest.mark.browser
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def browser():
    # Playwright's sync API keeps an event loop alive in this thread, which Django's async-safety
    # check mistakes for async code; the ORM calls in these tests are plain sync code.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as pw:
            chromium = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


# Every page reports what its Content-Security-Policy blocked; the console must block nothing.
CSP_WATCH = """document.addEventListener("securitypolicyviolation", function (e) {
  window.reportCspViolation(location.pathname + ": " + e.violatedDirective + " blocked " + (e.blockedURI || "inline"));
});"""


@pytest.fixture
def csp_violations() -> list[str]:
    return []


@pytest.fixture
def login(browser, live_web, live_world, csp_violations):
    contexts = []

    def open_as(user) -> Page:
        user.set_password(PASSWORD)
        user.save()
        context = browser.new_context(base_url=live_web.url)
        context.expose_function("reportCspViolation", lambda text: csp_violations.append(text))
        context.add_init_script(CSP_WATCH)
        contexts.append(context)
        page = context.new_page()
        page.on("console", lambda msg: csp_violations.append(msg.text) if "Content Security Policy" in msg.text else None)
        page.set_default_timeout(8000)
        page.goto("/login/")
        page.fill("input[name=username]", user.username)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        expect(page).to_have_url(re.compile(r"/$"))
        return page

    yield open_as
    for context in contexts:
        context.close()
    assert csp_violations == [], "the console broke its own Content-Security-Policy"


def elsewhere(fn, *args, **kwargs):
    """Run a verb off Playwright's loop thread, so its on-commit ring works as in any process."""
    def call():
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def open_space(page: Page, slug: str = "alpha") -> None:
    page.goto(f"/spaces/{slug}/")
    expect(page.locator("#stream-status")).to_have_text("live")


def test_chat_reaches_the_timeline_live_and_phase_chips_follow_events(login, live_world):
    page = login(live_world.operator)
    open_space(page)
    page.select_option("#chat-to", "boss")
    page.fill("#chat-body", "hello boss from the browser")
    page.click("#chat-send")
    expect(page.locator("#timeline")).to_contain_text("operator → boss: hello boss from the browser")
    expect(page.locator(".chat-log")).to_contain_text("hello boss from the browser")

    # state changes made by another process arrive through the stream: no reload
    chip = page.locator('[data-member-chip="w1"]')
    expect(chip).to_have_text("ready")
    w1 = supervisor.get_member(live_world.space, "w1")
    Member.objects.filter(pk=w1.pk).update(phase="executing", phase_tool="grep", phase_since=timezone.now())
    elsewhere(events.emit, live_world.space.pk, "member.phase", member=w1, phase="executing", tool="grep")
    expect(chip).to_have_text("executing:grep")
    expect(page.locator('tr[data-member="w1"] .age')).to_have_text(re.compile(r"^\d+s$"))
    elsewhere(supervisor.suspend, w1, actor="test")
    expect(chip).to_have_text("suspended")


def test_event_text_is_never_markup_in_the_browser(login, live_world):
    page = login(live_world.operator)
    open_space(page)
    evil = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script> **bold**'
    elsewhere(bus.send, live_world.space, "boss", "operator", evil)
    expect(page.locator("#timeline")).to_contain_text('<img src=x onerror="window.__xss=1">')
    expect(page.locator(".chat-log .md strong")).to_have_text("bold")
    assert page.evaluate("window.__xss") is None


def test_an_approval_leaves_the_queue_when_approved_or_denied(login, live_world):
    keep = pending_approval(live_world.space, "w1", "write_file", path="notes.md")
    refuse = pending_approval(live_world.space, "w2", "run_command", cmd="rm -rf build")
    page = login(live_world.operator)
    open_space(page)
    item = page.locator(f'[data-approval="{keep.pk}"]')
    expect(item).to_contain_text("write_file")
    item.get_by_role("button", name="Approve").click()
    expect(item).to_have_count(0)
    other = page.locator(f'[data-approval="{refuse.pk}"]')
    other.locator("input[name=reason]").fill("never delete the build")
    other.get_by_role("button", name="Deny").click()
    expect(other).to_have_count(0)
    expect(page.locator("#no-approvals")).to_be_visible()
    assert Approval.objects.get(pk=keep.pk).status == "approved"
    denied = Approval.objects.get(pk=refuse.pk)
    assert denied.status == "denied" and denied.reason == "never delete the build"


def test_a_viewer_gets_no_controls_and_the_server_refuses_them(login, live_world):
    page = login(live_world.viewer)
    page.goto("/spaces/alpha/members/w1/")
    expect(page.locator("#stream-status")).to_have_text("live")
    expect(page.locator("#controls-readonly")).to_be_visible()
    expect(page.locator("#controls")).to_have_count(0)
    page.goto("/spaces/alpha/")
    expect(page.locator("#chat")).to_have_count(0)
    token = page.evaluate("document.querySelector('meta[name=csrf-token]').content")
    response = page.request.post("/api/spaces/alpha/members/w1/suspend/", headers={"X-CSRFToken": token}, data={})
    assert response.status == 403
    assert supervisor.get_member(live_world.space, "w1").run_status == "idle"


@pytest.mark.cluster
def test_a_goal_to_the_leader_moves_tasks_live_with_the_real_engine(login, live_world, live_workers):
    page = login(live_world.operator)
    open_space(page)
    page.select_option("#chat-to", "boss")
    page.fill("#chat-body", "Goal: survey the workspace and report back.")
    page.click("#chat-send")
    # the offline team plans, delegates and finishes; every step reaches the page through the stream
    expect(page.locator('.column[data-status="done"] .taskcard').first).to_be_visible(timeout=30000)
    expect(page.locator("#timeline")).to_contain_text("executing:", timeout=30000)  # phases went by live
    expect(page.locator("#timeline")).to_contain_text("run.ended", timeout=30000)
    expect(page.locator(".chat-log .message.to-me").first).to_be_visible(timeout=30000)
    expect(page.locator('[data-member-chip="boss"]')).to_have_text("ready", timeout=30000)


def test_the_console_runs_under_its_csp_and_the_watch_would_see_a_violation(login, live_world, csp_violations):
    page = login(live_world.owner)
    response = page.goto("/spaces/alpha/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    expect(page.locator("#stream-status")).to_have_text("live")  # the socket passed connect-src 'self'
    expect(page.locator("[data-panel=usage] svg.bar rect.fill").first).to_be_attached()
    with page.expect_response(lambda r: "/panels/usage/" in r.url):  # a live refresh re-parses the panel's HTML
        elsewhere(events.emit, live_world.space.pk, "usage.recorded", tokens=1)
    expect(page.locator("[data-panel=usage] svg.bar rect.fill").first).to_be_attached()
    for url in ("/spaces/alpha/members/w1/", "/spaces/alpha/rules/", "/spaces/alpha/manage/", "/tokens/"):
        page.goto(url)
        expect(page.locator("main")).to_be_visible()
    page.goto("/spaces/alpha/members/w1/")
    expect(page.locator("#stream-status")).to_have_text("live")
    assert csp_violations == []
    # the control: an inline script is blocked and reported, so the empty list above means something
    page.evaluate("() => { const s = document.createElement('script'); s.textContent = 'window.__ran = 1'; document.body.append(s); }")
    assert page.evaluate("window.__ran") is None
    for _ in range(50):
        if csp_violations:
            break
        page.wait_for_timeout(100)
    assert any("script-src" in v for v in csp_violations), csp_violations
    csp_violations.clear()  # seen; the fixture's own check is for everything else


def test_revoked_access_ends_the_live_view_instead_of_reconnecting(login, live_world):
    page = login(live_world.viewer)
    open_space(page)
    elsewhere(access.revoke, live_world.space, "viewer", actor="test")
    # the server re-checks within VERONICA_SOCKET_RECHECK_SECONDS (+ a poll) and closes with 4404
    expect(page.locator("#stream-status")).to_have_text("no access to this space any more", timeout=20000)
    expect(page.locator("#stream-status")).to_have_attribute("data-state", "closed")
