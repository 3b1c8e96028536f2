"""The run engine under the real django-q2 cluster (separate worker processes), on the database
this suite runs on (SQLite by default, PostgreSQL + Redis in hosted mode)."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import close_old_connections
from django.db.models.functions import Now
from django.utils import timezone

from tests.conftest import make_space
from tests.harness import isolate_queue, kill_cluster, qcluster, wait_for
from veronica.swarm import bus
from veronica.engine import alarms, runner, supervisor, tick
from veronica.engine.wakes import enqueue_wake
from veronica.models import Member, Message, Run, RunOutcome

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def own_queue():
    isolate_queue()
    yield
    close_old_connections()


def unread(member: Member) -> int:
    close_old_connections()
    return Message.objects.filter(recipient=member, read_at__isnull=True).count()


def test_200_concurrent_wakes_never_overlap_runs_of_one_member(tmp_path):
    space = make_space(tmp_path, workers=("w1",))
    w1 = supervisor.get_member(space, "w1")
    with qcluster(workers=4, VERONICA_OFFLINE_DELAY_MS="30"):
        for i in range(200):
            if i % 10 == 0:
                bus.send(space, "boss", "w1", f"note {i}")  # real work arrives while wakes fly
            enqueue_wake(w1.pk, "message")
        # every wake delivered (200 direct, and the sends' own rings when no wake was queued), then
        # the mailbox drained and the slot free
        wait_for(lambda: w1.wakes.count() >= 200, 90, message="all wakes delivered")
        wait_for(lambda: unread(w1) == 0 and not Member.objects.get(pk=w1.pk).lease_token, 90, message="mailbox drained")
        # one run may drain all of that mail (every wake coalesced into it): a second burst after it
        # ended makes sure there are runs to compare, so the overlap check below cannot pass vacuously
        delivered = w1.wakes.count()
        bus.send(space, "boss", "w1", "one more")
        for _ in range(20):
            enqueue_wake(w1.pk, "message")
        wait_for(lambda: w1.wakes.count() >= delivered + 20, 90, message="second burst delivered")
        wait_for(lambda: unread(w1) == 0 and not Member.objects.get(pk=w1.pk).lease_token, 90, message="mailbox drained again")
    runs = list(Run.objects.filter(member=w1).order_by("started_at").values_list("started_at", "ended_at"))
    assert len(runs) >= 2
    assert all(end is not None for _, end in runs)
    for (_, prev_end), (start, _) in zip(runs, runs[1:]):
        assert start >= prev_end, "two runs of one member overlapped"
    assert Run.objects.filter(member=w1).count() < w1.wakes.count(), "most wakes coalesce into the run in flight"


def test_a_burst_of_mail_costs_one_wake_per_run_and_every_run_calls_the_model(tmp_path):
    """Issue 13: 1.85 wakes per message and a quarter of claimed runs without a model call, from
    wakes rung while a run was in flight. With the wake-queued flag, mail to a member whose wake is
    queued or whose run is in flight enqueues nothing; the run's finish rings once for what is left."""
    space = make_space(tmp_path, workers=("w1",))
    w1 = supervisor.get_member(space, "w1")
    sent = 30
    with qcluster(workers=4, VERONICA_OFFLINE_DELAY_MS="150"):
        for i in range(sent):
            bus.send(space, "boss", "w1", f"job {i}")
            time.sleep(0.02)
        wait_for(lambda: unread(w1) == 0 and not Member.objects.get(pk=w1.pk).lease_token, 60, message="mailbox drained")
        time.sleep(1)  # a stray wake would land by now
    runs = list(Run.objects.filter(member=w1).values_list("model_calls", flat=True))
    wakes = w1.wakes.count()
    assert wakes == len(runs) and w1.wakes.filter(claimed=False).count() == 0, "every wake found work"
    assert all(calls >= 1 for calls in runs), "every claimed run called the model"
    assert wakes / sent <= 0.5, f"{wakes} wakes for {sent} messages"
    assert Member.objects.get(pk=w1.pk).wake_queued_at is None


