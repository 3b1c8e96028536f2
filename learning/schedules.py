"""django-q2 schedules for the passes. The host calls ensure_schedules() at start-up."""
from __future__ import annotations

from django.db import transaction

SCHEDULES = (
    # (name, func, minutes)
    ("learning.reflect", "learning.tasks.reflect", 15),
    ("learning.learn", "learning.tasks.learn", 60),
    ("learning.distill", "learning.tasks.distill", 30),
)


def ensure_schedules() -> list[str]:
    """Create the passes' Schedule rows if missing. Idempotent: an existing row keeps whatever
    interval an operator gave it in the admin; a wrong function is repaired; duplicates (two hosts
    starting at once) are removed. Returns the names it created."""
    from django_q.models import Schedule

    created = []
    with transaction.atomic():
        for name, func, minutes in SCHEDULES:
            rows = list(Schedule.objects.filter(name=name).order_by("id"))
            if not rows:
                Schedule.objects.create(name=name, func=func, schedule_type=Schedule.MINUTES, minutes=minutes,
                                        repeats=-1)
                created.append(name)
                continue
            keep, extra = rows[0], rows[1:]
            for row in extra:
                row.delete()
            if keep.func != func:
                keep.func = func
                keep.save(update_fields=["func"])
    return created
