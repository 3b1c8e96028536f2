"""The failure model (issue 10.5): transient errors back off and re-wake until the goal is done;
permanent ones park the member with one alert until an operator resumes it or its config changes."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from veronica.swarm import bus
from veronica.agent.providers.base import ProviderError, Usage
from veronica.engine import failures, runner, supervisor, tick
from veronica.models import Event, Member, Message, Run, Turn, UsageDay


def w1_of(space):
    return supervisor.get_member(space, "w1")



def backoff_over(member):
    Member.objects.filter(pk=member.pk).update(retry_at=Now() - timedelta(seconds=1))


def test_a_transient_error_after_the_first_turn_backs_off_and_the_rewake_finishes_the_goal(space, scripted, rung, django_capture_on_commit_callbacks):
    """The brief's mail is read at the first turn; the failure on the second call must not strand it."""
    w1 = w1_of(space)
    provider = scripted(("list_dir", {}), ProviderError("HTTP 529 overloaded", status=529), "goal done")
    bus.send(space, "boss", "w1", "the goal")
    assert runner.wake(w1.pk, "message") == "error"
    w1.refresh_from_db()
    assert w1.phase == "error" and w1.failures == 1 and w1.retry_at is not None and "529" in w1.error_reason
    assert Message.objects.get(recipient=w1).read_at is not None  # read at the first turn...
    assert runner.wake(w1.pk, "message") == "backoff", "a wake during the backoff must not call the model"
    assert len(provider.requests) == 2
    assert tick.sweep_unread() == []
    backoff_over(w1)
    rung.clear()
    assert failures.due_retries() == [w1.pk] and rung == [(w1.pk, "resume")]
    assert runner.wake(w1.pk, "resume") == "done"  # ...and the work in progress is picked up again
    assert Turn.objects.filter(role="assistant").last().content == "goal done"
    w1.refresh_from_db()
    assert (w1.failures, w1.retry_at, w1.error_reason, w1.phase) == (0, None, "", "ready")


def test_a_vendor_error_text_with_nul_or_a_lone_surrogate_is_recorded_and_retried(space, scripted, rung):
    """The failure is recorded like any other (storable text): before, writing it raised, so the run
    was never finished and the member waited for its lease to expire, again at every retry."""
    w1 = w1_of(space)
    scripted(ProviderError("upstream said bad\x00body \ud800", status=500, request_id="req\x00"), "goal done")
    bus.send(space, "boss", "w1", "the goal")
    assert runner.wake(w1.pk, "message") == "error"
    w1.refresh_from_db()
    assert w1.phase == "error" and w1.failures == 1 and not w1.lease_token
    assert "bad\ufffdbody \ufffd" in w1.error_reason and "req\ufffd" in w1.error_reason
    assert "bad\ufffdbody" in Run.objects.get(member=w1).error
    backoff_over(w1)
    assert runner.wake(w1.pk, "resume") == "done"


def test_backoff_grows_exponentially_and_is_capped(settings):
    settings.RUN_RETRY_BASE_SECONDS, settings.RUN_RETRY_MAX_SECONDS = 10, 60
    delays = [failures.backoff_seconds(n) for n in range(1, 7)]
    assert 8 <= delays[0] <= 10 and 16 <= delays[1] <= 20 and 32 <= delays[2] <= 40 and all(d <= 60 for d in delays)


def test_consecutive_failures_push_the_retry_further_out(space, scripted, settings):
    settings.RUN_RETRY_BASE_SECONDS = 100
    w1 = w1_of(space)
    scripted(ProviderError("timeout"), ProviderError("timeout"))
    bus.send(space, "boss", "w1", "x")
    runner.wake(w1.pk, "message")
    first = Member.objects.get(pk=w1.pk).retry_at
    backoff_over(w1)
    runner.wake(w1.pk, "resume")
    w1.refresh_from_db()
    assert w1.failures == 2
    assert (w1.retry_at - timezone.now()).total_seconds() > 150 > (first - timezone.now()).total_seconds() - 10


@pytest.mark.parametrize("status", [401, 404, 400])
def test_a_permanent_error_parks_the_member_with_one_alert_and_no_more_requests(space, scripted, rung, status):
    w1 = w1_of(space)
    provider = scripted(*[ProviderError(f"HTTP {status}", permanent=True, status=status, request_id="req_1")] * 5)
    bus.send(space, "boss", "w1", "the goal")
    assert runner.wake(w1.pk, "message") == "error"
    w1.refresh_from_db()
    assert w1.phase == "error" and w1.parked_config and f"HTTP {status}" in w1.error_reason and "req_1" in w1.error_reason
    for _ in range(20):  # the tick and new mail keep coming; nothing calls the vendor
        tick.tick()
        assert runner.wake(w1.pk, "message") == "parked"
    bus.send(space, "boss", "w1", "more work")
    assert runner.wake(w1.pk, "message") == "parked"
    assert len(provider.requests) == 1
    assert Event.objects.filter(kind="ops.alert", payload__subject="member parked").count() == 1
    assert Message.objects.filter(recipient_name="operator", subject="Parked: w1").count() == 1
    assert not [pk for pk, _ in rung if pk == w1.pk], "a parked member is never re-woken by the tick"
    assert Message.objects.filter(recipient=w1, read_at__isnull=True).count() == 2, "its work waits, unread"


