"""Recovery after a worker dies (issue 10, recovery p99): the resume a dead run owes its member is
durable (rung again until a run takes the slot, so a wake a killed cluster took with it costs
seconds, not the work), and the re-run finishes the interrupted tool chain before it takes new mail."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from veronica.swarm import bus
from veronica.engine import failures, leases, runner, supervisor
from veronica.models import Member, Message, Run, RunOutcome, Task, UsageDay



def w1_of(space):
    return supervisor.get_member(space, "w1")


def die_mid_run(member: Member) -> None:
    """What a SIGKILLed worker leaves: a busy member, a live Run row, a lease nobody renews."""
    Member.objects.filter(pk=member.pk).update(run_status="busy", lease_token="dead", lease_expires_at=Now() - timedelta(seconds=1))
    Run.objects.create(member=member, source="message", lease_token="dead", started_at=timezone.now())


def time_passes(member: Member, seconds: float) -> None:
    Member.objects.filter(pk=member.pk).update(retry_at=Now() - timedelta(seconds=seconds))


def test_the_resume_a_dead_run_owes_is_rung_again_until_a_run_takes_the_slot(space, rung, scripted,
                                                                           django_capture_on_commit_callbacks):
    w1 = w1_of(space)
    bus.send(space, "boss", "w1", "the goal")
    die_mid_run(w1)
    rung.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert leases.expire_leases() == [w1.pk]
    assert rung == [(w1.pk, "resume")], "rung at once"
    rung.clear()  # ...and that wake is lost: the cluster whose pusher held it was killed too
    assert failures.due_retries() == [], "not rung twice in the same breath"
    time_passes(w1, 0.1)
    assert failures.due_retries() == [w1.pk] and rung == [(w1.pk, "resume")], "rung again: the loss costs seconds"
    assert Member.objects.get(pk=w1.pk).retry_at > timezone.now(), "and again later while nobody answers"
    scripted("goal done")
    assert runner.wake(w1.pk, "resume") == "done"
    w1.refresh_from_db()
    assert w1.retry_at is None and w1.failures == 0, "the run that took the slot settled the debt"
    rung.clear()
    time_passes(w1, 60)
    Member.objects.filter(pk=w1.pk).update(retry_at=None)
    assert failures.due_retries() == [] and rung == []


def test_the_ring_again_interval_is_seconds_not_a_lease(settings):
    settings.ENGINE_TICK_SECONDS, settings.RUN_LEASE_SECONDS = 2, 60
    assert failures.ring_again_seconds() == 2.0


def test_a_member_whose_budget_tripped_is_not_rung_for_its_retry(space, rung):
    """Its wake would refuse to run: ringing it every few seconds would burn a worker for nothing."""
    from veronica.engine import budget

    w1 = w1_of(space)
    Member.objects.filter(pk=w1.pk).update(retry_at=Now() - timedelta(seconds=1))
    UsageDay.objects.create(member=w1, space=space, day=budget.today(), tripped=True)
    assert failures.due_retries() == [] and rung == []


def test_whichever_wake_comes_first_takes_the_owed_resume_and_settles_it(space, rung, scripted,
                                                                         django_capture_on_commit_callbacks):
    """The owed resume is no backoff: under a backlog a message wake may reach a worker first (seen in
    the bench: refusing it cost 10 s), and it must run."""
    w1 = w1_of(space)
    bus.send(space, "boss", "w1", "first")
    die_mid_run(w1)
    with django_capture_on_commit_callbacks(execute=True):
        leases.expire_leases()
    scripted("done")
    assert runner.wake(w1.pk, "message") == "done"
    assert not Message.objects.filter(recipient=w1, read_at__isnull=True).exists()
    assert Member.objects.get(pk=w1.pk).retry_at is None
    assert runner.wake(w1.pk, "resume") == "done", "the late resume ring finds nothing to do and exits cleanly"


def test_a_failing_members_backoff_still_holds_off_message_wakes(space, scripted):
    w1 = w1_of(space)
    Member.objects.filter(pk=w1.pk).update(failures=1, retry_at=Now() + timedelta(seconds=30))
    bus.send(space, "boss", "w1", "x")
    assert runner.wake(w1.pk, "message") == "backoff"


def test_a_run_killed_mid_chain_is_finished_before_the_new_mail_is_briefed(space, rung, scripted, tmp_path,
                                                                          django_capture_on_commit_callbacks):
    """The brief's mail is read at the first model turn; the worker dies after a tool result. New mail
    must not bury the interrupted chain (the offline worker then forgot its task: 13 tasks of 120 were
    left running in bench/recovery.py): the re-run continues it, the mail gets the run after."""
    from veronica.swarm import ledger

    w1 = w1_of(space)
    task = ledger.create_task(space, "boss", "the first job", assignee=w1)
    provider = scripted(("list_dir", {}), ("task_done", {"task_id": task.pk, "result": "ok"}), "first done", "second done")

    def die_after_the_tool_result(call_no: int) -> None:
        if call_no == 2:
            raise KeyboardInterrupt("SIGKILL")  # not an Exception: the run ends without its finish, as a kill does
    provider.on_call = die_after_the_tool_result
    with pytest.raises(KeyboardInterrupt):
        runner.wake(w1.pk, "message")
    provider.on_call = None
    assert Message.objects.get(recipient=w1).read_at is not None
    Member.objects.filter(pk=w1.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert leases.expire_leases() == [w1.pk]
    bus.send(space, "boss", "w1", "the second job")
    rung.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert runner.wake(w1.pk, "resume") == "done"
    resumed = provider.requests[2]
    assert resumed[-1]["role"] == "tool" and "second job" not in str(resumed), "the chain went on where it stopped"
    assert Task.objects.get(pk=task.pk).status in ("done", "verifying")
    assert Message.objects.filter(recipient=w1, read_at__isnull=True).count() == 1, "the new mail waits for the next run"
    assert (w1.pk, "message") in rung, "and that run is rung when this one ends"
    assert runner.wake(w1.pk, "message") == "done"
    assert "second job" in provider.requests[-1][-1]["content"]
    assert Run.objects.filter(member=w1, outcome=RunOutcome.LEASE_EXPIRED).count() == 1


def test_a_resume_wake_goes_to_the_head_of_the_redis_queue():
    """Recovery first: the next free worker takes the resume, not the doorbells queued before it."""
    from django.conf import settings
    from django_q.brokers import get_broker
    from django_q.signing import SignedPackage

    from tests.harness import isolate_queue
    from veronica.engine.wakes import enqueue_wake

    if not getattr(settings, "REDIS_URL", ""):
        pytest.skip("the ORM broker has no order to jump (embedded mode)")
    isolate_queue()
    broker = get_broker()
    try:
        enqueue_wake(1, "message")
        enqueue_wake(2, "message")
        enqueue_wake(3, "resume")
        names = [SignedPackage.loads(raw)["name"] for raw in broker.connection.lrange(broker.list_key, 0, -1)]
        assert names == ["wake-3-resume", "wake-1-message", "wake-2-message"]
    finally:
        broker.delete_queue()
