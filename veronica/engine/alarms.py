"""One-shot alarms: a durable Alarm row plus a django-q2 ONCE schedule for timeliness. The engine
tick fires any alarm that is due and unfired, so a lost schedule (or a restart) re-arms it."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from veronica.swarm import audit, bus, events
from veronica.plumbing.errors import VeronicaError, require_text
from veronica.models import Alarm, Member

MAX_AHEAD = timedelta(days=366)


@audit.verb("member.alarm_set", created=True)
def set_alarm(member: Member, fire_at: datetime, note: str, *, created_by: str) -> Alarm:
    from django_q.models import Schedule

    note = require_text(note, "note", max_len=2000)
    now = timezone.now()
    if fire_at - now > MAX_AHEAD:
        raise VeronicaError("an alarm can be at most 366 days ahead", field="fire_at")
    with transaction.atomic():
        alarm = Alarm.objects.create(space_id=member.space_id, member=member, fire_at=max(fire_at, now), note=note, created_by=created_by)
        Schedule.objects.create(name=f"veronica-alarm-{alarm.pk}", func="veronica.engine.alarms.fire", args=str(alarm.pk),
                                schedule_type=Schedule.ONCE, next_run=alarm.fire_at, repeats=-1)
        events.emit(member.space_id, "alarm.set", member=member, alarm=alarm.pk, fire_at=alarm.fire_at.isoformat(), by=created_by)
    return alarm


def fire(alarm_id: int) -> bool:
    """Fire once: the conditional update on fired_at makes the schedule and the tick race-safe."""
    with transaction.atomic():
        if not Alarm.objects.filter(pk=alarm_id, fired_at__isnull=True).update(fired_at=timezone.now()):
            return False
        alarm = Alarm.objects.select_related("member", "space").get(pk=alarm_id)
        if alarm.member.removed_at is None:
            bus.send(alarm.space, bus.SYSTEM, alarm.member.name, f"Alarm: {alarm.note}", subject="Alarm", wake_source="alarm")
        events.emit(alarm.space_id, "alarm.fired", member=alarm.member, alarm=alarm.pk)
    return True


def fire_due() -> int:
    from veronica.engine import clock

    due = Alarm.objects.filter(fired_at__isnull=True, fire_at__lte=clock.now()).values_list("pk", flat=True)
    return sum(fire(pk) for pk in list(due))
