"""Cron schedules: the one validator and the one next-firing computation.

A schedule is exactly five fields (minute hour day month weekday). croniter also takes a seconds
and a year field and `@daily`-style aliases; we refuse them so the error message and what is
accepted agree. `croniter.is_valid` passes expressions that can never fire (`0 0 30 2 *`) and then
raises when asked for the next date, so validation computes the first firing.
"""
from __future__ import annotations

from datetime import datetime

from croniter import CroniterBadDateError, croniter
from django.utils import timezone

from veronica.plumbing.errors import VeronicaError, require_text

MAX_LEN = 120  # Member.schedule's column
FIELDS = "minute hour day month weekday"


def validate_cron(expr: object, field: str = "schedule") -> str:
    """The normalized expression (single spaces), or a VeronicaError naming the field."""
    expr = require_text(expr if expr is not None else "", field, max_len=MAX_LEN)
    parts = expr.split()
    if len(parts) != 5:
        raise VeronicaError(f"'{expr}' is not a valid cron expression: it has {len(parts)} field{'s' * (len(parts) != 1)}; "
                            f"a schedule is exactly five ({FIELDS}), e.g. '*/15 * * * *'", field=field)
    expr = " ".join(parts)
    try:
        croniter(expr, timezone.now()).get_next(datetime)
    except CroniterBadDateError:
        raise VeronicaError(f"'{expr}' is not a valid cron expression: it never fires (no date matches, "
                            "e.g. February 30th)", field=field) from None
    except (ValueError, KeyError, IndexError, OverflowError) as exc:  # croniter's parse errors are ValueErrors
        reason = str(exc).replace(f"[{expr}] ", "")
        raise VeronicaError(f"'{expr}' is not a valid cron expression ({FIELDS}): {reason}", field=field) from None
    return expr


def next_fire(expr: str, after: datetime | None = None) -> datetime | None:
    """The next firing after `after` (default now); None for a stored schedule that can never fire."""
    try:
        return croniter(expr, after or timezone.now()).get_next(datetime)
    except (CroniterBadDateError, ValueError):
        return None
