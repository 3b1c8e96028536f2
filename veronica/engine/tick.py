"""The engine tick: one django-q2 schedule does every periodic duty, so idle members cost nothing
(no per-member polling) and a lost wake costs latency, never work."""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from veronica import bus, events, ledger
from veronica.engine import alarms, failures, runner, supervisor
from veronica.engine.timers import arm_cron
from veronica.engine.wakes import enqueue_wake
from veronica.models import Member, Membership, Message, Phase, RunStatus, Space, Task, TaskStatus

log = logging.getLogger(__name__)
TICK_SCHEDULE = "veronica-engine-tick"


def fire_cron() -> list[int]:
    """Due schedules: advance next_at with a conditional update (one firing per slot), then wake."""
    now = timezone.now()
    fired = []
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
    """Re-wake every idle active member that has unread mail. Coalesces harmlessly with live wakes."""
    unread = Message.objects.filter(recipient=OuterRef("pk"), read_at__isnull=True)
    idle = Member.objects.filter(run_status=RunStatus.IDLE, membership=Membership.ACTIVE, removed_at__isnull=True, lease_token="")
    idle = idle.exclude(phase__in=[Phase.WAITING_APPROVAL, Phase.WAITING_INPUT])  # the decision wakes them
    idle = idle.filter(failures.RUNNABLE)  # parked or backing off: the failure model wakes them
    ids = list(idle.filter(Exists(unread)).values_list("pk", flat=True))
    for member_id in ids:
        enqueue_wake(member_id, "message")
    return ids


def stale_tasks() -> int:
    """Running tasks older than the space's threshold: one reminder to the leader per task."""
    now = timezone.now()
    count = 0
    for space in Space.objects.filter(stale_task_minutes__gt=0):
        cutoff = now - timedelta(minutes=space.stale_task_minutes)
        for task in Task.objects.filter(space=space, status=TaskStatus.RUNNING, started_at__lt=cutoff, stale_notified_at__isnull=True):
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


def tick() -> dict:
    summary = {
        "leases_expired": len(runner.expire_leases()),
        "cron_fired": len(fire_cron()),
        "alarms_fired": alarms.fire_due(),
        "dispatched": len(ledger.dispatch_ready()),
        "stale_tasks": stale_tasks(),
        "clones_retired": len(supervisor.retire_idle_clones()),
        "swept": len(sweep_unread()),
        "retried": len(failures.due_retries()),
    }
    if any(summary.values()):
        log.info("engine tick: %s", summary)
    return summary


def ensure_schedule() -> None:
    """The one engine schedule (every minute; q2's scheduler looks about twice a minute)."""
    from django_q.models import Schedule

    Schedule.objects.update_or_create(name=TICK_SCHEDULE, defaults={
        "func": "veronica.engine.tick.tick", "schedule_type": Schedule.MINUTES, "minutes": 1, "repeats": -1,
        "next_run": timezone.now()})
