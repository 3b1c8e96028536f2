"""The engine tick: every periodic duty in one pass, run every few seconds by the one active
engine ticker (veronica.engine.ticker), so idle members cost nothing (no per-member polling) and a
lost wake or a dead worker costs latency, never work.

Idle cost is pinned by a test: one select per duty, whatever the number of spaces and members.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import DatabaseError, transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now

from veronica.swarm import a2a_calls, audit, bus, events, ledger
from veronica.engine import alarms, clock, failures, leases, retention, supervisor, watchdogs
from veronica.engine.timers import arm_cron
from veronica.engine.wakes import enqueue_wake, one_push
from veronica.plumbing.errors import Conflict, NotFound
from veronica.models import (
    A2ACall, Approval, ApprovalStatus, Member, Membership, Message, Phase, Question, RetirePolicy, RunStatus, Task, TaskStatus, Wake,
)

log = logging.getLogger(__name__)
LEGACY_TICK_SCHEDULE = "veronica-engine-tick"  # the old q2 schedule; the ticker thread replaced it
# The sweep is the backstop for wakes a broker lost: it leaves fresh mail to its own wake, and a
# member it (or anyone) woke recently alone, so a backlogged queue is not flooded with doorbells.
SWEEP_AFTER = timedelta(seconds=15)


def fire_cron() -> list[int]:
    """Due schedules: advance next_at with a conditional update (one firing per slot), then wake."""
    now = clock.now()
    fired = []
    with one_push():  # the wakes of a burst of schedules due together go to the broker together
        for member in Member.objects.filter(schedule_next_at__lte=now, removed_at__isnull=True).exclude(schedule=""):
            following = supervisor.next_fire(member.schedule, now)
            if not Member.objects.filter(pk=member.pk, schedule_next_at=member.schedule_next_at).update(schedule_next_at=following):
                continue
            arm_cron(member.pk, following)
            if member.membership == Membership.ACTIVE:
                events.emit(member.space_id, "schedule.fired", member=member, schedule=member.schedule)
                enqueue_wake(member.pk, "timer")
                fired.append(member.pk)
    return fired


def sweep_unread() -> list[int]:
    """Re-wake every idle active member whose unread mail, or an operator's decision on its held call,
    no wake has come for (the decision's own wake may be lost too). Coalesces harmlessly.

    A wake on its way is left alone: a member whose wake-queued flag was set within SWEEP_AFTER (by
    a ring, or by this sweep, which sets it for the members it wakes). Without that, a queue backlog
    longer than SWEEP_AFTER had every tick enqueue one more wake for every member still waiting in
    it (a Wake row is written only when a wake is taken), so the backlog fed itself: 500 members
    mailed at once on a busy host took a minute to start, their queue swelling with doorbells."""
    cutoff = clock.now() - SWEEP_AFTER  # the database's clock: mail is stamped by many hosts
    unread = Message.objects.filter(recipient=OuterRef("pk"), read_at__isnull=True, created_at__lt=cutoff)
    decided = Approval.objects.filter(member=OuterRef("pk"), consumed=False, decided_at__lt=cutoff).exclude(status=ApprovalStatus.PENDING)
    answered = Question.objects.filter(member=OuterRef("pk"), consumed=False, answered_at__lt=cutoff)
    remote_done = A2ACall.objects.filter(member=OuterRef("pk"), consumed=False, finished_at__lt=cutoff)  # a parked a2a__ call
    woken_lately = Wake.objects.filter(member=OuterRef("pk"), created_at__gte=cutoff)
    idle = Member.objects.filter(run_status=RunStatus.IDLE, membership=Membership.ACTIVE, removed_at__isnull=True, lease_token="")
    idle = idle.filter(failures.RUNNABLE)  # parked or backing off: the failure model wakes them
    waiting = Q(phase__in=[Phase.WAITING_APPROVAL, Phase.WAITING_INPUT])  # mail waits for the decision, which wakes them
    work = (Exists(unread) & ~waiting) | Exists(decided) | Exists(answered) | Exists(remote_done)
    # Start from what is owed (old unread mail, unfolded decisions and answers, ended remote calls:
    # small, partially indexed sets), so an idle tick reads no member row (issue 25.3).
    owed = (Message.objects.filter(read_at__isnull=True, created_at__lt=cutoff).order_by().values("recipient_id").union(
        Approval.objects.filter(consumed=False, decided_at__lt=cutoff).order_by().values("member_id"),
        Question.objects.filter(consumed=False, answered_at__lt=cutoff).order_by().values("member_id"),
        A2ACall.objects.filter(consumed=False, finished_at__lt=cutoff).order_by().values("member_id")))
    on_its_way = Q(wake_queued_at__gte=cutoff)
    ids = list(idle.filter(pk__in=owed).filter(work).exclude(Exists(woken_lately)).exclude(on_its_way).values_list("pk", flat=True))
    if ids:  # this sweep's wakes are on their way: the next sweeps leave them to arrive (the claim re-stamps it)
        Member.objects.filter(pk__in=ids, lease_token="").update(wake_queued_at=Now())
    with one_push():
        for member_id in ids:
            enqueue_wake(member_id, "message")
    return ids


def stale_tasks() -> int:
    """Running tasks older than their space's threshold: one reminder to the leader per task.
    One select over running, unreminded tasks (none when idle), thresholds read through the join."""
    now = clock.now()
    count = 0
    running = Task.objects.filter(status=TaskStatus.RUNNING, stale_notified_at__isnull=True, started_at__isnull=False,
                                  space__stale_task_minutes__gt=0).select_related("space")
    for task in running:
        space = task.space
        if task.started_at >= now - timedelta(minutes=space.stale_task_minutes):
            continue
        with transaction.atomic():
            if not Task.objects.filter(pk=task.pk, stale_notified_at__isnull=True).update(stale_notified_at=now):
                continue
            body = f"Task #{task.pk} ({task.title}) has been running since {task.started_at:%H:%M} UTC."
            events.emit(space.pk, "ops.alert", subject="stale task", body=body, task=task.pk)
            try:
                bus.send(space, bus.SYSTEM, "leader", body, subject=f"Stale task #{task.pk}", task=task)
            except Exception:
                log.warning("no leader to remind about task %s", task.pk)
        count += 1
    return count


def retire_finished_clones() -> list[str]:
    """on_complete clones go once they finished a task, hold no open one, are idle with no mail.
    One select finds them all (a clone waiting for work costs nothing per tick)."""
    tasks = Task.objects.filter(assignee=OuterRef("pk"))
    closed = [TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED]
    candidates = Member.objects.filter(
        retire_policy=RetirePolicy.ON_COMPLETE, removed_at__isnull=True, run_status=RunStatus.IDLE, lease_token="",
    ).filter(Exists(tasks.filter(status=TaskStatus.DONE))).exclude(Exists(tasks.exclude(status__in=closed))).exclude(
        Exists(Message.objects.filter(recipient=OuterRef("pk"), read_at__isnull=True)))
    retired = []
    for clone in candidates:
        try:
            supervisor.retire(clone, actor=bus.SYSTEM)
            retired.append(clone.name)
        except (Conflict, NotFound):
            continue
    return retired


DUTIES = (
    ("leases_expired", lambda: len(leases.expire_leases())),  # first: it is what recovery waits on
    ("cron_fired", lambda: len(fire_cron())),
    ("alarms_fired", alarms.fire_due),
    ("dispatched", lambda: len(ledger.dispatch_ready())),
    ("stale_tasks", stale_tasks),
    ("a2a_polled", a2a_calls.poll_parked),  # parked a2a__ calls: their remote tasks' ends wake the members
    ("clones_retired", lambda: len(retire_finished_clones())),
    ("swept", lambda: len(sweep_unread())),
    ("retried", lambda: len(failures.due_retries())),  # backoff elapsed: the failure model's re-wake
    ("purged", retention.purge_if_due),
    ("ops", lambda: watchdogs.duties()),  # stuck runs, mailbox backlog, notifier retries, lost check runs
)


@audit.as_engine
def tick() -> dict:
    """Run every duty. One duty's bug never starves the others; a database error ends the pass
    (the ticker logs it and retries next period)."""
    summary = {}
    with clock.ticking():  # one reading of the database's clock for every duty of this pass
        for name, duty in DUTIES:
            try:
                summary[name] = duty()
            except DatabaseError:
                raise
            except Exception:
                log.exception("engine tick: %s failed", name)
                summary[name] = -1
    if any(summary.values()):
        log.info("engine tick: %s", summary)
    return summary


@audit.as_engine
def expire_due_leases() -> int:
    """A follower ticker's one duty: the run leases that ran out, expired and their members re-woken.
    The holder does the same in its tick; both are conditional updates, so whichever comes first
    wins and the other finds nothing. A dead run's member then waits on no hand-over of the role:
    when a kill takes the holder and a run together, a follower releases the run at its lease end."""
    with clock.ticking():
        return len(leases.expire_leases())


def drop_legacy_schedule() -> None:
    """Deployments from before the ticker carry a once-a-minute q2 schedule; the ticker replaces it."""
    from django_q.models import Schedule

    Schedule.objects.filter(name=LEGACY_TICK_SCHEDULE).delete()
