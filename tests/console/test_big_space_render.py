"""Big spaces stay fast (issue 25.4): what a page's rendering costs per row, kept bounded.

The chat panel renders 30 messages as markdown on every refresh: one Markdown converter per thread,
reset between texts, not one built per text (building one loads four extensions and ~40 processors,
two thirds of a short message's cost); a reset converter renders each text as a fresh one would.
The board reads its cards in one statement on PostgreSQL (one per non-empty column before), as plain
rows; the space page's panels render numbers without a locale lookup each and link members without a
reverse each."""
from __future__ import annotations

import re
import threading
from datetime import timedelta

import markdown as md
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import formats, timezone

from veronica.api import selectors as sel
from veronica.engine import supervisor
from veronica.swarm import bus
from veronica.models import Task, TaskStatus, VerifyPolicy
from veronica.plumbing import markdown as vmd

TEXTS = [
    "[ref]: https://example.org/a\nsee [the ref][ref]",  # a reference definition: must not reach the next text
    "see [the ref][ref]",
    "```\n<b>x</b>\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |",  # fenced code (stashed) and a table
    "one\ntwo\n\n1. #1 done\n2. __init__.py",
    "<div>raw html</div> and *em*",
    "",
]


def test_a_reused_converter_renders_each_text_as_a_fresh_one_would():
    for text in TEXTS + TEXTS[::-1]:
        fresh = md.markdown(vmd.agent_text(text), extensions=vmd.EXTENSIONS)
        assert vmd._converter().convert(vmd.agent_text(text)) == fresh, text


def test_a_reference_defined_in_one_text_does_not_resolve_in_the_next():
    vmd.render_markdown(TEXTS[0])
    assert "<a" not in vmd.render_markdown(TEXTS[1])


def test_thirty_messages_build_one_converter_per_thread(monkeypatch):
    built = []
    real_init = md.Markdown.__init__

    def counting_init(self, *args, **kwargs):
        built.append(threading.get_ident())
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(md.Markdown, "__init__", counting_init)
    monkeypatch.setattr(vmd, "_local", threading.local())
    for i in range(30):
        vmd.render_markdown(f"note **{i}**")
    other = threading.Thread(target=lambda: vmd.render_markdown("from another thread"))
    other.start()
    other.join()
    assert len(built) == 2 and len(set(built)) == 2, f"converters built: {len(built)} (one per thread expected)"



def test_a_text_rendered_again_is_not_converted_again_and_a_long_one_is_not_kept(monkeypatch):
    converted = []
    real = vmd._render
    monkeypatch.setattr(vmd, "_render", lambda text: converted.append(text) or real(text))
    vmd._cached_render.cache_clear()
    short, long = "a **short** note, again", "x" * (vmd.CACHED_TEXT_MAX + 1)
    first = vmd.render_markdown(short)
    assert vmd.render_markdown(short) == first == real(short) and converted == [short]
    vmd.render_markdown(long)
    vmd.render_markdown(long)
    assert converted == [short, long, long], "a text past CACHED_TEXT_MAX renders each time (the cache stays small)"
    assert vmd._cached_render.cache_info().maxsize == vmd.RENDER_CACHE

# --- the board -----------------------------------------------------------------------------------------------

def _board_world(space) -> None:
    """Tasks in every status, their updated_at shuffled against their ids (the card order is by updated_at)."""
    w1 = supervisor.get_member(space, "w1")
    now = timezone.now()
    rows = [Task(space=space, title=f"{status} {i}", creator_name="boss", status=status, assignee=w1 if i % 2 else None,
                 verify_policy=VerifyPolicy.CHECKS if i % 3 == 0 else VerifyPolicy.AUTO)
            for status in TaskStatus.values for i in range(7)]
    Task.objects.bulk_create(rows)
    for n, task in enumerate(Task.objects.filter(space=space).order_by("id")):
        Task.objects.filter(pk=task.pk).update(updated_at=now - timedelta(minutes=(n * 37) % 11))


@pytest.mark.django_db
def test_the_board_shows_each_columns_newest_cards_in_one_statement_on_postgresql(world):
    _board_world(world.space)
    with CaptureQueriesContext(connection) as queries:
        board = sel.task_board(world.space, per_column=5)
    columns = len(sel.BOARD_ORDER)
    assert len(queries) == (2 if connection.vendor == "postgresql" else 1 + columns), [q["sql"][:80] for q in queries]
    for col in board:
        expected = Task.objects.filter(space=world.space, status=col["status"]).select_related("assignee").order_by("-updated_at", "-id")[:5]
        assert [c["id"] for c in col["tasks"]] == [t.pk for t in expected], col["status"]
        for card, task in zip(col["tasks"], expected):
            assert card == {"id": task.pk, "title": task.title, "status": task.status, "creator": "boss",
                            "assignee": task.assignee.name if task.assignee_id else None,
                            "checking": task.status == TaskStatus.VERIFYING and task.verify_policy == VerifyPolicy.CHECKS,
                            "check_evidence": task.check_evidence, "status_reason": task.status_reason}


