"""Daily budgets and usage metering. Days are UTC."""
from __future__ import annotations

from datetime import date
from decimal import Decimal

from django.db import transaction
from django.db.models import Exists, F, OuterRef, Sum
from django.utils import timezone

from veronica.swarm import audit, bus, events
from veronica.plumbing.errors import Conflict, VeronicaError, check_int
from veronica.models import Member, Role, Space, UsageDay


def today() -> date:
    return timezone.now().date()


def effective_budget(member: Member) -> int:
    """Member override > 0 caps, < 0 is unlimited; otherwise the space default. 0 = unlimited."""
    override = member.budget_override
    if override is not None and override > 0:
        return override
    if override is not None and override < 0:
        return 0
    return max(member.space.member_daily_tokens, 0)


def usage_today(member: Member) -> UsageDay:
    day, _ = UsageDay.objects.get_or_create(member=member, day=today(), defaults={"space_id": member.space_id})
    return day


def tokens_today(member: Member) -> int:
    """A read that never writes a row (the roster tool lists every member on every call)."""
    day = UsageDay.objects.filter(member=member, day=today()).first()
    return day.total_tokens if day else 0


def space_today(space: Space) -> dict:
    billed = F("input_tokens") + F("output_tokens") + F("cache_read_tokens") + F("cache_write_tokens")  # as UsageDay.total_tokens
    agg = UsageDay.objects.filter(space=space, day=today()).aggregate(tokens=Sum(billed), usd=Sum("usd"))
    return {"tokens": agg["tokens"] or 0, "usd": agg["usd"] or Decimal(0)}


def is_tripped(member: Member) -> bool:
    return UsageDay.objects.filter(member=member, day=today(), tripped=True).exists()


def tripped_today() -> Exists:
    """is_tripped() as a condition on a member row (the wake checks it inside its claim)."""
    return Exists(UsageDay.objects.filter(member=OuterRef("pk"), day=today(), tripped=True))


def meter(member: Member, *, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0,
          usd: Decimal = Decimal(0), model_calls: int = 1, estimated_calls: int = 0) -> None:
    """Add one model call's usage to today's row with F() increments (no read-modify-write)."""
    increments = dict(input_tokens=F("input_tokens") + input_tokens, output_tokens=F("output_tokens") + output_tokens,
                      cache_read_tokens=F("cache_read_tokens") + cache_read, cache_write_tokens=F("cache_write_tokens") + cache_write,
                      usd=F("usd") + usd, model_calls=F("model_calls") + model_calls,
                      estimated_calls=F("estimated_calls") + estimated_calls)
    with transaction.atomic(savepoint=False):
        if not UsageDay.objects.filter(member=member, day=today()).update(**increments):
            usage_today(member)
            UsageDay.objects.filter(member=member, day=today()).update(**increments)


