"""Ops watchdogs beside the stale-task one: a member stuck mid-run and a mailbox backlog.

The stuck-run watchdog is the seeds' "stall" notice: a run that holds a live lease (renewed by its
heartbeat) but has started no model call and no tool call for the threshold. phase_since is that
clock: every step re-stamps it, even when the phase is unchanged (two calls of one tool in a row).
A run past its lease is not a stall but a dead holder: the lease recovery releases and re-wakes it
within lease + 5 s, so it is not alerted here.

Each raises one `ops.alert` (which the notifier sends on) plus a mail to the operator and the leader, once per
episode: a marker column on the member is set with a conditional update when the alert fires and
cleared when the condition ends, so the next episode alerts again.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.db.models.functions import Now

from veronica.swarm import audit, bus, events
from veronica.ops import notify
from veronica.engine import checks, clock
from veronica.models import Member, Membership, Message, Phase, Role, Space

log = logging.getLogger(__name__)
WAITING_ON_PEOPLE = (Phase.WAITING_APPROVAL, Phase.WAITING_INPUT)  # a human's turn, not a stuck run


def _alert(space: Space, member: Member, subject: str, body: str) -> None:
    """The seed's notifyOps: the event, a mail to the operator and one to the leader (it re-plans
    around the member). Callers hold the episode marker, so each goes out once per episode."""
    events.emit(space.pk, "ops.alert", member=member, subject=subject, body=body)
    for to in (bus.OPERATOR, *_leader_of(space, member)):
        try:
            bus.send(space, bus.SYSTEM, to, body, subject=f"{subject.capitalize()}: {member.name}")
        except Exception:
            log.warning("could not mail %s about %s (%s)", to, member.name, subject, exc_info=True)


def _leader_of(space: Space, member: Member) -> list[str]:
    """The leader's name, unless the alert is about the leader itself: mail to a stuck or backlogged
    leader only adds to what it is not reading (and would wake it to read about itself)."""
    return list(bus.live_members(space).filter(role=Role.LEADER).exclude(pk=member.pk).values_list("name", flat=True)[:1])


# The shortest threshold a space can set: one indexed query finds every candidate in every space,
# and each candidate is then judged against its own space's threshold. An idle tick costs the same
# few statements however many spaces and members there are.
MIN_THRESHOLD = timedelta(minutes=1)


def stuck_runs() -> int:
    """Members holding a live lease that started no model or tool call for the space's stuck_run_minutes."""
    now = clock.now()
    # the episode ends when the lease is released or the phase moves on
    Member.objects.filter(stuck_alerted_at__isnull=False).filter(Q(lease_token="") | Q(phase_since__gt=F("stuck_alerted_at"))).update(
        stuck_alerted_at=None)
    candidates = Member.objects.filter(removed_at__isnull=True, stuck_alerted_at__isnull=True, phase_since__lt=now - MIN_THRESHOLD,
                                       space__stuck_run_minutes__gt=0, lease_expires_at__gt=Now()).exclude(lease_token="")
    candidates = candidates.exclude(phase__in=WAITING_ON_PEOPLE)
    count = 0
    for member in candidates.select_related("space"):
        space = member.space
        if member.phase_since >= now - timedelta(minutes=space.stuck_run_minutes):
            continue
        with transaction.atomic():
            if not Member.objects.filter(pk=member.pk, stuck_alerted_at__isnull=True).exclude(lease_token="").update(stuck_alerted_at=now):
                continue
            minutes = round((now - member.phase_since).total_seconds() / 60)  # the database clock reads in ms: 44.999 is 45
            body = (f"{member.name} has been in phase {member.display_phase} for {minutes} minutes while holding its run lease, "
                    f"with no new model or tool call (threshold {space.stuck_run_minutes} min). Cancel or suspend it if it does not move.")
            _alert(space, member, "stuck run", body)
        count += 1
    return count


def _oldest_unread():
    return Subquery(Message.objects.filter(recipient=OuterRef("pk"), read_at__isnull=True).order_by("created_at").values("created_at")[:1])


