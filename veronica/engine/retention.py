"""Retention: what a space keeps, and the purge the engine tick and `manage.py vacuum` share.

A space with retention_days > 0 loses rows older than that many days: read mail, decided and
consumed approvals, answered and consumed questions, wake rows, ended runs, ended sessions (with
their turns), closed tasks no open task depends on, and events. It never loses unread mail (mail
to the operator counts as read once accepted), open tasks, pending or unconsumed approvals, a
member's open session, or the newest RETENTION_KEEP_EVENTS events. An ended session that learning
has not distilled yet waits up to RETENTION_DISTILL_GRACE_DAYS past the window.

Events go oldest first, as a prefix of the seq range, so what remains is still gapless: the oldest
kept seq is the table's MIN(seq). A stream client asking for `after` below it gets a
{"type": "purged", "through": oldest - 1} frame, then the events that remain (veronica.web.consumers);
GET /api/spaces/<slug>/events/ says the same with "purged_through".

Deletes go in batches of RETENTION_BATCH rows; the tick does at most TICK_BATCHES per kind per
space, so one tick stays short, and `vacuum` loops until nothing is left.
"""
from __future__ import annotations

import time

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, Min, OuterRef, Q, QuerySet
from django.utils import timezone

from veronica.swarm import audit, events, ledger
from veronica.plumbing.errors import VeronicaError
from veronica.models import (
    Approval, ApprovalStatus, Event, Message, Question, Run, Session, Space, Task, Turn, Wake, WebhookDelivery,
)

TICK_BATCHES = 2
MAX_RETENTION_DAYS = 36500


@dataclass(frozen=True)
class Kind:
    name: str
    rows: Callable[[Space, datetime], QuerySet]


def _closed_tasks(space: Space, cutoff: datetime) -> QuerySet:
    closed = Task.objects.filter(space=space, updated_at__lt=cutoff).exclude(status__in=ledger.OPEN)
    return closed.exclude(dependents__status__in=ledger.OPEN)


def _ended_sessions(space: Space, cutoff: datetime) -> QuerySet:
    """Ended sessions past the window, except those learning has not distilled yet: they wait up to
    RETENTION_DISTILL_GRACE_DAYS more, so a stopped or failing distiller cannot keep them forever.
    A session with no turns has nothing to distill and does not wait."""
    from veronica.swarm.learning_bridge import session_distilled

    grace = cutoff - timedelta(days=settings.RETENTION_DISTILL_GRACE_DAYS)
    ended = Session.objects.filter(member__space=space, ended_at__lt=cutoff)
    has_turns = Exists(Turn.objects.filter(session=OuterRef("pk")))
    return ended.filter(Q(ended_at__lt=grace) | ~has_turns | session_distilled())


def awaiting_distill(space: Space, cutoff: datetime) -> int:
    """Sessions the purge holds back for learning (shown in the preview)."""
    return Session.objects.filter(member__space=space, ended_at__lt=cutoff).exclude(pk__in=_ended_sessions(space, cutoff)).count()


# Order matters only for speed: messages go before tasks so fewer task FKs need nulling.
KINDS = [
    Kind("messages", lambda s, c: Message.objects.filter(space=s, read_at__isnull=False, created_at__lt=c)),
    Kind("approvals", lambda s, c: Approval.objects.filter(space=s, consumed=True, created_at__lt=c).exclude(status=ApprovalStatus.PENDING)),
    Kind("questions", lambda s, c: Question.objects.filter(space=s, consumed=True, answered_at__isnull=False, created_at__lt=c)),
    Kind("wakes", lambda s, c: Wake.objects.filter(member__space=s, created_at__lt=c)),
    Kind("runs", lambda s, c: Run.objects.filter(member__space=s, ended_at__lt=c)),
    Kind("sessions", _ended_sessions),
    Kind("tasks", _closed_tasks),
]


def cutoff_for(space: Space, now: datetime | None = None) -> datetime | None:
    if space.retention_days <= 0:
        return None
    return (now or timezone.now()) - timedelta(days=space.retention_days)


def oldest_seq(space_id: int) -> int | None:
    return Event.objects.filter(space_id=space_id).aggregate(m=Min("seq"))["m"]


def events_purgeable_through(space: Space, cutoff: datetime) -> int:
    """The highest seq that may go: older than the cutoff, and not one of the newest N. 0 = none."""
    head = Space.objects.filter(pk=space.pk).values_list("event_seq", flat=True).get()
    first_new = Event.objects.filter(space=space, created_at__gte=cutoff).aggregate(m=Min("seq"))["m"]
    through = (head if first_new is None else first_new - 1)
    return max(0, min(through, head - settings.RETENTION_KEEP_EVENTS))


