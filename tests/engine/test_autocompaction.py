"""Automatic compaction (issue 10.11): before the request would pass the threshold of the model's
window, metered like any call, never concurrent with a run."""
from __future__ import annotations

import pytest

from veronica.swarm import bus
from veronica.agent import compaction
from veronica.engine import runner, supervisor
from veronica.plumbing.errors import Conflict
from veronica.models import Event, Member, Run, Session, UsageDay


@pytest.fixture
def small_window(settings):
    settings.CONTEXT_WINDOWS = {**settings.CONTEXT_WINDOWS, "tiny-model": 5000}
    settings.COMPACT_AT_PERCENT = 80
    Member.objects.filter(name="w1").update(model="openai:tiny-model")


def w1_of(space):
    return supervisor.get_member(space, "w1")


def test_known_windows_prefixes_and_the_default(settings):
    settings.CONTEXT_WINDOWS = {"gpt-4.1": 1_000_000, "gpt-4.1-nano": 500_000}
    settings.CONTEXT_WINDOW_DEFAULT = 64_000
    assert compaction.context_window("openai:gpt-4.1-nano-2025") == 500_000
    assert compaction.context_window("openai:gpt-4.1") == 1_000_000
    assert compaction.context_window("anthropic:unknown") == 64_000


def test_a_bad_context_window_setting_names_the_variable(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from veronica.settings import _context_windows

    with pytest.raises(ImproperlyConfigured, match="VERONICA_CONTEXT_WINDOWS"):
        _context_windows(["gpt-x=lots"])
    assert _context_windows(["gpt-x=32000"]) == {"gpt-x": 32000}


def test_the_run_compacts_before_the_request_would_pass_the_threshold_and_meters_it(space, scripted, small_window):
    big = "x" * 4000  # ~1,000 tokens of tool output per call
    provider = scripted(("list_dir", {}), ("list_dir", {}), ("list_dir", {}), "- summary of the work", "done")
    from veronica.agent.tools import workspace

    real = workspace.TOOLS[0].fn
    workspace.TOOLS[0].fn = lambda ctx, args: big
    try:
        bus.send(space, "boss", "w1", "explore")
        assert runner.wake(w1_of(space).pk, "message") == "done"
    finally:
        workspace.TOOLS[0].fn = real
    compacted = Event.objects.filter(kind="member.compacted").get()
    assert compacted.payload["actor"] == "auto" and compacted.payload["mode"] == "full"
    assert compacted.payload["tokens_before"] >= compacted.payload["threshold"] > compacted.payload["tokens_after"]
    summary_request = provider.requests[3]
    assert summary_request[-1]["content"] == "Summarize the conversation above."
    assert provider.systems[3] == compaction.SUMMARY_SYSTEM
    run = Run.objects.get()
    assert run.model_calls == 5 == UsageDay.objects.get(member__name="w1").model_calls, "the summarizing call is metered"
    assert Session.objects.filter(member__name="w1", end_reason="compacted").count() == 1
    final_request = provider.requests[4]
    assert final_request[0]["content"].startswith("Summary of the earlier conversation")
    assert any(m["role"] == "user" and "explore" in m["content"] for m in final_request), "the brief carries over"


def test_micro_compaction_is_tried_first_and_may_be_enough(space, scripted, settings):
    settings.CONTEXT_WINDOWS = {**settings.CONTEXT_WINDOWS, "tiny-model": 20000}
    Member.objects.filter(name="w1").update(model="openai:tiny-model")
    from veronica.agent.tools import workspace

    real = workspace.TOOLS[0].fn
    workspace.TOOLS[0].fn = lambda ctx, args: "y" * 8000
    provider = scripted(*[("list_dir", {})] * 8, "done")
    try:
        bus.send(space, "boss", "w1", "explore")
        assert runner.wake(w1_of(space).pk, "message") == "done"
    finally:
        workspace.TOOLS[0].fn = real
    modes = [e.payload["mode"] for e in Event.objects.filter(kind="member.compacted")]
    assert modes and set(modes) == {"micro"}
    assert all(r[-1]["content"] != "Summarize the conversation above." for r in provider.requests)


def test_compaction_claims_the_run_slot_so_it_never_races_a_run(space, scripted):
    w1 = w1_of(space)
    scripted(("list_dir", {}), "done")
    bus.send(space, "boss", "w1", "explore")
    runner.wake(w1.pk, "message")
    seen = {}
    real = compaction._micro

    def during(session, rows):
        seen["wake"] = runner.wake(w1.pk, "message")  # a wake that lands mid-compaction
        seen["busy"] = Member.objects.get(pk=w1.pk).run_status
        return real(session, rows)
    compaction._micro = during
    try:
        supervisor.compact(w1, "micro", actor="op")
    finally:
        compaction._micro = real
    assert seen == {"wake": "coalesced", "busy": "busy"}
    assert Run.objects.filter(member=w1, source="compact", outcome="done").count() == 1
    assert Member.objects.get(pk=w1.pk).lease_token == ""


def test_operator_compaction_of_a_running_member_is_refused(space):
    w1 = w1_of(space)
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="running")
    with pytest.raises(Conflict, match="while it is running"):
        supervisor.compact(w1, "full", actor="op")


def test_full_operator_compaction_is_metered_and_keeps_the_unanswered_brief(space, scripted):
    from veronica.agent.providers.base import ProviderError

    w1 = w1_of(space)
    Member.objects.filter(pk=w1.pk).update(model="openai:gpt-4.1")
    provider = scripted(("list_dir", {}), "first done", ProviderError("HTTP 500", status=500), "- what happened")
    bus.send(space, "boss", "w1", "one")
    runner.wake(w1.pk, "message")
    bus.send(space, "boss", "w1", "two")
    runner.wake(w1.pk, "message")  # fails: the brief "two" is unanswered
    from veronica.agent import compaction as module

    module_get = module.get_provider
    module.get_provider = lambda spec: provider
    try:
        result = supervisor.compact(w1_of(space), "full", actor="op")
    finally:
        module.get_provider = module_get
    assert result["kept"] == 1
    turns = list(Session.objects.get(member=w1, ended_at__isnull=True).turns.values_list("role", "content"))
    assert turns[-1][0] == "user" and "two" in turns[-1][1]
    assert UsageDay.objects.get(member=w1).model_calls == 4


def test_a_summary_holding_nul_or_a_lone_surrogate_is_kept_with_replacement_characters(space, scripted, monkeypatch):
    """A vendor's summary is kept like any reply (veronica.plumbing.errors.storable): a NUL failed the compaction
    on PostgreSQL, and a lone surrogate on both databases, every time it was tried."""
    w1 = w1_of(space)
    Member.objects.filter(pk=w1.pk).update(model="openai:gpt-4.1")
    provider = scripted(("list_dir", {}), "done", "- listed\x00 the dir \ud800 and stopped")
    bus.send(space, "boss", "w1", "one")
    runner.wake(w1.pk, "message")
    monkeypatch.setattr(compaction, "get_provider", lambda spec: provider)
    supervisor.compact(w1_of(space), "full", actor="op")
    summary = Session.objects.get(member=w1, ended_at__isnull=True).turns.order_by("seq").first().content
    assert summary.endswith("- listed\ufffd the dir \ufffd and stopped")
