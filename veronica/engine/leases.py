"""Leases on the database's clock: the run leases the watchdog expires, and the deployment-wide
roles (the engine ticker) that one process holds at a time.

Every comparison is with `Now()` (PostgreSQL `now()`, SQLite `'now'`), never a host's clock, so two
hosts whose clocks disagree still agree on who holds what and whose lease has run out.
"""
from __future__ import annotations

from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Case, DateTimeField, DurationField, ExpressionWrapper, F, Min, Q, Value, When
from django.db.models.functions import Now

from veronica.swarm import events
from veronica.engine import failures
from veronica.models import EngineLease, Member, Phase, Run, RunOutcome, RunStatus


def db_now_plus(seconds: float):
    return ExpressionWrapper(Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField())


def expire_leases() -> list[int]:
    """Watchdog: a run lease past its time means the worker died. Release and re-wake (durably: see
    failures.owe_resume); nothing lost.
    Idle cost: one indexed-free select that matches no row (no per-member work)."""
    woken = []
    for member in Member.objects.filter(lease_expires_at__lt=Now()).exclude(lease_token=""):
        token = member.lease_token
        with transaction.atomic():
            # Re-checked in the UPDATE: a heartbeat that renewed the lease since the select wins.
            if not Member.objects.filter(pk=member.pk, lease_token=token, lease_expires_at__lt=Now()).update(
                    lease_token="", lease_expires_at=None, cancel_requested=False, wake_queued_at=None):
                continue
            Member.objects.filter(pk=member.pk, run_status=RunStatus.BUSY).update(run_status=RunStatus.IDLE, phase=Phase.READY)
            cut = list(Run.objects.filter(member=member, lease_token=token, ended_at__isnull=True).values_list("pk", "model_calls"))
            Run.objects.filter(pk__in=[pk for pk, _ in cut]).update(ended_at=Now(), outcome=RunOutcome.LEASE_EXPIRED)
            for pk, counted in cut:
                if not counted:  # killed: the counters it kept in memory for its finish died with it
                    _recount(member, pk)
            cut = [pk for pk, _ in cut]
            # The run id lets the timeline link the expiry to the run it cut off (one run per member).
            events.emit(member.space_id, "run.lease_expired", member=member, **({"run": cut[0]} if cut else {}))
            failures.owe_resume(member.pk)  # rung now, and again until a run takes the slot
        woken.append(member.pk)
    return woken


def _recount(member: Member, run_pk: int) -> None:
    """A killed run's model calls and tokens, from its `model.called` events (every metered call
    emits one, in the metering transaction, so they are exactly the calls that were metered)."""
    from veronica.models import Event

    calls = tokens = 0
    for payload in Event.objects.filter(space_id=member.space_id, member=member, kind="model.called",
                                        payload__run=run_pk).values_list("payload", flat=True):
        calls += 1
        tokens += sum(int(payload.get(key) or 0) for key in ("input", "output", "cached", "cache_write"))
    if calls:
        Run.objects.filter(pk=run_pk).update(model_calls=calls, tokens=tokens)


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
