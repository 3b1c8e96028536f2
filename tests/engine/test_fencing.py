"""Every write a run makes is fenced by its lease token, on the database's clock (issue 10.3)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from veronica.swarm import bus
from veronica.agent.runctx import LeaseLost
from veronica.engine import runner, slot, supervisor
from veronica.models import Event, Member, Message, Run, RunOutcome, Turn, UsageDay


def w1_of(space):
    return supervisor.get_member(space, "w1")


def take_over(member_id: int) -> None:
    """What the watchdog and the next run do while this run is paused: a new token, the old Run ended."""
    Run.objects.filter(member_id=member_id, ended_at__isnull=True).update(ended_at=timezone.now(), outcome=RunOutcome.LEASE_EXPIRED)
    Member.objects.filter(pk=member_id).update(lease_token="the-next-run", lease_expires_at=Now() + timedelta(seconds=60))


def snapshot(space):
    return {
        "turns": list(Turn.objects.values_list("role", "content")),
        "runs": list(Run.objects.values_list("outcome", "ended_at", "model_calls", "tokens")),
        "unread": Message.objects.filter(recipient__name="w1", read_at__isnull=True).count(),
        "usage": list(UsageDay.objects.values_list("input_tokens", "output_tokens", "model_calls")),
        "phase": Member.objects.filter(name="w1").values_list("phase", "phase_since").get(),
        "events": Event.objects.filter(space=space).count(),
    }


@pytest.mark.parametrize("lost", ["taken over", "expired"])
def test_a_run_that_lost_its_lease_during_the_model_call_writes_nothing(space, scripted, lost):
    w1 = w1_of(space)
    provider = scripted("my stale answer")
    bus.send(space, "boss", "w1", "the goal")
    before = {}

    def lose_the_lease(call_no):
        if lost == "taken over":
            take_over(w1.pk)
        else:  # nobody took it yet, but its time is up on the database's clock
            Member.objects.filter(pk=w1.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
        before.update(snapshot(space))
    provider.on_call = lose_the_lease
    assert runner.wake(w1.pk, "message") == "lease-lost"
    after = snapshot(space)
    billed = (after.pop("usage"), after.pop("runs"))
    before.pop("usage"), before.pop("runs")
    assert after == before, "the stale run wrote after it lost its lease"
    assert not Turn.objects.filter(role="assistant").exists()
    assert Message.objects.get(recipient=w1).read_at is None, "the goal stays unread for the next run"
    # ...but the call it completed was billed: metered to the member's day and to the stale run itself
    assert billed[0] == [(100, 10, 1)]
    assert [(outcome, calls, tokens) for outcome, _, calls, tokens in billed[1]] == [(RunOutcome.LEASE_EXPIRED if lost == "taken over"
                                                                                      else "running", 1, 110)]


def test_the_stale_run_does_not_rewrite_the_run_row_or_overlap_the_next_one(space, scripted):
    w1 = w1_of(space)
    provider = scripted("stale")
    bus.send(space, "boss", "w1", "job")
    provider.on_call = lambda n: take_over(w1.pk)
    runner.wake(w1.pk, "message")
    run = Run.objects.get()
    assert run.outcome == RunOutcome.LEASE_EXPIRED
    assert Member.objects.get(pk=w1.pk).lease_token == "the-next-run", "the stale run released the new run's slot"


def test_a_lost_lease_between_tool_calls_stops_the_run_before_the_next_tool(space, scripted, tmp_path):
    w1 = w1_of(space)
    provider = scripted(("write_file", {"path": "a.txt", "content": "1"}), ("write_file", {"path": "b.txt", "content": "2"}), "done")
    bus.send(space, "boss", "w1", "write two files")
    provider.on_call = lambda n: take_over(w1.pk) if n == 2 else None
    assert runner.wake(w1.pk, "message") == "lease-lost"
    assert (tmp_path / "alpha" / "a.txt").exists() and not (tmp_path / "alpha" / "b.txt").exists()
    assert list(Turn.objects.values_list("role", flat=True)) == ["user", "assistant", "tool"]


def test_a_row_writing_tool_commits_nothing_when_the_lease_is_gone(space, scripted):
    """send_message runs inside the fence: its mail and its result commit together or not at all."""
    w1 = w1_of(space)
    lease = slot.claim(w1, "message")
    take_over(w1.pk)
    with pytest.raises(LeaseLost):
        with lease.fenced():
            bus.send(space, "w1", "w2", "from a stale run")
    assert not Message.objects.filter(recipient__name="w2").exists()


def test_finish_of_a_stale_run_writes_nothing(space):
    w1 = w1_of(space)
    lease = slot.claim(w1, "message")
    take_over(w1.pk)
    before = snapshot(space)
    with pytest.raises(LeaseLost):
        slot.finish(lease, RunOutcome.DONE)
    assert snapshot(space) == before


def test_the_lease_is_set_and_compared_on_the_database_clock(space, scripted, monkeypatch):
    """A host whose clock runs an hour behind must neither shorten nor stretch the lease."""
    w1 = w1_of(space)
    real_now = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: real_now - timedelta(hours=1))
    seen = []
    provider = scripted("ok")
    provider.on_call = lambda n: seen.append(Member.objects.get(pk=w1.pk).lease_expires_at)
    bus.send(space, "boss", "w1", "hi")
    assert runner.wake(w1.pk, "message") == "done"
    assert seen and seen[0] > real_now, "the lease was computed from the host's clock"


def test_a_long_tool_call_renews_the_lease_while_it_runs(space, scripted, settings, monkeypatch):
    """run_command may take 30 s; the lease is renewed beside it (one renewal per heartbeat)."""
    from veronica.agent.tools import workspace

    settings.RUN_HEARTBEAT_SECONDS = 0.01
    renewals = []
    real_renew = slot.renew
    monkeypatch.setattr(slot, "renew", lambda *a, **k: (renewals.append(1), real_renew(*a, **k))[1])
    started = []

    def slow_command(ctx, args):
        import time

        started.append(len(renewals))
        time.sleep(0.3)
        return "ran"
    monkeypatch.setattr(next(t for t in workspace.TOOLS if t.name == "run_command"), "fn", slow_command)
    scripted(("run_command", {"command": "sleep 30"}), "done")
    bus.send(space, "boss", "w1", "run it")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    assert started and len(renewals) - started[0] >= 5, "the lease was not renewed during the tool call"


def test_the_lease_minimum_is_above_the_heartbeat(settings):
    from django.conf import settings as live

    assert live.RUN_LEASE_SECONDS >= 3 * live.RUN_HEARTBEAT_SECONDS


def test_a_suspend_is_seen_while_streamed_text_keeps_renewing_the_lease(space, monkeypatch):
    """Live deltas are fenced writes (each renews the lease); the cancel check must not starve."""
    from veronica.agent.runctx import Cancelled

    clock = [1000.0]
    monkeypatch.setattr(slot.time, "monotonic", lambda: clock[0])
    w1 = w1_of(space)
    lease = slot.claim(w1, "message")
    supervisor.suspend(w1, actor="op")
    stopped = False
    for _ in range(10):
        clock[0] += 0.3
        with lease.fenced():  # a streamed delta's event
            pass
        stopped = lease.should_stop()
        if stopped:
            break
    assert stopped and type(lease.stop_reason()) is Cancelled


def test_a_lease_below_the_minimum_is_refused_at_start_up_with_its_name():
    import os
    import subprocess
    import sys
    from pathlib import Path

    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    environ["VERONICA_RUN_LEASE_SECONDS"] = "2"
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=Path(__file__).resolve().parents[2], env=environ,
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "VERONICA_RUN_LEASE_SECONDS=2 is below the minimum 3" in proc.stderr


def test_ask_operator_keeps_its_question_inside_the_fence_and_resumes_with_the_answer(space, scripted, django_user_model):
    """Row-writing tools run in a savepoint inside the fence; waiting for an operator must not roll it back."""
    from veronica.engine import approvals
    from veronica.models import Question

    operator = django_user_model.objects.create_user("op")
    w1 = w1_of(space)
    provider = scripted(("ask_operator", {"question": "Which branch?"}), "thanks")
    bus.send(space, "boss", "w1", "ship it")
    assert runner.wake(w1.pk, "message") == "waiting"
    question = Question.objects.get()
    assert question.text == "Which branch?" and w1_of(space).phase == "waiting-input"
    approvals.answer(question, text="main", user=operator)
    assert runner.wake(w1.pk, "resume") == "done"
    assert provider.requests[-1][-1]["content"] == "The operator answered: main"


def test_a_failing_row_writing_tool_leaves_nothing_half_written(space, scripted):
    """A row-writing tool that fails after a write rolls back its savepoint; the run goes on."""
    from veronica.agent.tools import swarm

    def half_then_fail(ctx, args):
        bus.send(ctx.space, "w1", "w2", "half of the work")
        raise RuntimeError("boom after a write")
    tool = next(t for t in swarm.TOOLS if t.name == "send_message")
    real = tool.fn
    tool.fn = half_then_fail
    try:
        scripted(("send_message", {"to": "w2", "body": "x"}), "ok")
        bus.send(space, "boss", "w1", "tell w2")
        assert runner.wake(w1_of(space).pk, "message") == "done"
    finally:
        tool.fn = real
    assert not Message.objects.filter(recipient__name="w2").exists()
    assert "boom after a write" in Turn.objects.get(role="tool").content


def test_a_run_recounted_by_the_watchdog_then_billed_stale_is_counted_once(space, scripted, monkeypatch):
    """Paused past its lease after two metered calls: the watchdog ends the run and recounts its
    counters from its events (2); the third call then completes, stale, and adds itself alone."""
    from veronica.engine import failures, leases

    monkeypatch.setattr(failures, "enqueue_wake", lambda pk, source: None)
    w1 = w1_of(space)
    provider = scripted(("list_dir", {}), ("list_dir", {"path": "."}), "the stale answer")
    bus.send(space, "boss", "w1", "the goal")

    def expire_during_the_third_call(call_no):
        if call_no == 3:
            Member.objects.filter(pk=w1.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
            assert leases.expire_leases() == [w1.pk]
            assert Run.objects.get(member=w1).model_calls == 2  # recounted from its model.called events
    provider.on_call = expire_during_the_third_call
    assert runner.wake(w1.pk, "message") == "lease-lost"
    run, day = Run.objects.get(member=w1), UsageDay.objects.get(member=w1)
    assert run.outcome == RunOutcome.LEASE_EXPIRED and run.model_calls == 3 == day.model_calls
    assert run.tokens == day.input_tokens + day.output_tokens + day.cache_read_tokens + day.cache_write_tokens


def test_finish_of_an_expired_lease_writes_nothing_though_the_token_is_still_its_own(space):
    """The finish's fence releases the slot in its own statement (PostgreSQL): it still holds only while
    the lease has not expired on the database's clock (release alone matched the token only)."""
    w1 = w1_of(space)
    lease = slot.claim(w1.pk, "message", gates=("breaker",))
    Member.objects.filter(pk=w1.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
    before = snapshot(space)
    with pytest.raises(LeaseLost):
        slot.finish(lease, RunOutcome.DONE)
    assert snapshot(space) == before
    row = Member.objects.filter(pk=w1.pk).values("run_status", "lease_token").get()
    assert row == {"run_status": "busy", "lease_token": lease.token}
    assert Run.objects.get(pk=lease.run.pk).ended_at is None


def test_a_finished_run_releases_its_slot_and_ends_its_run_row(space):
    w1 = w1_of(space)
    lease = slot.claim(w1.pk, "message", gates=("breaker",), open_session=True)
    assert lease.session is not None or slot.connections["default"].vendor != "postgresql"
    slot.finish(lease, RunOutcome.DONE)
    row = Member.objects.filter(pk=w1.pk).values("run_status", "lease_token", "lease_expires_at", "wake_queued_at").get()
    assert row == {"run_status": "idle", "lease_token": "", "lease_expires_at": None, "wake_queued_at": None}
    run = Run.objects.get(pk=lease.run.pk)
    assert run.outcome == RunOutcome.DONE and run.ended_at is not None and run.source == "message"
    assert Event.objects.filter(space=space, kind="run.ended").count() == 1
