"""The failure model (DESIGN §3): what happens to a member whose run failed.

transient (429 / 5xx / timeouts / an empty reply, already retried inside the call, or a crash): the
    member is re-woken after an exponential backoff, until a run succeeds.
permanent (auth, not found, bad request, context overflow, missing key): the member is parked in
    phase `error` with the reason and one ops alert; it runs again when an operator resumes it or
    its config (model, permission mode) changes.
Either way the work in progress stays where it was: unread mail stays unread, an unanswered brief
or tool result stays at the end of the transcript, and the next run picks it up from there.
"""
from __future__ import annotations

import random
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Concat, Now

from veronica.swarm import audit, bus, events
from veronica.swarm.meter import tripped_today
from veronica.engine.wakes import enqueue_wake
from veronica.models import Member, Membership, RunStatus
from veronica.plumbing.secret_store import mask

# The config a member was parked under; a change to either field un-parks it.
CONFIG = Concat(F("model"), Value("|"), F("permission_mode"))
PARKED = Q(parked_config=CONFIG)
# Backing off is a failure streak's retry time; a resume owed after a lost lease (owe_resume, no
# failure) rings on the same clock but lets any wake take the slot: whichever comes first runs.
IN_BACKOFF = Q(retry_at__gt=Now(), failures__gt=0)
# The claim's gate for new work: not parked under its current config, not waiting out a backoff.
RUNNABLE = ~PARKED & ~IN_BACKOFF


def ring_again_seconds() -> float:
    """How long a due retry's doorbell may go unanswered before it is rung again (every tick). Brokers
    lose wakes (a killed cluster takes the ones its pusher had fetched with it) and a wake fetched by a
    cluster whose workers are all busy waits behind their runs: a fresh ring goes to whichever cluster
    has a free worker. A delivered one makes the member busy, which stops the ringing."""
    return max(2.0, float(settings.ENGINE_TICK_SECONDS))


def owe_resume(member_ids: list[int], *, ring_now: bool = True) -> None:
    """Runs cut off by their leases (their worker died) owe their members a resume: a retry due now,
    rung at once and again every ring_again_seconds() until a run takes the slot (a lost doorbell
    costs seconds, not the work). The next run's finish settles it like any retry. ring_now=False: the
    caller starts the resumes itself (a worker's reap, veronica.engine.runner.resume_here); the owed
    retry still rings any that no run took in time."""
    Member.objects.filter(pk__in=member_ids).update(retry_at=Now() + timedelta(seconds=ring_again_seconds()))
    if not ring_now:
        return

    def ring() -> None:
        for member_id in member_ids:
            enqueue_wake(member_id, "resume")
    transaction.on_commit(ring)


def backoff_seconds(failures: int) -> float:
    """Exponential with jitter (80-100 %), so members that failed together do not retry together."""
    base = settings.RUN_RETRY_BASE_SECONDS * 2 ** max(failures - 1, 0)
    return min(base, settings.RUN_RETRY_MAX_SECONDS) * random.uniform(0.8, 1.0)


RETRY_AFTER_CAP = 3600.0  # a vendor's Retry-After is honoured up to an hour


def record(member: Member, reason: str, *, permanent: bool, retry_after: float | None = None) -> None:
    reason = mask(reason, member.space_id)  # provider errors may quote a key or a header
    """Inside the failed run's fenced finish: count the failure, then back off or park. A vendor's
    Retry-After longer than the backoff is waited out (calling again sooner only meets the limit)."""
    count = member.failures + 1
    if permanent:
        Member.objects.filter(pk=member.pk).update(failures=count, retry_at=None, error_reason=reason[:2000], parked_config=CONFIG)
        body = f"{member.name} is parked after a permanent error: {reason[:500]}. Fix the cause, then resume it."
        events.emit(member.space_id, "ops.alert", member=member, subject="member parked", body=body)
        bus.send(member.space, bus.SYSTEM, bus.OPERATOR, body, subject=f"Parked: {member.name}")
        events.emit(member.space_id, "member.parked", member=member, reason=reason[:300])
        return
    delay = backoff_seconds(count)
    if retry_after is not None and retry_after > delay:
        delay = min(retry_after, RETRY_AFTER_CAP)
    Member.objects.filter(pk=member.pk).update(failures=count, retry_at=Now() + timedelta(seconds=delay),
                                               error_reason=f"{reason[:1900]} (failure {count}; retrying in {delay:.0f} s)")
    events.emit(member.space_id, "member.retry_scheduled", member=member, failures=count, delay=round(delay, 1), reason=reason[:300])


def clear(member: Member) -> None:
    """A run that got through: the failure streak is over."""
    if member.failures or member.retry_at or member.error_reason or member.parked_config:
        Member.objects.filter(pk=member.pk).update(failures=0, retry_at=None, error_reason="", parked_config="")
        member.failures, member.retry_at, member.error_reason, member.parked_config = 0, None, "", ""


@audit.verb("member.unpark", watch="member")
def unpark(member: Member, *, actor: str) -> bool:
    """The operator's resume: forget the failure streak and run again now."""
    with transaction.atomic():
        changed = Member.objects.filter(pk=member.pk).filter(Q(parked_config__gt="") | Q(retry_at__isnull=False)).update(
            failures=0, retry_at=None, error_reason="", parked_config="")
        if changed:
            events.emit(member.space_id, "member.unparked", member=member, actor=actor)
    return bool(changed)


def due_retries() -> list[int]:
    """The tick's duty: wake members whose backoff ran out, or whose config changed while parked.
    One select when idle (nobody failing costs nothing per member).

    The retry time moves on by ring_again_seconds() (it is not cleared) when we ring, so a lost wake
    is rung again and a delivered one is settled by the run's own finish (cleared on success, backed
    off on failure). A member whose budget tripped is not rung (its wake would refuse to run)."""
    idle = Member.objects.filter(run_status=RunStatus.IDLE, membership=Membership.ACTIVE, removed_at__isnull=True, lease_token="")
    idle = idle.exclude(tripped_today())
    due = idle.filter(Q(retry_at__lte=Now()) | (Q(parked_config__gt="") & ~PARKED))
    woken = []
    for member in due.annotate(config=CONFIG):
        if member.parked_config and member.parked_config != member.config:
            with transaction.atomic():
                if not Member.objects.filter(pk=member.pk, parked_config=member.parked_config).update(parked_config="", failures=0):
                    continue
                events.emit(member.space_id, "member.unparked", member=member, actor="config change")
                transaction.on_commit(lambda pk=member.pk: enqueue_wake(pk, "resume"))
        elif not Member.objects.filter(pk=member.pk, retry_at=member.retry_at).update(
                retry_at=Now() + timedelta(seconds=ring_again_seconds())):
            continue
        else:
            enqueue_wake(member.pk, "resume")
        woken.append(member.pk)
    return woken
