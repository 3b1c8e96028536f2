"""A member's run against the mock vendors, in-process: live text and retry state reach the event
log (throttled), prompt caching is metered and priced."""
from __future__ import annotations

import pytest

from tests.vendors import faults as f
from tests.vendors.mock_anthropic import MockAnthropic
from tests.vendors.mock_openai import MockOpenAI
from veronica.swarm import bus
from veronica.agent.live import LiveSink
from veronica.engine import runner, supervisor
from veronica.models import Event, Member, UsageDay


@pytest.fixture
def anthropic_mock(settings, monkeypatch):
    with MockAnthropic(api_key="ak-test") as mock:
        settings.ANTHROPIC_BASE_URL = mock.base_url
        settings.MODEL_BACKOFF = 0.01
        monkeypatch.setenv("ANTHROPIC_API_KEY", "ak-test")
        yield mock


@pytest.fixture
def openai_mock(settings, monkeypatch):
    with MockOpenAI(api_key="sk-test") as mock:
        settings.OPENAI_BASE_URL = mock.base_url
        settings.MODEL_BACKOFF = 0.01
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        yield mock


def member_on(space, model: str) -> Member:
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(model=model)
    return Member.objects.get(pk=w1.pk)


def kinds(space, kind: str) -> list[dict]:
    return [e.payload for e in Event.objects.filter(space=space, kind=kind).order_by("seq")]


def test_anthropic_run_streams_live_text_and_meters_cache_tokens_and_usd(space, anthropic_mock):
    w1 = member_on(space, "anthropic:claude-haiku-4-5")
    anthropic_mock.push(f.text("Hello from a streamed answer, in pieces.", chunks=4, delay=0.3))
    bus.send(space, "boss", "w1", "say hello")
    assert runner.wake(w1.pk, "message") == "done"
    body = anthropic_mock.model_requests()[0].body
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"} and body["system"][0]["cache_control"]
    deltas = kinds(space, "agent.delta")
    assert 2 <= len(deltas) < 6 and "".join(d["text"] for d in deltas) in "Hello from a streamed answer, in pieces."
    assert any(p["phase"] == "texting" for p in kinds(space, "member.phase"))
    first = UsageDay.objects.get(member=w1)
    assert first.cache_write_tokens > 1024 and first.cache_read_tokens == 0 and first.usd > 0

    bus.send(space, "boss", "w1", "again")
    assert runner.wake(w1.pk, "message") == "done"
    second = UsageDay.objects.get(member=w1)
    assert second.cache_read_tokens >= first.cache_write_tokens  # the second run read the stable prefix


def test_openai_run_shows_the_retry_state_and_recovers(space, openai_mock):
    w1 = member_on(space, "openai:gpt-4.1-mini")
    openai_mock.push(f.overloaded(), f.text("fine now"))
    bus.send(space, "boss", "w1", "hello")
    assert runner.wake(w1.pk, "message") == "done"
    retries = kinds(space, "agent.retry")
    assert len(retries) == 1 and retries[0]["reason"] == "HTTP 529 overloaded" and retries[0]["text"].startswith("retrying")
    assert any(p["phase"] == "thinking" and p["tool"].startswith("retrying") for p in kinds(space, "member.phase"))
    assert kinds(space, "agent.text")[-1]["text"] == "fine now"
    assert UsageDay.objects.get(member=w1).usd > 0


class FakeCtx:
    def __init__(self):
        self.phases = []

    def phase(self, phase, tool="", *, step=False):
        self.phases.append((phase, tool))

    def fenced(self):  # the run's lease fence (veronica.agent.runctx); always held here
        import contextlib

        return contextlib.nullcontext()


def test_live_text_is_throttled_not_one_event_per_token(space):
    w1 = supervisor.get_member(space, "w1")
    now = [0.0]
    ctx = FakeCtx()
    sink = LiveSink(w1, ctx, every=0.25, clock=lambda: now[0])
    for i in range(100):  # 100 tokens over one second
        sink({"type": "text", "delta": f"t{i} "})
        now[0] += 0.01
    deltas = kinds(space, "agent.delta")
    assert 3 <= len(deltas) <= 4
    assert [d["offset"] for d in deltas] == [sum(len(x["text"]) for x in deltas[:i]) for i in range(len(deltas))]
    assert ctx.phases == [("texting", "")]
    sink({"type": "retry", "delay": 8.0, "reason": "HTTP 529 overloaded"})
    assert kinds(space, "agent.retry")[0]["text"] == "retrying in 8 s: HTTP 529 overloaded"
    assert ctx.phases[-1] == ("thinking", "retrying in 8 s: HTTP 529 overloaded")
    sink({"type": "text", "delta": "again"})  # the next attempt starts a new preview, in phase texting
    assert ctx.phases[-1] == ("texting", "")