def test_killed_worker_loses_no_message_and_the_member_runs_again_after_the_lease(tmp_path):
    space = make_space(tmp_path, workers=("w1",))
    w1 = supervisor.get_member(space, "w1")
    with qcluster(workers=2, VERONICA_OFFLINE_DELAY_MS="20000", VERONICA_RUN_LEASE_SECONDS="3") as proc:
        bus.send(space, "boss", "w1", "long job")
        wait_for(lambda: Run.objects.filter(member=w1, ended_at__isnull=True).exists(), 30, message="run in flight")
        kill_cluster(proc)
    assert unread(w1) == 1, "the message must survive the crash unread"
    Member.objects.filter(pk=w1.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=1))
    with qcluster(workers=2):
        wait_for(lambda: Member.objects.filter(pk=w1.pk, lease_expires_at__lt=Now()).exists() or not unread(w1), 10,
                 interval=0.1, message="the lease to run out")  # on the database's clock, not a fixed sleep
        tick.tick()  # the watchdog (normally the cluster's own ticker) releases and re-wakes
        wait_for(lambda: unread(w1) == 0, 60, message="message processed after the lease expired")
        wait_for(lambda: Run.objects.filter(member=w1, outcome=RunOutcome.DONE).exists(), 30, message="a clean run")
    assert Run.objects.filter(member=w1, outcome=RunOutcome.LEASE_EXPIRED).count() == 1


def test_suspend_stops_a_long_run_within_one_step(tmp_path):
    space = make_space(tmp_path, workers=("w1",))
    w1 = supervisor.get_member(space, "w1")
    with qcluster(workers=2, VERONICA_OFFLINE_DELAY_MS="30000"):
        bus.send(space, "boss", "w1", "a long think")
        wait_for(lambda: Run.objects.filter(member=w1, ended_at__isnull=True).exists(), 30, message="run in flight")
        asked = time.monotonic()
        supervisor.suspend(w1, actor="test")
        run = wait_for(lambda: Run.objects.filter(member=w1, ended_at__isnull=False).first(), 15, message="run aborted")
        stopped_after = time.monotonic() - asked
    assert run.outcome == RunOutcome.ABORTED and run.model_calls == 0 and run.tokens == 0
    from veronica.models import Event, UsageDay

    billed = list(UsageDay.objects.filter(member=w1).values_list("input_tokens", "output_tokens"))
    assert sum(i + o for i, o in billed) == 0, f"an aborted call that produced nothing is billed nothing: {billed}"
    assert not Event.objects.filter(member=w1, kind="model.called").exists()
    assert stopped_after < 5, f"the model call was not aborted promptly ({stopped_after:.1f}s)"
    assert unread(w1) == 1, "unread work stays unread after a suspend"
    w1.refresh_from_db()
    assert w1.run_status == "suspended" and not w1.lease_token


def test_frozen_member_never_runs(tmp_path):
    space = make_space(tmp_path, workers=("w1",))
    w1 = supervisor.freeze(supervisor.get_member(space, "w1"), actor="test")
    with qcluster(workers=2):
        bus.send(space, "boss", "w1", "are you there?")
        for _ in range(5):
            enqueue_wake(w1.pk, "message")
        wait_for(lambda: w1.wakes.count() >= 5, 30, message="wakes delivered")
        time.sleep(1)
    assert not Run.objects.filter(member=w1).exists()
    assert unread(w1) == 1


def test_lost_wake_is_recovered_by_the_clusters_own_engine_ticker(tmp_path):
    space = make_space(tmp_path, workers=("w1",))
    w1 = supervisor.get_member(space, "w1")
    Message.objects.create(space=space, sender_name="boss", recipient=w1, recipient_name="w1", body="enqueued nowhere")
    Message.objects.filter(recipient=w1).update(created_at=timezone.now() - tick.SWEEP_AFTER)  # its wake never came
    with qcluster(workers=2, VERONICA_ENGINE_TICK_SECONDS="1"):
        wait_for(lambda: unread(w1) == 0, 30, message="the sweep to re-wake the member")
    assert Run.objects.filter(member=w1, outcome=RunOutcome.DONE).exists()


def test_cron_schedule_and_alarm_fire_within_60s_of_their_time(tmp_path):
    space = make_space(tmp_path, workers=("w1", "w2"))
    w1, w2 = supervisor.get_member(space, "w1"), supervisor.get_member(space, "w2")
    w1 = supervisor.set_schedule(w1, "* * * * *", actor="test")
    cron_due = w1.schedule_next_at
    alarm = alarms.set_alarm(w2, timezone.now() + timedelta(seconds=5), "check the oven", created_by="test")
    with qcluster(workers=2):
        first_timer_run = wait_for(lambda: Run.objects.filter(member=w1, source="timer").order_by("started_at").first(),
                                   (cron_due - timezone.now()).total_seconds() + 65, message="the cron wake")
        alarm_run = wait_for(lambda: Run.objects.filter(member=w2, source="alarm").first(), 65, message="the alarm wake")
    assert (first_timer_run.started_at - cron_due).total_seconds() < 60
    alarm.refresh_from_db()
    assert (alarm.fired_at - alarm.fire_at).total_seconds() < 60
    assert alarm_run.started_at >= alarm.fire_at
