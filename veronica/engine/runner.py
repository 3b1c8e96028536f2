"""The wake task and the run slot.

A wake claims the member with one conditional UPDATE (idle + active + no lease -> busy + lease).
No claim, no run: the run in flight drains the mailbox and re-checks for unread work when it ends.
The lease is renewed between steps; a worker that dies leaves it to expire and the tick re-wakes.
"""
from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from veronica import events, tracing
from veronica.engine import budget
from veronica.engine.wakes import enqueue_wake
from veronica.models import Member, Membership, Message, Phase, Run, RunOutcome, RunStatus, Wake

log = logging.getLogger(__name__)


class Cancelled(Exception):
    """Suspend / remove asked the run to stop, or its lease was lost."""


# Mail that arrived during these runs was coalesced into them: wake again to drain it. A run that
# ended waiting for an operator, paused at its iteration limit, errored or hit its budget must not
# loop on its own mail (the decision, new mail or the tick's sweep wakes it).
REWAKE_AFTER = {RunOutcome.DONE, RunOutcome.ABORTED}


def lease_delta() -> timedelta:
    return timedelta(seconds=settings.RUN_LEASE_SECONDS)


class RunContext:
    """What a run needs from the engine: cancellation, lease heartbeat and phase reporting."""

    HEARTBEAT_EVERY = 1.0

    def __init__(self, member: Member, token: str, run: Run, source: str) -> None:
        self.member, self.token, self.run, self.source = member, token, run, source
        self._last_beat = 0.0

    def check(self) -> None:
        """Between every model and tool step: renew the lease unless a cancel was asked for."""
        alive = Member.objects.filter(pk=self.member.pk, lease_token=self.token, cancel_requested=False).update(
            lease_expires_at=timezone.now() + lease_delta())
        self._last_beat = time.monotonic()
        if not alive:
            raise Cancelled(f"run of {self.member.name} cancelled")

    def should_stop(self) -> bool:
        """Polled while a model call is in flight; rate-limited to one query a second."""
        if time.monotonic() - self._last_beat < self.HEARTBEAT_EVERY:
            return False
        try:
            self.check()
        except Cancelled:
            return True
        return False

    def phase(self, phase: str, tool: str = "") -> None:
        set_phase(self.member, phase, tool)


def set_phase(member: Member, phase: str, tool: str = "") -> None:
    """Phases are derived from the member's own events: the row follows the event we emit."""
    if member.phase == phase and member.phase_tool == tool:
        return
    now = timezone.now()
    with transaction.atomic(savepoint=False):
        Member.objects.filter(pk=member.pk).update(phase=phase, phase_tool=tool, phase_since=now)
        events.emit(member.space_id, "member.phase", member=member, phase=phase, tool=tool)
    member.phase, member.phase_tool, member.phase_since = phase, tool, now


def claim(member_id: int) -> str | None:
    token = uuid.uuid4().hex
    claimed = Member.objects.filter(
        pk=member_id, run_status=RunStatus.IDLE, membership=Membership.ACTIVE, removed_at__isnull=True, lease_token="",
    ).update(run_status=RunStatus.BUSY, lease_token=token, lease_expires_at=timezone.now() + lease_delta(), cancel_requested=False)
    return token if claimed else None


def release(member: Member, token: str) -> bool:
    """Give the slot back. A suspended member stays suspended; a lost lease changes nothing."""
    Member.objects.filter(pk=member.pk, lease_token=token, run_status=RunStatus.BUSY).update(run_status=RunStatus.IDLE)
    return bool(Member.objects.filter(pk=member.pk, lease_token=token).update(lease_token="", lease_expires_at=None, cancel_requested=False))


def has_unread(member_id: int) -> bool:
    return Message.objects.filter(recipient_id=member_id, read_at__isnull=True).exists()


def wake(member_id: int, source: str) -> str:
    """The django-q2 task. Returns a short outcome string (kept in q2's result for debugging)."""
    member = Member.objects.filter(pk=member_id).select_related("space").first()
    if member is None:
        return "gone"
    received = Wake.objects.create(member=member, source=source)
    if not member.is_active or member.run_status == RunStatus.SUSPENDED:
        return "not-active"
    if budget.is_tripped(member):
        return "budget-tripped"
    token = claim(member_id)
    if token is None:
        return "coalesced"
    Wake.objects.filter(pk=received.pk).update(claimed=True)  # the metrics split wakes by claimed / coalesced
    member.refresh_from_db()
    run = Run.objects.create(member=member, source=source, lease_token=token, started_at=timezone.now())
    events.emit(member.space_id, "run.started", member=member, run=run.pk, source=source)
    traced = tracing.start_run(member, run, source)  # iss14: the run's root span (no-op when tracing is off)
    outcome, error = RunOutcome.DONE, ""
    try:
        from veronica.agent.loop import run_member

        outcome = run_member(member, RunContext(member, token, run, source))
    except Cancelled:
        outcome = RunOutcome.ABORTED
    except Exception as exc:  # one member's crash never touches another's run
        log.exception("run of %s crashed", member.name)
        outcome, error = RunOutcome.ERROR, f"{type(exc).__name__}: {exc}"
    finish(member, token, run, outcome, error)
    tracing.end_run(traced, outcome, error)  # iss14
    return outcome


def finish(member: Member, token: str, run: Run, outcome: str, error: str = "") -> None:
    Run.objects.filter(pk=run.pk).update(ended_at=timezone.now(), outcome=outcome, error=error[:2000])
    if outcome == RunOutcome.ERROR:
        set_phase(member, Phase.ERROR)
    elif outcome == RunOutcome.ABORTED:
        set_phase(member, Phase.READY)
    events.emit(member.space_id, "run.ended", member=member, run=run.pk, outcome=outcome, error=error[:300])
    if not release(member, token):
        return  # the watchdog already took the lease back and re-woke the member
    if outcome not in REWAKE_AFTER:
        return  # waiting on a person, paused or over budget: new mail or the decision wakes it
    fresh = Member.objects.filter(pk=member.pk).first()
    if fresh and fresh.is_active and fresh.run_status == RunStatus.IDLE and has_unread(member.pk):
        enqueue_wake(member.pk, "message")


def expire_leases() -> list[int]:
    """Watchdog: a lease past its time means the worker died. Release and re-wake; nothing lost."""
    now = timezone.now()
    woken = []
    for member in Member.objects.filter(lease_expires_at__lt=now).exclude(lease_token=""):
        token = member.lease_token
        with transaction.atomic():
            if not Member.objects.filter(pk=member.pk, lease_token=token).update(lease_token="", lease_expires_at=None, cancel_requested=False):
                continue
            Member.objects.filter(pk=member.pk, run_status=RunStatus.BUSY).update(run_status=RunStatus.IDLE, phase=Phase.READY)
            Run.objects.filter(member=member, lease_token=token, ended_at__isnull=True).update(ended_at=now, outcome=RunOutcome.LEASE_EXPIRED)
            events.emit(member.space_id, "run.lease_expired", member=member)
            transaction.on_commit(lambda pk=member.pk: enqueue_wake(pk, "resume"))
        woken.append(member.pk)
    return woken