def _delete_batches(qs: QuerySet, max_batches: int | None) -> int:
    batch, done, rounds = settings.RETENTION_BATCH, 0, 0
    while max_batches is None or rounds < max_batches:
        ids = list(qs.order_by("pk").values_list("pk", flat=True)[:batch])
        if not ids:
            break
        with transaction.atomic():
            qs.model.objects.filter(pk__in=ids).delete()
        done, rounds = done + len(ids), rounds + 1
        if len(ids) < batch:
            break
    return done


def _purge_events(space: Space, through: int, max_batches: int | None) -> int:
    """Oldest first in seq ranges, so the rows left are always a gapless suffix."""
    batch, done, rounds = settings.RETENTION_BATCH, 0, 0
    while through and (max_batches is None or rounds < max_batches):
        low = oldest_seq(space.pk)
        if low is None or low > through:
            break
        with transaction.atomic():
            done += Event.objects.filter(space=space, seq__lte=min(through, low + batch - 1)).delete()[0]
        rounds += 1
    return done


@audit.verb("space.purge", after=lambda a, counts: counts, unless=lambda a: a["dry_run"])
def purge_space(space: Space, *, now: datetime | None = None, dry_run: bool = False,
                max_batches: int | None = None, announce: bool = True) -> dict[str, int]:
    """Counts per kind of what was deleted (or, dry_run, would be). Empty when retention is off.

    `announce` emits a retention.purged event. The tick does not: its own event would move the
    newest-N window by one, so every later tick would purge one more old event and announce that."""
    cutoff = cutoff_for(space, now)
    if cutoff is None:
        return {}
    counts: dict[str, int] = {}
    for kind in KINDS:
        qs = kind.rows(space, cutoff)
        counts[kind.name] = qs.count() if dry_run else _delete_batches(qs, max_batches)
    through = events_purgeable_through(space, cutoff)
    if dry_run:
        counts["events"] = Event.objects.filter(space=space, seq__lte=through).count() if through else 0
    else:
        counts["events"] = _purge_events(space, through, max_batches)
        if announce and any(counts.values()):
            events.emit(space.pk, "retention.purged", days=space.retention_days, oldest_seq=oldest_seq(space.pk), **counts)
    return counts


def prune_webhook_deliveries(now: datetime | None = None) -> int:
    """A remembered signature is only needed while its timestamp could still be accepted."""
    horizon = (now or timezone.now()) - timedelta(seconds=2 * settings.WEBHOOK_TOLERANCE_SECONDS)
    return _delete_batches(WebhookDelivery.objects.filter(received_at__lt=horizon), None)


_last_purge = time.monotonic()  # the first purge comes a period after start-up, not on the first tick


def purge_if_due() -> int:
    """The tick runs every few seconds; retention works in days. Purge once a period per process
    (VERONICA_RETENTION_EVERY_SECONDS), so an idle tick stays a handful of statements."""
    global _last_purge
    if time.monotonic() - _last_purge < settings.RETENTION_EVERY_SECONDS:
        return 0
    _last_purge = time.monotonic()
    return purge_due()


def purge_due() -> int:
    """The tick's duty: a few batches per kind for every space with retention on."""
    total = prune_webhook_deliveries() + audit.purge()  # the audit trail's own, longer window
    for space in Space.objects.filter(retention_days__gt=0):
        total += sum(purge_space(space, max_batches=TICK_BATCHES, announce=False).values())
    return total


def preview(space: Space) -> dict:
    """The console / API view: the setting, the oldest kept event, and what a purge now would remove."""
    cutoff = cutoff_for(space)
    return {"retention_days": space.retention_days, "keep_events": settings.RETENTION_KEEP_EVENTS,
            "oldest_seq": oldest_seq(space.pk), "would_purge": purge_space(space, dry_run=True),
            "awaiting_distill": awaiting_distill(space, cutoff) if cutoff else 0,
            "distill_grace_days": settings.RETENTION_DISTILL_GRACE_DAYS}


def clean_days(raw: object) -> int:
    try:
        days = int(str(raw).strip())
    except ValueError:
        raise VeronicaError(f"retention_days must be an integer between 0 and {MAX_RETENTION_DAYS}", field="retention_days") from None
    if not 0 <= days <= MAX_RETENTION_DAYS:
        raise VeronicaError(f"retention_days is {days}; it must be between 0 and {MAX_RETENTION_DAYS}", field="retention_days")
    return days


@audit.verb("space.retention_set", watch="space")
def set_retention_days(space: Space, raw: object, *, actor: str) -> int:
    """Owners set the window; 0 keeps everything. The error names the field and the range."""
    days = clean_days(raw)
    with transaction.atomic():
        Space.objects.filter(pk=space.pk).update(retention_days=days)
        events.emit(space.pk, "space.retention_set", days=days, by=actor)
    space.retention_days = days
    return days
