"""The run trace, usage and create/export pages in headless Chromium against a real daphne (the
login fixture fails a test whose pages broke the Content-Security-Policy)."""
from __future__ import annotations

import re
import shutil

import pytest
from playwright.sync_api import expect

from tests.console.test_browser import browser, csp_violations, elsewhere, login, open_space  # noqa: F401 - fixtures
from tests.console.trace_helpers import drive_mcp_run, drive_run, lease_lost_run
from veronica.portable import archive as portable
from veronica.models import Space, SpaceAccess

pytestmark = pytest.mark.browser


def test_a_run_appears_live_on_the_member_page_and_its_trace_shows_the_waterfall(login, live_world, monkeypatch):  # noqa: F811
    page = login(live_world.viewer)
    page.goto(f"/spaces/{live_world.space.slug}/members/w1/")
    expect(page.locator("#stream-status")).to_have_text("live")
    expect(page.locator("[data-panel='runs']")).to_contain_text("No runs yet.")
    run = elsewhere(drive_run, monkeypatch, live_world.space)
    link = page.locator(f"[data-panel='runs'] a[href='/spaces/alpha/runs/{run.pk}/']")
    expect(link).to_be_visible()  # the runs panel refreshed on run.ended, no reload
    expect(page.locator(f"[data-panel='transcript'] a.run-link[href='/spaces/alpha/runs/{run.pk}/']").first).to_be_visible()
    expect(page.locator("#timeline a.run-link").first).to_have_attribute("href", f"/spaces/alpha/runs/{run.pk}/")
    link.click()
    expect(page).to_have_url(re.compile(rf"/runs/{run.pk}/$"))
    rows = page.locator("#waterfall tbody tr")
    expect(rows).to_have_count(5)
    expect(rows.nth(0)).to_contain_text("HTTP 529 overloaded")
    expect(rows.nth(0).locator(".tag.warn")).to_have_text("1")
    expect(rows.nth(1)).to_contain_text("read_file")
    expect(page.locator("#waterfall tr.has-error")).to_have_count(2)
    expect(page.locator("#waterfall svg.span-bar rect.fill")).to_have_count(5)
    expect(page.locator("#run-facts")).to_contain_text("300 in · 30 out")
    rows.nth(4).locator("summary").click()
    expect(rows.nth(4).locator("pre")).to_have_text("All done: the folder is empty.")


def test_the_usage_page_draws_days_and_budget_lines(login, live_world, monkeypatch):  # noqa: F811
    elsewhere(drive_run, monkeypatch, live_world.space)
    Space.objects.filter(pk=live_world.space.pk).update(member_daily_tokens=1000)
    page = login(live_world.viewer)
    open_space(page)
    page.click("a.button:has-text('Usage')")
    expect(page).to_have_url(re.compile(r"/spaces/alpha/usage/$"))
    w1 = page.locator("#usage-members tr[data-member='w1']")
    expect(w1).to_contain_text("330")
    expect(w1.locator("svg.days rect.day")).to_have_count(30)
    expect(w1.locator("svg.days line.budget")).to_have_count(1)
    expect(page.locator("#usage-days tbody tr")).to_have_count(30)


@pytest.fixture
def created_homes():
    """The daphne writes new spaces under the shared test data dir: leave none behind."""
    slugs = ["browser-demo", "browser-copy"]
    for slug in slugs:
        shutil.rmtree(portable.home_of(slug), ignore_errors=True)
    yield slugs
    for slug in slugs:
        shutil.rmtree(portable.home_of(slug), ignore_errors=True)


def test_staff_create_from_a_template_export_and_reimport_through_the_pages(login, live_world, tmp_path, created_homes):  # noqa: F811
    page = login(live_world.staff)
    page.click("#new-space")
    form = page.locator("#from-template")
    form.locator("select[name=template]").select_option("demo-team")
    form.locator("input[name=slug]").fill("browser-demo")
    form.locator("button[type=submit]").click()
    expect(page).to_have_url(re.compile(r"/spaces/browser-demo/$"))
    expect(page.locator("[data-member-chip='lead']")).to_be_visible()
    page.goto("/spaces/browser-demo/manage/")
    with page.expect_download() as info:
        page.click("#export-space")
    archive = tmp_path / "export.tar.gz"
    info.value.save_as(archive)
    page.goto("/new-space/")
    upload = page.locator("#from-archive")
    upload.locator("input[type=file]").set_input_files(str(archive))
    upload.locator("input[name=slug]").fill("browser-copy")
    upload.locator("button[type=submit]").click()
    expect(page).to_have_url(re.compile(r"/spaces/browser-copy/$"))
    expect(page.locator("[data-member-chip='scout']")).to_be_visible()
    copy = Space.objects.get(slug="browser-copy")
    assert SpaceAccess.objects.get(space=copy, user=live_world.staff).role == "owner"
    page.goto("/spaces/browser-copy/manage/")
    with page.expect_download() as again:
        page.click("#export-space")
    second = tmp_path / "again.tar.gz"
    again.value.save_as(second)
    assert second.read_bytes() == archive.read_bytes()  # export -> import -> export: the same bytes


def test_a_broken_archive_is_refused_on_the_page_and_creates_nothing(login, live_world, tmp_path, created_homes):  # noqa: F811
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("members/lead")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc"
        tar.addfile(info)
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(raw.getvalue())
    page = login(live_world.staff)
    page.goto("/new-space/")
    upload = page.locator("#from-archive")
    upload.locator("input[type=file]").set_input_files(str(bad))
    upload.locator("input[name=slug]").fill("browser-copy")
    upload.locator("button[type=submit]").click()
    expect(page.locator("ul.flash li.error")).to_contain_text("archive entry 'members/lead': only plain files and folders are allowed")
    expect(page).to_have_url(re.compile(r"/new-space/$"))
    assert not Space.objects.filter(slug="browser-copy").exists()
    assert not portable.home_of("browser-copy").exists()


def test_the_trace_marks_mcp_calls_and_a_run_the_watchdog_ended(login, live_world, monkeypatch):  # noqa: F811
    lost, _ = elsewhere(lease_lost_run, live_world.space)
    run = elsewhere(drive_mcp_run, monkeypatch, live_world.space)
    page = login(live_world.viewer)
    page.goto(f"/spaces/alpha/runs/{run.pk}/")
    tool = page.locator("#waterfall tbody tr[data-kind='tool']")
    expect(tool).to_have_count(1)
    expect(tool.locator(".tag.mcp")).to_have_text("MCP calc")
    expect(tool).to_contain_text("mcp__calc__add")
    expect(page.locator("#run-facts")).to_contain_text("1 (1 MCP)")
    page.goto(f"/spaces/alpha/runs/{lost.pk}/")
    expect(page.locator("#run-outcome")).to_have_text("lease_expired")
    expect(page.locator("#run-error")).to_contain_text("its lease expired")
    expect(page.locator("#waterfall tbody tr")).to_have_count(1)
    expect(page.locator("#waterfall tbody tr .tag.warn")).to_have_text("cut off (lease lost)")
