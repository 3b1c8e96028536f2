"""Leases on the database's clock: the run leases the watchdog expires, and the deployment-wide
roles (the engine ticker) that one process holds at a time.

Every comparison is with `Now()` (PostgreSQL `now()`, SQLite `'now'`), never a host's clock, so two
hosts whose clocks disagree still agree on who holds what and whose lease has run out.
"""
from __future__ import annotations

from datetime import timedelta

from django.db import IntegrityError, connections, transaction
from django.db.models import Case, DateTimeField, DurationField, ExpressionWrapper, F, Min, Q, Value, When
from django.db.models.functions import Now

from veronica.swarm import events
from veronica.engine import failures
from veronica.models import EngineLease, Member, Phase, Run, RunOutcome, RunStatus


def db_now_plus(seconds: float):
    return ExpressionWrapper(Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField())


# Leases expired per transaction. A killed host leaves hundreds at once (bench/fleet.py: 256 of 500),
# and a transaction of its own for each (about ten round trips) put seconds between the first member
# re-woken and the last; a batch takes them in a handful of statements. Bounded, so the member rows
# it locks are held for milliseconds; as large as a worker's run pool (bench/fleet.py's 256), so a
# killed worker's runs are one batch: three batches of 100 took 0.3 s before its resumes could start.
EXPIRE_BATCH = 256


def expire_leases(*, ring_now: bool = True) -> list[int]:
    """Watchdog: a run lease past its time means the worker died. Release and re-wake (durably: see
    failures.owe_resume); nothing lost. ring_now=False: the caller starts the returned members' resumes
    itself (failures.owe_resume).
    Idle cost: one indexed select that matches no row (no per-member work)."""
    woken: list[int] = []
    while True:
        batch, looked = _expire_batch(ring_now)
        woken += batch
        if looked < EXPIRE_BATCH:
            return woken


def _expire_batch(ring_now: bool = True) -> tuple[list[int], int]:
    """One transaction: up to EXPIRE_BATCH run-out leases released, their runs ended and their members
    owed a resume. Returns (the members expired, how many the select found)."""
    run_out = Member.objects.filter(lease_expires_at__lt=Now()).exclude(lease_token="")
    if not run_out.exists():  # the idle tick's one statement: no transaction opened for nothing
        return [], 0
    with events.transaction_batch():  # the expiries' events: one statement per space, with the commit
        # Rows a live fence or the heartbeat holds are skipped, not waited on: the next pass sees them.
        found = list(run_out.select_for_update(skip_locked=True).order_by("pk")[:EXPIRE_BATCH])
        released = dict(lease_token="", lease_expires_at=None, cancel_requested=False, wake_queued_at=None)
        if connections[Member.objects.db].vendor == "postgresql":
            # One UPDATE for the batch: the select locked its rows until the commit, so no heartbeat renews
            # one meanwhile (it waits, then finds the lease gone) and a lease run out at the select is run
            # out still. An UPDATE per member was a round trip each: 256 after a killed worker's reap.
            Member.objects.filter(pk__in=[m.pk for m in found]).update(**released)
            expired = found
        else:
            expired = []
            for member in found:
                # Re-checked in the UPDATE: a heartbeat that renewed the lease since the select wins
                # (SQLite has no row locks to keep it out).
                if Member.objects.filter(pk=member.pk, lease_token=member.lease_token, lease_expires_at__lt=Now()).update(**released):
                    expired.append(member)
        if not expired:
            return [], len(found)
        ids = [m.pk for m in expired]
        Member.objects.filter(pk__in=ids, run_status=RunStatus.BUSY).update(run_status=RunStatus.IDLE, phase=Phase.READY)
        tokens = {m.pk: m.lease_token for m in expired}
        cut = [(pk, member_id, counted) for pk, member_id, token, counted in Run.objects.filter(
               member_id__in=ids, lease_token__in=list(tokens.values()), ended_at__isnull=True).values_list(
               "pk", "member_id", "lease_token", "model_calls") if tokens[member_id] == token]
        Run.objects.filter(pk__in=[pk for pk, _, _ in cut]).update(ended_at=Now(), outcome=RunOutcome.LEASE_EXPIRED)
        # killed: the counters it kept in memory for its finish died with it
        _recount({pk: member_id for pk, member_id, counted in cut if not counted})
        run_of = {member_id: pk for pk, member_id, _ in cut}
        for member in expired:
            # The run id lets the timeline link the expiry to the run it cut off (one run per member).
            run = run_of.get(member.pk)
            events.emit(member.space_id, "run.lease_expired", member=member, **({"run": run} if run else {}))
        failures.owe_resume(ids, ring_now=ring_now)  # rung now (or started by the caller), and again until a run takes the slot
    return ids, len(found)


