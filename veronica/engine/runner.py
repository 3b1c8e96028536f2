"""The wake task: claim the slot, run the agent, finish under the lease.

A wake claims the member with one conditional UPDATE (veronica.engine.slot). No claim, no run: the
run in flight drains the mailbox and re-checks for unread work when it ends; a parked member or one
waiting out a backoff is not claimed at all. The engine calls the agent runtime (never the reverse):
the run sees the slot only through the RunContext protocol of veronica.agent.runctx.
"""
from __future__ import annotations

import logging

from veronica import tracing
from veronica.agent.providers.base import ProviderError
from veronica.agent.runctx import Cancelled, LeaseLost
from veronica.engine import budget, failures, slot
from veronica.engine.slot import has_unread  # noqa: F401  (drive and the tests read it here)
from veronica.models import Member, RunOutcome, RunStatus, Wake

log = logging.getLogger(__name__)

__all__ = ["Cancelled", "LeaseLost", "has_unread", "wake"]


def describe(exc: ProviderError) -> str:
    parts = [str(exc)]
    if exc.status:
        parts.append(f"HTTP {exc.status}")
    if exc.request_id:
        parts.append(f"request {exc.request_id}")
    return "; ".join(parts)


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
    lease = slot.claim(member, source)
    if lease is None:
        return failures.why_not_claimed(member_id)
    Wake.objects.filter(pk=received.pk).update(claimed=True)  # the metrics split wakes by claimed / coalesced
    traced = tracing.start_run(lease.member, lease.run, source)  # the run's root span (a no-op when tracing is off)
    from veronica.agent.loop import run_member

    outcome, error, permanent = RunOutcome.DONE, "", False
    try:
        outcome = run_member(lease.member, lease)
    except LeaseLost:
        log.warning("run of %s lost its lease; it stops and writes nothing", member.name)
        tracing.end_run(traced, "lease-lost")
        return "lease-lost"
    except Cancelled:
        outcome = RunOutcome.ABORTED
    except ProviderError as exc:
        log.warning("run of %s failed: %s (permanent=%s)", member.name, exc, exc.permanent)
        outcome, error, permanent = RunOutcome.ERROR, describe(exc), exc.permanent
    except Exception as exc:  # one member's crash never touches another's run; retried with backoff
        log.exception("run of %s crashed", member.name)
        outcome, error = RunOutcome.ERROR, f"{type(exc).__name__}: {exc}"
    try:
        slot.finish(lease, outcome, error, permanent=permanent)
    except LeaseLost:
        log.warning("run of %s lost its lease before it finished; the watchdog ended it", member.name)
        outcome = "lease-lost"
    tracing.end_run(traced, outcome, error)
    return outcome


