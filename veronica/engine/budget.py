"""Daily budgets: an owner sets them, raises them or resets a member's day, and a tripped day reopens.
Days are UTC. The meter and the breaker they hold members to sit below, in veronica.swarm.meter
(re-exported here: the doors and the engine read them as budget.*)."""
from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from veronica.swarm import audit, events
from veronica.swarm.meter import (  # noqa: F401 (re-exported: the meter moved down below the agent)
    METER_COLUMNS,
    TRIP_HELP,
    UNREAD,
    check_breaker,
    effective_budget,
    is_tripped,
    meter,
    meter_returning,
    meter_statement,
    metered,
    over_budget,
    space_today,
    today,
    tokens_today,
    tripped_today,
    usage_today,
)
from veronica.plumbing.errors import Conflict, VeronicaError, check_int
from veronica.models import Member, Space, UsageDay


# --- reopening the day (issue 22.6): a raised budget or ceiling, or an owner's reset ------------------

@audit.verb("member.budget_reopen")
def reopen(member: Member, *, actor: str, why: str) -> bool:
    """Lift today's trip; the member is woken for the work it has waiting. True when it was tripped."""
    from veronica.engine.wakes import wake_on_commit

    with transaction.atomic():
        if not UsageDay.objects.filter(member=member, day=today(), tripped=True).update(tripped=False):
            return False
        events.emit(member.space_id, "budget.reopened", member=member, actor=actor, reason=why)
        wake_on_commit([member.pk], "resume")  # as resume(): never suppressed; a run with nothing to do exits
    return True


@audit.verb("space.budget_reopen", after=lambda a, names: {"reopened": names})
def reopen_allowed(space: Space, *, actor: str, why: str) -> list[str]:
    """Reopen every member tripped today that its budget and its space's ceilings now allow."""
    tripped = Member.objects.filter(space=space, removed_at__isnull=True, usage_days__day=today(), usage_days__tripped=True)
    return [m.name for m in tripped.select_related("space") if over_budget(m) is None and reopen(m, actor=actor, why=why)]


@audit.verb("member.budget_set", watch="member")
def set_member_budget(member: Member, value: object, *, actor: str) -> Member:
    """The member's override (None: the space default; < 0: unlimited). A raise reopens its day."""
    if value is not None:
        check_int(value, "budget_override")
    with transaction.atomic():
        Member.objects.filter(pk=member.pk).update(budget_override=value)
        events.emit(member.space_id, "member.budget_set", member=member, actor=actor, budget_override=value)
        member.refresh_from_db()
        if is_tripped(member) and over_budget(member) is None:
            reopen(member, actor=actor, why=f"budget set to {value if value is not None else 'the space default'}")
    return member


SPACE_LIMITS = ("member_daily_tokens", "daily_token_ceiling", "daily_usd_ceiling")


def _limit(field: str, value: object):
    if field != "daily_usd_ceiling":
        return check_int(value, field, minimum=0)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise VeronicaError(f"{field} must be a number of dollars (0: no ceiling)", field=field)
    try:
        usd = Decimal(str(value))
    except ArithmeticError:
        raise VeronicaError(f"{field} must be a number of dollars (0: no ceiling)", field=field) from None
    if not usd.is_finite() or usd < 0 or usd >= Decimal(10) ** 6:
        raise VeronicaError(f"{field} is {value}; it must be from 0 to 999999.9999", field=field)
    return usd.quantize(Decimal("0.0001"))


@audit.verb("space.limits_set", watch="space")
def set_space_limits(space: Space, limits: dict, *, actor: str) -> list[str]:
    """Set any of the space's default member budget and daily ceilings (0: none); every member the new
    limits allow is reopened. Returns the names reopened."""
    unknown = sorted(set(limits) - set(SPACE_LIMITS))
    if unknown:
        raise VeronicaError(f"unknown field {unknown[0]}; the fields are {', '.join(SPACE_LIMITS)}", field=unknown[0])
    values = {field: _limit(field, value) for field, value in limits.items()}
    with transaction.atomic():
        Space.objects.filter(pk=space.pk).update(**values)
        events.emit(space.pk, "space.budget_set", actor=actor, **{k: str(v) for k, v in values.items()})
        space.refresh_from_db()
        return reopen_allowed(space, actor=actor, why="the space's budget was changed")


@audit.verb("member.budget_reset_day")
def reset_day(member: Member, *, actor: str) -> Member:
    """An owner's reset: the member's own budget counts again from now (the tokens stay billed), and
    its day reopens. A space ceiling cannot be reset for one member: raise it instead."""
    with transaction.atomic():
        day = usage_today(member)
        UsageDay.objects.filter(pk=day.pk).update(budget_offset=day.total_tokens)
        space_reason = over_budget(member, 0)
        if space_reason is not None:
            raise Conflict(f"{space_reason}: raise the space's ceiling to let {member.name} run today", field="budget")
        events.emit(member.space_id, "budget.reset", member=member, actor=actor, offset=day.total_tokens)
        reopen(member, actor=actor, why="the owner reset its day")
    member.refresh_from_db()
    return member


def budget_state(member: Member, day: UsageDay | None = UNREAD) -> dict:
    """What the member page and the API show: today's use, the cap, whether it is tripped and why.
    day: today's usage row (or None) when the caller has read it already (the member page's header shows it too)."""
    if day is UNREAD:
        day = UsageDay.objects.filter(member=member, day=today()).first()
    used = day.total_tokens if day else 0
    offset = day.budget_offset if day else 0
    return {"member": member.name, "budget_override": member.budget_override, "space_default": member.space.member_daily_tokens,
            "effective_budget": effective_budget(member), "tokens_today": used, "counted_since_reset": used - offset,
            "tripped": bool(day and day.tripped), "blocked_by": over_budget(member, used - offset),
            "space": {f: str(getattr(member.space, f)) for f in SPACE_LIMITS}}
