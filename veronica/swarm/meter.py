"""A member's day of usage (UTC days): the meter every model call writes, the budget it is held to and
the breaker that trips when the day is spent. Below both the agent's metering (veronica.agent.metering)
and the engine's budget verbs (veronica.engine.budget, which lift a trip): moved here so the agent
never imports the engine for it."""
from __future__ import annotations

from datetime import date
from decimal import Decimal

from django.db import transaction
from django.db.models import Exists, F, OuterRef, Sum
from django.utils import timezone

from veronica.swarm import bus, events
from veronica.models import Member, Role, Space, UsageDay


UNREAD = object()  # a usage row the caller did not pass (None is a value: no row today)


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


def open_day(member: Member) -> None:
    """Make sure today's usage row exists, in one statement that never fails on a row made meanwhile
    (INSERT ... ON CONFLICT DO NOTHING): the day's first metered call of a member makes it this way
    instead of get_or_create's read, savepoint and insert."""
    UsageDay.objects.bulk_create([UsageDay(member=member, day=today(), space_id=member.space_id)], ignore_conflicts=True)


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
            open_day(member)
            UsageDay.objects.filter(member=member, day=today()).update(**increments)


METER_COLUMNS = ["input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "tripped", "budget_offset"]


def meter_statement(member: Member, *, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0,
                    usd: Decimal = Decimal(0), estimated_calls: int = 0):
    """meter_returning()'s statement, written once per backend, and this call's values: (compiled, values)."""
    from django.db import connections

    conn = connections[UsageDay.objects.db]
    compiled = _upsert.get(conn.vendor)
    if compiled is None:
        compiled = _upsert[conn.vendor] = _upsert_sql(conn)
    values = {"space": member.space_id, "member": member.pk, "day": today().isoformat(), "i": input_tokens, "o": output_tokens,
              "cr": cache_read, "cw": cache_write, "usd": usd, "calls": 1, "est": estimated_calls}
    return compiled, values


# The meter is one upsert (INSERT ... ON CONFLICT DO UPDATE): the day's first call of a member makes
# its row in the same statement that adds to it. (It was an UPDATE that matched nothing, an INSERT ...
# ON CONFLICT DO NOTHING and the UPDATE again: three round trips on every member's first call of a day,
# which is every call of a fleet's first runs.) GATE marks where a caller may add a condition on the
# row's write (veronica.plumbing.returning.update_then: only if the fence's lease held); both the
# insert and the update then depend on it, since it filters the one row the INSERT's SELECT makes.
_METERED = {"input_tokens": "i", "output_tokens": "o", "cache_read_tokens": "cr", "cache_write_tokens": "cw", "usd": "usd",
            "model_calls": "calls", "estimated_calls": "est"}
_upsert: dict[str, tuple[str, list, dict[int, str]]] = {}


def _upsert_sql(conn) -> tuple[str, list, dict[int, str]]:
    from veronica.plumbing.returning import GATE

    qn, table = conn.ops.quote_name, conn.ops.quote_name(UsageDay._meta.db_table)
    bound = {"space_id": "space", "member_id": "member", "day": "day", **_METERED}
    columns, values, params, bind = [], [], [], {}
    for f in UsageDay._meta.concrete_fields:
        if f.primary_key:
            continue
        columns.append(qn(f.column))
        values.append(f"%s::{f.cast_db_type(conn)}" if conn.vendor == "postgresql" else "%s")  # INSERT ... SELECT: typed
        if f.column in bound:
            bind[len(params)] = bound[f.column]
            params.append(None)
        else:
            params.append(f.get_db_prep_save(f.get_default(), conn))
    adds = ", ".join(f"{qn(c)} = {table}.{qn(c)} + EXCLUDED.{qn(c)}" for c in _METERED)
    sql = (f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(values)} WHERE TRUE{GATE} "
           f"ON CONFLICT ({qn('member_id')}, {qn('day')}) DO UPDATE SET {adds} "
           f"RETURNING {', '.join(qn(c) for c in METER_COLUMNS)}")
    return sql, params, bind


def metered(row) -> tuple[int, bool]:
    """(today's tokens against the member's budget, tripped) from the meter statement's row: every
    billed token, as UsageDay.total_tokens counts them, less what an owner's reset set aside."""
    return sum(row[:4]) - row[5], bool(row[4])


def meter_returning(member: Member, *, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0,
                    usd: Decimal = Decimal(0), estimated_calls: int = 0) -> tuple[int, bool]:
    """meter() in one statement on the hot path: the increments, and today's tokens (cache reads and
    writes included) and tripped flag read back (one upsert ... RETURNING, the day's first call included).
    On PostgreSQL a run's fence usually carries this statement (veronica.engine.slot: meter_in_fence)."""
    from django.db import connections

    from veronica.plumbing.returning import GATE, bound

    stmt, values = meter_statement(member, input_tokens=input_tokens, output_tokens=output_tokens, cache_read=cache_read,
                                   cache_write=cache_write, usd=usd, estimated_calls=estimated_calls)
    with connections[UsageDay.objects.db].cursor() as cur:
        cur.execute(stmt[0].replace(GATE, ""), bound(stmt, values))
        return metered(cur.fetchone())


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
