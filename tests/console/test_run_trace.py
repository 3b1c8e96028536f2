"""The run trace page and the usage page: what they show, who may see them, where they are linked."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from tests.console.trace_helpers import drive_run
from veronica.web import run_trace
from veronica.engine import budget, supervisor
from veronica.models import Event, Run, UsageDay


@pytest.fixture
def traced(world, monkeypatch):
    return drive_run(monkeypatch, world.space)


def test_the_trace_has_model_and_tool_spans_with_tokens_cost_retries_and_errors(traced):
    data = run_trace.trace(traced)
    kinds = [(r["kind"], r["name"]) for r in data["rows"]]
    assert [k for k, _ in kinds] == ["model", "tool", "model", "tool", "model"]
    assert [n for k, n in kinds if k == "tool"] == ["read_file", "list_dir"]
    first, read, *_ = data["rows"]
    assert first["retries"] == 1 and "HTTP 529 overloaded" in first["errors"][0]
    assert (first["tokens_in"], first["tokens_out"], first["usd"]) == (100, 10, Decimal("0.0012"))
    assert read["errors"] and "missing.txt" in read["errors"][0]
    assert data["rows"][-1]["text"] == "All done: the folder is empty."
    assert data["totals"] == {"model_calls": 3, "tool_calls": 2, "mcp_calls": 0, "tokens_in": 300, "tokens_out": 30,
                              "usd": Decimal("0.0036"), "retries": 1, "errors": 2}
    assert all(0 <= r["x"] <= 100 and 0 < r["w"] <= 100 for r in data["rows"])


def test_approvals_and_waggle_replays_are_marked(world, traced):
    w1 = supervisor.get_member(world.space, "w1")
    events = list(Event.objects.filter(space=world.space, member=w1).order_by("seq"))
    # a replay after list_dir and an approval, as the loop emits them, inside the run's events
    from veronica.models import Event as E

    end = next(e for e in events if e.kind == "run.ended")
    extra = [E(space=world.space, member=w1, seq=0, kind="waggle.replayed", payload={"after": "list_dir", "chars": 120},
               created_at=end.created_at),
             E(space=world.space, member=w1, seq=0, kind="approval.requested", payload={"approval": 7, "tool": "write_file"},
               created_at=end.created_at)]
    spans, _ = run_trace.spans_of(events[:-1] + extra + [end])
    assert [s.kind for s in spans][-2:] == ["replay", "approval"]
    listing = next(s for s in spans if s.name == "list_dir")
    assert listing.marks == ["waggle replayed after list_dir (120 chars)"]


def test_the_run_page_renders_for_a_viewer_and_is_404_from_another_space(world, traced):
    page = world.client(world.viewer).get(f"/spaces/alpha/runs/{traced.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "read_file" in html and "HTTP 529 overloaded" in html and "All done: the folder is empty." in html
    assert "$0.003600" in html and 'class="span-bar"' in html
    assert world.client(world.stranger).get(f"/spaces/alpha/runs/{traced.pk}/").status_code == 404
    assert world.client(world.stranger).get(f"/spaces/beta/runs/{traced.pk}/").status_code == 404  # not beta's run
    assert world.client(world.viewer).get("/spaces/alpha/runs/999999/").status_code == 404


def test_the_member_page_and_transcript_link_to_the_run(world, traced):
    html = world.client(world.viewer).get("/spaces/alpha/members/w1/").content.decode()
    link = f'href="/spaces/alpha/runs/{traced.pk}/"'
    assert html.count(link) >= 2  # the runs panel and the transcript turns written in that run
    assert link in world.client(world.viewer).get("/spaces/alpha/members/w1/panels/runs/").content.decode()


def test_the_usage_page_shows_30_days_per_member_against_budgets(world, traced):
    w2 = supervisor.get_member(world.space, "w2")
    old = budget.today() - timedelta(days=3)
    UsageDay.objects.create(space=world.space, member=w2, day=old, input_tokens=900, output_tokens=100, usd=Decimal("0.5"))
    UsageDay.objects.create(space=world.space, member=w2, day=budget.today() - timedelta(days=40), input_tokens=7777)
    world.space.member_daily_tokens = 500
    world.space.save()
    data = run_trace.usage(world.space)
    rows = {m["name"]: m for m in data["members"]}
    assert len(rows["w2"]["series"]) == 30 and rows["w2"]["tokens"] == 1000  # the 40-day-old row is outside
    assert rows["w2"]["budget"] == 500 and next(s for s in rows["w2"]["series"] if s["day"] == old)["over"]
    assert rows["w1"]["tokens"] == 330 and rows["w1"]["usd"] == Decimal("0.0036")
    html = world.client(world.viewer).get("/spaces/alpha/usage/").content.decode()
    assert 'data-member="w2"' in html and "$0.5036" in html and "line class=\"budget\"" in html
    assert world.client(world.stranger).get("/spaces/alpha/usage/").status_code == 404


def test_an_mcp_tool_call_is_a_tool_span_naming_its_server(world, monkeypatch):
    from tests.console.trace_helpers import drive_mcp_run

    run = drive_mcp_run(monkeypatch, world.space)
    data = run_trace.trace(run)
    tool = next(r for r in data["rows"] if r["kind"] == "tool")
    assert (tool["name"], tool["server"], tool["text"], tool["errors"]) == ("mcp__calc__add", "calc", "42", [])
    assert tool["detail"] == "a=2, b=40" and data["totals"]["mcp_calls"] == 1
    assert [r["kind"] for r in data["rows"]] == ["model", "tool", "model"]
    html = world.client(world.viewer).get(f"/spaces/alpha/runs/{run.pk}/").content.decode()
    assert "MCP calc" in html and "(1 MCP)" in html


def test_a_run_the_watchdog_ended_is_cut_off_and_stops_at_the_members_next_run(world, monkeypatch):
    from tests.console.trace_helpers import lease_lost_run
    from veronica.agent.runctx import LeaseLost

    lost, lease = lease_lost_run(world.space)
    with pytest.raises(LeaseLost):  # the stalled worker wakes up: its writes are refused
        with lease.fenced():
            pass
    later = drive_run(monkeypatch, world.space)  # the resumed run, with its own model and tool calls
    data = run_trace.trace(lost)
    assert lost.outcome == "lease_expired" and data["lease_lost"]
    assert [(r["kind"], r["unfinished"]) for r in data["rows"]] == [("model", True)]  # nothing of the next run
    assert data["error"] == run_trace.LEASE_LOST
    assert len(run_trace.trace(later)["rows"]) == 5
    html = world.client(world.viewer).get(f"/spaces/alpha/runs/{lost.pk}/").content.decode()
    assert "cut off (lease lost)" in html and "lease expired" in html


def test_a_running_run_shows_its_open_call_as_running(world):
    member = supervisor.get_member(world.space, "w1")
    from veronica.engine import slot
    from veronica.models import Phase

    lease = slot.claim(member, "message")
    slot.write_phase(lease.member, Phase.THINKING)
    data = run_trace.trace(Run.objects.get(pk=lease.run.pk))
    assert data["running"] and [(r["kind"], r["unfinished"]) for r in data["rows"]] == [("model", True)]
    assert "running</span>" in world.client(world.viewer).get(f"/spaces/alpha/runs/{lease.run.pk}/").content.decode()


def test_the_trace_reads_model_called_as_the_metering_writes_it(traced):
    """The trace is built from the events the engine writes now: one model.called per metered call."""
    events = Event.objects.filter(kind="model.called", payload__run=traced.pk).order_by("seq")
    assert events.count() == traced.model_calls == 3
    assert {k: events[0].payload[k] for k in ("input", "output", "cached", "usd", "model")} == {
        "input": 100, "output": 10, "cached": 0, "usd": "0.0012", "model": traced.member.model}


def test_a_held_call_shows_its_request_and_the_decision_made_after_the_run(world, monkeypatch):
    from tests.engine.conftest import ScriptedProvider
    from veronica.swarm import bus
    from veronica.engine import approvals, runner
    from veronica.models import Approval, Member

    provider = ScriptedProvider((("write_file", {"path": "notes.txt", "content": "hi"}), "Wrote it."))
    monkeypatch.setattr("veronica.agent.loop.get_provider", lambda spec: provider)
    w1 = supervisor.get_member(world.space, "w1")
    Member.objects.filter(pk=w1.pk).update(permission_mode="default")
    bus.send(world.space, "boss", "w1", "write a note")
    runner.wake(w1.pk, "message")
    held = Run.objects.filter(member=w1).latest("id")
    assert held.outcome == "waiting"
    asked = next(r for r in run_trace.trace(held)["rows"] if r["kind"] == "approval")
    assert asked["name"] == "approval: write_file" and asked["marks"][-1] == "waiting for a decision"
    approvals.decide(Approval.objects.get(member=w1), approve=True, user=world.owner, reason="fine")
    runner.wake(w1.pk, "resume")
    asked = next(r for r in run_trace.trace(held)["rows"] if r["kind"] == "approval")
    assert asked["marks"][-1].startswith("approved by owner at ") and asked["marks"][-1].endswith(": fine")
    resumed = Run.objects.filter(member=w1).latest("id")
    assert [r["name"] for r in run_trace.trace(resumed)["rows"] if r["kind"] == "tool"] == ["write_file"]
    html = world.client(world.viewer).get(f"/spaces/alpha/runs/{held.pk}/").content.decode()
    assert "approved by owner" in html


def test_the_usage_page_puts_waggle_savings_beside_the_days(world, traced):
    from waggle.models import LedgerEntry

    LedgerEntry.objects.create(name="ls", scope="space", space_key=str(world.space.pk), yield_tokens=250)
    LedgerEntry.objects.create(name="ls", scope="space", space_key=str(world.other.pk), yield_tokens=999)  # beta's
    data = run_trace.usage(world.space)
    assert data["waggle"] and data["saved_total"] == 250 and data["totals"][-1]["saved"] == 250
    html = world.client(world.viewer).get("/spaces/alpha/usage/").content.decode()
    assert '<dd id="waggle-saved">250 tokens</dd>' in html


def _count_queries(client, url: str) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


def test_the_trace_and_usage_pages_cost_the_same_queries_however_big_the_run_or_space(world, monkeypatch,
                                                                                      django_assert_max_num_queries):
    from tests.engine.conftest import ScriptedProvider
    from veronica.swarm import bus
    from veronica.engine import runner

    small = drive_run(monkeypatch, world.space, "w1")
    provider = ScriptedProvider([("list_dir", {})] * 20 + ["done"])
    monkeypatch.setattr("veronica.agent.loop.get_provider", lambda spec: provider)
    w2 = supervisor.get_member(world.space, "w2")
    bus.send(world.space, "boss", "w2", "look twenty times")
    runner.wake(w2.pk, "message")
    big = Run.objects.filter(member=w2).latest("id")
    client = world.client(world.viewer)
    assert len(run_trace.trace(big)["rows"]) == 41
    assert _count_queries(client, f"/spaces/alpha/runs/{big.pk}/") == _count_queries(client, f"/spaces/alpha/runs/{small.pk}/")
    with django_assert_max_num_queries(10):  # 8 here; the point is it does not grow
        client.get(f"/spaces/alpha/runs/{big.pk}/")
    before = _count_queries(client, "/spaces/alpha/usage/")
    for i in range(5):
        member = supervisor.add_member(world.space, f"extra{i}", actor="test")
        UsageDay.objects.create(space=world.space, member=member, day=budget.today(), input_tokens=10 * i)
    assert _count_queries(client, "/spaces/alpha/usage/") == before <= 9


def test_a_compaction_call_and_an_estimated_one_are_marked(world):
    from django.utils import timezone

    now = timezone.now()
    w1 = supervisor.get_member(world.space, "w1")

    def ev(kind, **payload):
        return Event(space=world.space, member=w1, seq=0, kind=kind, payload=payload, created_at=now)

    spans, _ = run_trace.spans_of([
        ev("run.started", run=1), ev("member.phase", phase="thinking"),
        ev("model.called", run=1, model="m", input=900, output=50, usd="0.01", purpose="compaction"),
        ev("model.called", run=1, model="m", input=100, output=5, usd="0.001", estimated=True),
        ev("agent.text", text="hello"), ev("run.ended", run=1, outcome="done", error="")])
    assert [(s.name, s.text) for s in spans] == [("compaction: m", ""), ("m", "hello")]
    assert spans[1].marks == ["usage estimated (the vendor reported none)"]