# --- the space page's panels ------------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("panel", ["tasks", "roster", "usage", "messages"])
def test_the_space_pages_row_panels_render_numbers_without_a_locale_lookup_each(world, monkeypatch, panel):
    _board_world(world.space)
    for i in range(3):
        bus.send(world.space, bus.OPERATOR, "w1", f"note {i}")
    looked_up = []
    real = formats.number_format
    def counting(value, *args, **kwargs):
        if not kwargs.get("force_grouping"):  # intcomma's own thousands separators are meant
            looked_up.append(value)
        return real(value, *args, **kwargs)

    monkeypatch.setattr(formats, "number_format", counting)
    response = world.client(world.viewer).get(f"/spaces/alpha/panels/{panel}/")
    assert response.status_code == 200
    assert looked_up == [], f"numbers localized one by one: {looked_up}"
    html = world.client(world.viewer).get("/spaces/alpha/panels/tasks/").content.decode()  # the space page's board
    first = Task.objects.filter(space=world.space).order_by("-updated_at", "-id").first()
    assert f'data-task="{first.pk}"' in html and f'href="/spaces/alpha/tasks/{first.pk}/"' in html


@pytest.mark.django_db
def test_the_roster_links_each_member_to_its_page(world):
    html = world.client(world.viewer).get("/spaces/alpha/panels/roster/").content.decode()
    linked = re.findall(r'<td><a href="([^"]+)">([^<]+)</a>', html)
    names = set(world.space.members.filter(removed_at__isnull=True).values_list("name", flat=True))
    assert {name for _, name in linked} == names and len(names) > 1
    assert all(href == reverse("console:member", args=["alpha", name]) for href, name in linked)


@pytest.mark.django_db
def test_the_roster_reads_no_prompt_text_tool_lists_or_task_bodies_and_still_fills_each_row(world):
    w1 = supervisor.get_member(world.space, "w1")
    task = Task.objects.create(space=world.space, title="the current one", creator_name="boss", spec="x" * 5000, status="running")
    type(w1).objects.filter(pk=w1.pk).update(persona="p" * 5000, current_task=task, error_reason="it broke")
    with CaptureQueriesContext(connection) as queries:
        rows = {row["name"]: row for row in sel.roster(world.space)}
    assert len(queries) == 2, [q["sql"][:80] for q in queries]  # usage, then members: nothing read per row
    sql = queries[-1]["sql"]
    assert all(f'"{column}"' not in sql for column in ("persona", "when_to_use", "tools", "spec", "result")), sql
    assert rows["w1"]["current_task"] == {"id": task.pk, "title": "the current one", "status": "running"}
    assert rows["w1"]["error_reason"] == "it broke" and rows["w1"]["display_phase"]


@pytest.mark.django_db
def test_approvals_questions_and_rules_read_only_what_their_rows_show_in_one_statement_each(world):
    from tests.console.helpers import open_question, pending_approval
    from veronica.engine import approvals

    for member in ("w1", "w2"):
        pending_approval(world.space, member, "write_file", path="a.txt")
        open_question(world.space, member, f"which branch, {member}?")
        approvals.allow_always(supervisor.get_member(world.space, member), "run_command", user=world.operator)
    decided = pending_approval(world.space, "w1", "run_command", command="ls")
    approvals.decide(decided, approve=False, user=world.operator, reason="no")
    approvals.revoke_rule(approvals.get_rule(world.space, approvals.rules_of(world.space)[0]["id"]), user=world.owner)
    reads = {"pending": lambda: sel.approvals(world.space), "all": lambda: sel.approvals(world.space, status=None),
             "questions": lambda: sel.questions(world.space), "rules": lambda: approvals.rules_of(world.space, live_only=False)}
    for name, read in reads.items():
        with CaptureQueriesContext(connection) as queries:
            rows = read()
        assert len(queries) == 1, (name, [q["sql"][:80] for q in queries])
        assert '"persona"' not in queries[0]["sql"] and '"password"' not in queries[0]["sql"], name
        assert len(rows) >= 2 and all(row["member"] in ("w1", "w2") for row in rows), (name, rows)
    assert {row["decided_by"] for row in sel.approvals(world.space, status=None)} == {"operator", None}
    assert {row["revoked_by"] for row in approvals.rules_of(world.space, live_only=False)} == {"owner", None}
    assert all(row["created_by"] == "operator" for row in approvals.rules_of(world.space, live_only=False))
    assert [row["text"] for row in sel.questions(world.space)] == ["which branch, w1?", "which branch, w2?"]


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/spaces/alpha/", "/spaces/alpha/members/w1/", "/spaces/alpha/panels/tasks/"])
def test_a_page_reads_its_space_and_the_users_grant_in_one_statement_and_its_seq_with_them(world, url):
    with CaptureQueriesContext(connection) as queries:
        html = world.client(world.viewer).get(url).content.decode()
    space_reads = [q["sql"] for q in queries if 'FROM "veronica_space"' in q["sql"]]
    assert len(space_reads) == 1 and "veronica_spaceaccess" in space_reads[0], space_reads
    assert not [q for q in queries if q["sql"].startswith('SELECT "veronica_spaceaccess"')]
    if "panels" not in url:
        world.space.refresh_from_db()
        assert f'data-seq="{world.space.event_seq}"' in html