def _recount(runs: dict[int, int]) -> None:
    """Killed runs' model calls and tokens (run id -> member id), from their `model.called` events
    (every metered call emits one, in the metering transaction, so they are exactly the calls that
    were metered). One read and one write for all of them."""
    from veronica.models import Event

    if not runs:
        return
    counts: dict[int, list[int]] = {}
    for payload in Event.objects.filter(member_id__in=set(runs.values()), kind="model.called",
                                        payload__run__in=list(runs)).values_list("payload", flat=True):
        count = counts.setdefault(payload.get("run"), [0, 0])
        count[0] += 1
        count[1] += sum(int(payload.get(key) or 0) for key in ("input", "output", "cached", "cache_write"))
    counted = {pk: c for pk, c in counts.items() if pk in runs}
    if not counted:
        return
    conn = connections[Run.objects.db]
    if conn.vendor == "postgresql":
        # The values as arrays: the ORM's CASE with a WHEN per run cost ~40 ms of compiling per 100 runs,
        # on the path from a killed worker's reap to its members' resumes (bench/fleet.py).
        with conn.cursor() as cursor:
            cursor.execute(f"UPDATE {Run._meta.db_table} AS r SET model_calls = c.calls, tokens = c.tokens "
                           "FROM unnest(%s::bigint[], %s::int[], %s::int[]) AS c(id, calls, tokens) WHERE r.id = c.id",
                           [list(counted), [c[0] for c in counted.values()], [c[1] for c in counted.values()]])
        return
    Run.objects.filter(pk__in=list(counted)).update(
        model_calls=Case(*[When(pk=pk, then=Value(c[0])) for pk, c in counted.items()], default=F("model_calls")),
        tokens=Case(*[When(pk=pk, then=Value(c[1])) for pk, c in counted.items()], default=F("tokens")))


def next_expiry():
    """When the soonest run lease runs out (None when no run holds one): the ticker wakes up then,
    so a dead worker's member is released at its lease's end, not up to a tick period later."""
    return Member.objects.exclude(lease_token="").aggregate(soonest=Min("lease_expires_at"))["soonest"]


def seconds_to_next_expiry() -> float | None:
    """The same soonest lease end as time left on the database's clock, in one statement (None when
    no run holds a lease): what a follower ticker needs to be awake when it runs out."""
    left = Member.objects.exclude(lease_token="").aggregate(
        left=Min(ExpressionWrapper(F("lease_expires_at") - Now(), output_field=DurationField())))["left"]
    return None if left is None else left.total_seconds()


def hold_role(name: str, holder: str, ttl: float) -> bool:
    """Take or renew the role `name` for `holder` for `ttl` seconds; True while we hold it.

    One conditional UPDATE per call (held by us, or free, or expired): the database decides, so
    at most one holder at a time across any number of processes and hosts.
    """
    held = EngineLease.objects.filter(Q(holder=holder) | Q(expires_at__isnull=True) | Q(expires_at__lt=Now()), name=name).update(
        holder=holder, expires_at=db_now_plus(ttl),
        acquired_at=Case(When(holder=holder, expires_at__isnull=False, then=F("acquired_at")), default=Now()))
    if held:
        return True
    if EngineLease.objects.filter(name=name).exists():
        return False  # held by a live peer: a follower's beat costs these two statements
    try:
        with transaction.atomic():
            EngineLease.objects.create(name=name)
    except IntegrityError:
        pass  # another process created it at the same moment; we compete for it below
    return hold_role(name, holder, ttl)


def release_role(name: str, holder: str) -> None:
    """Hand the role back at a clean stop, so a follower takes over at its next beat."""
    EngineLease.objects.filter(name=name, holder=holder).update(expires_at=None)