METER_COLUMNS = ["input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "tripped", "budget_offset"]


def meter_statement(member: Member, *, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0,
                    usd: Decimal = Decimal(0), estimated_calls: int = 0):
    """meter_returning()'s statement, compiled once, and this call's values: (compiled, values)."""
    from veronica.plumbing.returning import compiled

    def build(slot):
        qs = UsageDay.objects.filter(member_id=slot.int("member"), day=slot.date("day"))
        return qs, dict(input_tokens=F("input_tokens") + slot.int("i"), output_tokens=F("output_tokens") + slot.int("o"),
                        cache_read_tokens=F("cache_read_tokens") + slot.int("cr"),
                        cache_write_tokens=F("cache_write_tokens") + slot.int("cw"), usd=F("usd") + slot.decimal("usd"),
                        model_calls=F("model_calls") + 1, estimated_calls=F("estimated_calls") + slot.int("est"))
    values = {"member": member.pk, "day": today().isoformat(), "i": input_tokens, "o": output_tokens, "cr": cache_read,
              "cw": cache_write, "usd": usd, "est": estimated_calls}
    return compiled(("meter",), build, METER_COLUMNS), values


def metered(row) -> tuple[int, bool]:
    """(today's tokens against the member's budget, tripped) from the meter statement's row: every
    billed token, as UsageDay.total_tokens counts them, less what an owner's reset set aside."""
    return sum(row[:4]) - row[5], bool(row[4])


def meter_returning(member: Member, *, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0,
                    usd: Decimal = Decimal(0), estimated_calls: int = 0) -> tuple[int, bool]:
    """meter() in one statement on the hot path: the increments, and today's tokens (cache reads and
    writes included) and tripped flag read back (UPDATE ... RETURNING). The day's first call creates the row first.
    On PostgreSQL a run's fence usually carries this statement (veronica.engine.slot: meter_in_fence)."""
    from django.db import connections

    stmt, values = meter_statement(member, input_tokens=input_tokens, output_tokens=output_tokens, cache_read=cache_read,
                                   cache_write=cache_write, usd=usd, estimated_calls=estimated_calls)
    from veronica.plumbing.returning import bound

    for _ in range(2):
        with connections[UsageDay.objects.db].cursor() as cur:
            cur.execute(stmt[0], bound(stmt, values))
            row = cur.fetchone()
        if row is not None:
            return metered(row)
        usage_today(member)
    raise RuntimeError(f"no usage row for {member.name} today")


TRIP_HELP = ("To let it run again today, raise its budget or the space's ceiling, or reset its day "
             "(the member's page, Budget; PUT /api/spaces/{slug}/members/{name}/budget/ or "
             "POST /api/spaces/{slug}/members/{name}/budget/reset/).")


def over_budget(member: Member, used: int | None = None) -> str | None:
    """Why the member may not run now (its own budget, or its space's ceilings), or None. Writes nothing.
    `used`: its tokens against its budget today when the caller has just read them back."""
    if used is None:
        day = UsageDay.objects.filter(member=member, day=today()).first()
        used = day.total_tokens - day.budget_offset if day else 0
    cap = effective_budget(member)
    if cap and used >= cap:
        return f"{member.name} used {used} tokens today; its daily budget is {cap}"
    space = member.space
    if space.daily_token_ceiling or space.daily_usd_ceiling:
        totals = space_today(space)
        if space.daily_token_ceiling and totals["tokens"] >= space.daily_token_ceiling:
            return f"space {space.slug} used {totals['tokens']} tokens today; its ceiling is {space.daily_token_ceiling}"
        if space.daily_usd_ceiling and totals["usd"] >= space.daily_usd_ceiling:
            return f"space {space.slug} spent ${totals['usd']:.4f} today; its ceiling is ${space.daily_usd_ceiling}"
    return None


def check_breaker(member: Member, used: int | None = None) -> str | None:
    """Trip the member's breaker when its day or its space's day is over budget. Returns why, once.
    `used`: today's tokens (against its budget) when the caller has just read them back."""
    if used is None:
        usage_today(member)  # the row the trip is written on
    reason = over_budget(member, used)
    if reason is None:
        return None
    space = member.space
    with transaction.atomic():
        if UsageDay.objects.filter(member=member, day=today(), tripped=False).update(tripped=True):
            events.emit(member.space_id, "ops.alert", member=member, subject="budget tripped", body=reason)
            # the seed's notifyOps: the leader re-plans around the tripped member, the operator may raise the cap
            notice = f"{reason}. No more runs today. {TRIP_HELP.format(slug=space.slug, name=member.name)}"
            subject = f"Budget tripped: {member.name}"
            bus.send(space, bus.SYSTEM, "operator", notice, subject=subject)
            leader = bus.live_members(space).filter(role=Role.LEADER).exclude(pk=member.pk).first()
            if leader is not None:
                bus.send(space, bus.SYSTEM, leader.name, notice, subject=subject)
            return reason
    return None


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


def budget_state(member: Member) -> dict:
    """What the member page and the API show: today's use, the cap, whether it is tripped and why."""
    day = UsageDay.objects.filter(member=member, day=today()).first()
    used = day.total_tokens if day else 0
    offset = day.budget_offset if day else 0
    return {"member": member.name, "budget_override": member.budget_override, "space_default": member.space.member_daily_tokens,
            "effective_budget": effective_budget(member), "tokens_today": used, "counted_since_reset": used - offset,
            "tripped": bool(day and day.tripped), "blocked_by": over_budget(member, used - offset),
            "space": {f: str(getattr(member.space, f)) for f in SPACE_LIMITS}}
