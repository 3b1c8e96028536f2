"""Timeliness for cron schedules: besides the engine tick (every few seconds), each member's next
firing is a django-q2 ONCE schedule, which q2's scheduler picks up within about 30 seconds."""
from __future__ import annotations

from datetime import datetime


def arm_cron(member_id: int, next_at: datetime | None) -> None:
    from django_q.models import Schedule

    Schedule.objects.filter(name__startswith=f"veronica-cron-{member_id}-").delete()
    if next_at is not None:
        Schedule.objects.create(name=f"veronica-cron-{member_id}-{int(next_at.timestamp())}", func="veronica.engine.tick.fire_cron",
                                schedule_type=Schedule.ONCE, next_run=next_at, repeats=-1)