@pytest.mark.django_db
def test_the_member_page_reads_its_member_skills_and_memory_once_and_shows_them(world):
    from veronica.models import MemoryFile
    from veronica.swarm import skills

    w1 = supervisor.get_member(world.space, "w1")
    skills.add_skill(world.space, "own-skill", "do it **well**", member=w1, description="mine")
    skills.add_skill(world.space, "shared-skill", "share it", description="everyone's")
    MemoryFile.objects.create(member=w1, name="MEMORY.md", content="remember *this*")
    with CaptureQueriesContext(connection) as queries:
        html = world.client(world.viewer).get("/spaces/alpha/members/w1/").content.decode()
    sqls = [q["sql"] for q in queries]
    assert len([q for q in sqls if q.startswith('SELECT "veronica_member"."id"') and '"veronica_member"."name" =' in q]) == 1
    assert len([q for q in sqls if 'FROM "veronica_skill"' in q]) == 1  # own and shared in one (it was two)
    assert len([q for q in sqls if 'FROM "veronica_memoryfile"' in q]) == 1
    assert "own-skill" in html and "shared-skill" in html and "MEMORY.md" in html and "<em>this</em>" in html


@pytest.mark.django_db
def test_the_member_page_reads_its_member_with_its_session_numbers_and_its_usage_row_once(world):
    from veronica.engine import budget
    from veronica.models import Session, Turn, UsageDay

    w1 = supervisor.get_member(world.space, "w1")
    session = Session.objects.create(member=w1)
    Turn.objects.create(session=session, seq=1, role="assistant", content="hi", tokens=70, input_tokens=55)
    UsageDay.objects.create(space=world.space, member=w1, day=budget.today(), input_tokens=1234)
    client = world.client(world.viewer)
    client.get("/spaces/alpha/members/w1/")
    with CaptureQueriesContext(connection) as queries:
        html = client.get("/spaces/alpha/members/w1/").content.decode()
    sqls = [q["sql"] for q in queries]
    member_reads = [q for q in sqls if q.startswith('SELECT "veronica_member"."id"') or 'FROM "veronica_member"' in q.split("WHERE")[0]]
    assert len(member_reads) == 1, member_reads  # the page's lookup carries the header's session numbers (it was two)
    assert len([q for q in sqls if 'FROM "veronica_usageday"' in q]) == 1  # the header's and the budget's (two before)
    assert "70 tokens · last turn input 55" in html  # the header's session numbers, from the page's lookup
    assert "1,234 tokens" in html  # the budget panel's today, from the header's row


@pytest.mark.django_db
def test_a_members_skills_are_its_own_and_the_spaces_shared_ones_it_does_not_override(world):
    from veronica.swarm import skills

    w1, w2 = supervisor.get_member(world.space, "w1"), supervisor.get_member(world.space, "w2")
    skills.add_skill(world.space, "style", "mine", member=w1)
    skills.add_skill(world.space, "style", "everyone's")
    skills.add_skill(world.space, "tests", "shared")
    skills.add_skill(world.space, "secret", "w2's own", member=w2)
    skills.add_skill(world.other, "elsewhere", "another space's")
    rows = sel.skills_of(w1)
    assert [(s["name"], s["scope"], s["body"]) for s in rows] == [("style", "member", "mine"), ("tests", "shared", "shared")]
    assert [(s["name"], s["scope"]) for s in sel.skills_of(w2)] == [("secret", "member"), ("style", "shared"), ("tests", "shared")]