def mailbox_backlog() -> int:
    """Members with unread mail older than the space's mailbox_backlog_minutes."""
    now = clock.now()
    # the episode ends when no unread mail is older than the threshold any more
    for member in Member.objects.filter(backlog_alerted_at__isnull=False).annotate(oldest=_oldest_unread()).select_related("space"):
        minutes = member.space.mailbox_backlog_minutes
        if member.oldest is None or not minutes or member.oldest >= now - timedelta(minutes=minutes):
            Member.objects.filter(pk=member.pk).update(backlog_alerted_at=None)
    # From old unread mail (a partial index holds only unread rows), never from every member: its recipients
    # first, in a statement of their own (one index range, empty on a tick with no backlog: then the only
    # one). As a semi-join inside the member query, a planner without statistics walked that range once
    # per member. Their oldest unread is older than the threshold by construction: no filter on it.
    waiting = set(Message.objects.filter(read_at__isnull=True, created_at__lt=now - MIN_THRESHOLD)
                  .order_by().values_list("recipient_id", flat=True).distinct())
    waiting.discard(None)
    if not waiting:
        return 0
    candidates = Member.objects.filter(pk__in=sorted(waiting), removed_at__isnull=True, backlog_alerted_at__isnull=True,
                                       space__mailbox_backlog_minutes__gt=0)
    candidates = candidates.exclude(membership=Membership.FROZEN).annotate(oldest=_oldest_unread())
    count = 0
    for member in candidates.select_related("space"):
        space = member.space
        if member.oldest >= now - timedelta(minutes=space.mailbox_backlog_minutes):
            continue
        with transaction.atomic():
            if not Member.objects.filter(pk=member.pk, backlog_alerted_at__isnull=True).update(backlog_alerted_at=now):
                continue
            unread = Message.objects.filter(recipient=member, read_at__isnull=True).count()
            body = (f"{member.name} has {unread} unread messages; the oldest has waited since {member.oldest:%Y-%m-%d %H:%M} UTC "
                    f"(threshold {space.mailbox_backlog_minutes} min). Its runs may be failing or it may be suspended.")
            _alert(space, member, "mailbox backlog", body)
        count += 1
    return count


THRESHOLDS = ("stale_task_minutes", "stuck_run_minutes", "mailbox_backlog_minutes")
THRESHOLD_MAX = 7 * 24 * 60


def thresholds_of(space: Space) -> dict:
    return {name: getattr(space, name) for name in THRESHOLDS}


def clean_thresholds(values: dict) -> dict[str, int]:
    from veronica.plumbing.errors import VeronicaError

    cleaned = {}
    for name, raw in values.items():
        if name not in THRESHOLDS:
            raise VeronicaError(f"unknown threshold {name!r} (known: {', '.join(THRESHOLDS)})", field=name)
        try:
            value = int(raw) if not isinstance(raw, bool) else None
        except (TypeError, ValueError):
            value = None
        if value is None or not 0 <= value <= THRESHOLD_MAX:
            raise VeronicaError(f"{name} must be a whole number of minutes from 0 (off) to {THRESHOLD_MAX}", field=name)
        cleaned[name] = value
    return cleaned


@audit.verb("space.thresholds_set", watch="space")
def set_thresholds(space: Space, values: dict, *, actor: str) -> Space:
    """Change watchdog thresholds (minutes, 0 = off). Every value is checked before any is written."""
    cleaned = clean_thresholds(values)
    with transaction.atomic():
        Space.objects.filter(pk=space.pk).update(**cleaned)
        for name, value in cleaned.items():
            setattr(space, name, value)
        events.emit(space.pk, "space.watchdogs_configured", actor=actor, **cleaned)
    return space


def duties() -> int:
    """The ops line of the engine tick: watchdogs, notification retries, lost check runs."""
    done = 0
    for duty in (stuck_runs, mailbox_backlog, notify.retry_due, checks.recover):
        try:
            done += duty()
        except Exception:  # one failing duty must not starve the others
            log.exception("ops duty %s failed", duty.__name__)
    return done