def test_a_reply_streamed_within_the_throttle_costs_no_commit_for_its_texting_phase(space, openai_mock):
    """The texting phase rides the first preview's fence: a reply (or a tool call's text) streamed at
    once shows no preview, so it no longer pays a fenced commit of its own per call (issue 25)."""
    from tests.engine.test_step_cost import fences
    from tests.harness import round_trips

    w1 = member_on(space, "openai:gpt-4.1-mini")
    openai_mock.push(f.tool_call("list_dir", {"path": "."}, text="Looking around."), f.text("All done, in pieces.", chunks=4))
    bus.send(space, "boss", "w1", "look")
    with round_trips() as sent:
        assert runner.wake(w1.pk, "message") == "done"
    assert [p["phase"] for p in kinds(space, "member.phase")] == ["thinking", "ready"]  # was thinking, texting x2 between
    # measured 3 on PostgreSQL since the claim opens the session in its own statement and the finish's fence
    # releases the slot (issue 25); 5 before that (and on SQLite); 7 when each streamed text paid a fenced
    # commit for its phase
    from django.db import connection

    assert fences(sent) == (3 if connection.vendor == "postgresql" else 5)
    assert Member.objects.get(pk=w1.pk).phase == "ready"


class LaterCtx(FakeCtx):
    """A run's lease as the engine's: a phase can wait for the next fence."""

    def __init__(self, member):
        super().__init__()
        self.member, self.later = member, []

    def next_phase(self, phase, tool=""):
        self.later.append((phase, tool))


def test_the_texting_phase_waits_for_the_first_preview_and_is_dropped_without_one(space):
    w1 = supervisor.get_member(space, "w1")
    now = [0.0]
    ctx = LaterCtx(w1)
    sink = LiveSink(w1, ctx, every=0.25, clock=lambda: now[0])
    sink({"type": "text", "delta": "quick"})
    sink.close()  # the call ended before a preview: the phase the step's fence would write is the current one
    assert ctx.phases == [] and ctx.later == [("texting", ""), (w1.phase, w1.phase_tool)]
    sink = LiveSink(w1, ctx, every=0.25, clock=lambda: now[0])
    ctx.later.clear()
    for i in range(40):
        sink({"type": "text", "delta": f"t{i} "})
        now[0] += 0.01
    sink.close()
    assert ctx.later == [("texting", "")], "a preview's fence wrote it: nothing to drop"
    assert len(kinds(space, "agent.delta")) == 1


def test_budgets_count_cache_reads_and_writes_as_billed_tokens(space, anthropic_mock):
    """Cache reads are billed input (at their own rate), and so are cache writes: a token budget
    that skipped them let an Anthropic member spend most of its prompt uncounted."""
    from veronica.engine import budget
    from veronica.models import Run, Space, Turn

    w1 = member_on(space, "anthropic:claude-haiku-4-5")
    for ask in ("say hello", "again"):
        anthropic_mock.push(f.text("Hello."))
        bus.send(space, "boss", "w1", ask)
        assert runner.wake(w1.pk, "message") == "done"
    day = UsageDay.objects.get(member=w1)
    assert day.cache_write_tokens > 1024 and day.cache_read_tokens > 1024, "the mock wrote, then read, the stable prefix"
    billed = day.input_tokens + day.output_tokens + day.cache_read_tokens + day.cache_write_tokens
    assert day.total_tokens == billed == budget.tokens_today(w1)
    assert sum(Run.objects.filter(member=w1).values_list("tokens", flat=True)) == billed
    assert sum(Turn.objects.filter(role="assistant").values_list("tokens", flat=True)) == billed
    assert budget.space_today(space)["tokens"] == billed

    uncached = day.input_tokens + day.output_tokens
    Member.objects.filter(pk=w1.pk).update(budget_override=uncached + 1)  # the uncached part alone is under the cap
    assert budget.check_breaker(Member.objects.select_related("space").get(pk=w1.pk)), "the breaker must see the cached tokens"
    UsageDay.objects.filter(member=w1).update(tripped=False)
    Member.objects.filter(pk=w1.pk).update(budget_override=-1)
    Space.objects.filter(pk=space.pk).update(daily_token_ceiling=uncached + 1)
    assert budget.check_breaker(Member.objects.select_related("space").get(pk=w1.pk)), "so must the space's ceiling"
