"""The django-q2 schedule that runs waggle curation. The host calls ``ensure_schedule()`` at
start-up; it is idempotent (one schedule, found by name, fields corrected if someone changed them)."""
from __future__ import annotations

SCHEDULE_NAME = "waggle-curate"
CURATE_FUNC = "waggle.service.curate"


def ensure_schedule(schedule_type: str | None = None) -> "object":
    """Create (or repair) the hourly curation schedule; returns the Schedule row."""
    from django_q.models import Schedule

    stype = schedule_type or Schedule.HOURLY
    rows = list(Schedule.objects.filter(name=SCHEDULE_NAME).order_by("id"))
    if rows:
        sched = rows[0]
        for extra in rows[1:]:  # a race at start-up could have made two; keep one
            extra.delete()
        changed = False
        for field, value in (("func", CURATE_FUNC), ("schedule_type", stype), ("repeats", -1)):
            if getattr(sched, field) != value:
                setattr(sched, field, value)
                changed = True
        if changed:
            sched.save()
        return sched
    return Schedule.objects.create(name=SCHEDULE_NAME, func=CURATE_FUNC, schedule_type=stype, repeats=-1)