def test_an_operator_resume_unparks_and_runs_the_waiting_work(space, scripted, rung, django_capture_on_commit_callbacks):
    w1 = w1_of(space)
    provider = scripted(ProviderError("HTTP 401 invalid key", permanent=True, status=401), "finally")
    bus.send(space, "boss", "w1", "the goal")
    runner.wake(w1.pk, "message")
    rung.clear()
    with django_capture_on_commit_callbacks(execute=True):
        supervisor.resume(w1, actor="op")
    assert rung == [(w1.pk, "resume")]
    assert runner.wake(w1.pk, "resume") == "done"
    assert len(provider.requests) == 2 and Message.objects.get(recipient=w1).read_at is not None
    assert Member.objects.get(pk=w1.pk).parked_config == ""


@pytest.mark.parametrize("change", ["model", "permission"])
def test_a_config_change_unparks_the_member(space, scripted, rung, change, django_capture_on_commit_callbacks):
    w1 = w1_of(space)
    scripted(ProviderError("HTTP 404 model not found", permanent=True, status=404), "works now")
    bus.send(space, "boss", "w1", "the goal")
    runner.wake(w1.pk, "message")
    assert runner.wake(w1.pk, "message") == "parked"
    if change == "model":
        Member.objects.filter(pk=w1.pk).update(model="openai:gpt-4.1-mini")  # as the admin or a fresh register would
    else:
        supervisor.set_permission_mode(w1, "default", actor="op")
    rung.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert failures.due_retries() == [w1.pk]
    assert rung == [(w1.pk, "resume")]
    assert runner.wake(w1.pk, "resume") == "done"


def test_failed_calls_are_metered(space, scripted):
    scripted(ProviderError("HTTP 500", status=500, usage=Usage(input=700, output=30)))
    bus.send(space, "boss", "w1", "x")
    runner.wake(w1_of(space).pk, "message")
    day = UsageDay.objects.get(member__name="w1")
    assert (day.input_tokens, day.output_tokens, day.model_calls) == (700, 30, 1)
    assert Run.objects.get().tokens == 730


def test_a_crash_is_retried_with_backoff_too(space, scripted, monkeypatch):
    import veronica.agent.loop as loop

    scripted("x")
    monkeypatch.setattr(loop, "system_prompt", lambda *args: (_ for _ in ()).throw(RuntimeError("template bug")))
    bus.send(space, "boss", "w1", "x")
    assert runner.wake(w1_of(space).pk, "message") == "error"
    w1 = w1_of(space)
    assert w1.retry_at is not None and not w1.parked_config and "template bug" in w1.error_reason


def test_the_roster_shows_why_a_member_is_parked(space, scripted):
    from veronica.api.selectors import roster

    scripted(ProviderError("HTTP 401 invalid key", permanent=True, status=401))
    bus.send(space, "boss", "w1", "x")
    runner.wake(w1_of(space).pk, "message")
    row = next(r for r in roster(space) if r["name"] == "w1")
    assert row["display_phase"] == "error" and row["parked"] and "invalid key" in row["error_reason"]


def test_an_idle_retry_duty_costs_one_statement(space, django_assert_num_queries):
    with django_assert_num_queries(1):
        assert failures.due_retries() == []


@pytest.mark.django_db(transaction=True)  # (the retry closes the connection: no test transaction around it)
def test_a_finish_that_meets_a_dead_connection_finishes_on_a_new_one(space, scripted, monkeypatch):
    """After a database outage a worker's pooled connections are dead until used: a run crashed on one
    and its finish met the same one, so the member stayed leased (its mail unread) for the whole run
    lease. The finish now closes the dead connection and fences again on a new one."""
    from django.db import OperationalError

    from veronica.engine import slot

    real_finish, calls = slot.finish, []

    def finish(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("consuming input failed: server closed the connection unexpectedly")
        return real_finish(*args, **kwargs)

    monkeypatch.setattr(slot, "finish", finish)
    scripted("done")
    bus.send(space, "boss", "w1", "x")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    w1 = w1_of(space)
    assert len(calls) == 2 and w1.lease_token == "" and w1.run_status == "idle", "the lease was released"
    assert Run.objects.get(member=w1).ended_at is not None
