"""The notifier's hook: an `ops.alert` event becomes one NotificationDelivery row per configured channel, in
the event's transaction, and a django-q2 task is enqueued after the commit (veronica.ops.notify delivers it).
Moved out of veronica.ops.notify so veronica.swarm.events can call it without notify, whose verbs emit
events, importing events back."""
from __future__ import annotations

import logging

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from veronica.models import AlertTally, Channel, Event, NotificationDelivery, Space

log = logging.getLogger("veronica.ops.notify")  # the notifier's logger, as before the split


def channels_of(space: Space) -> list[tuple[str, str]]:
    out = []
    if space.notify_webhook_url:
        out.append((Channel.WEBHOOK, space.notify_webhook_url))
    if space.notify_slack_url:
        out.append((Channel.SLACK, space.notify_slack_url))
    if space.notify_emails.strip():
        out.append((Channel.EMAIL, space.notify_emails))
    return out


def record(event: Event) -> list[int]:
    """Called by events.emit inside the alert's transaction: the alert is counted, and gets one
    pending row per channel."""
    space = Space.objects.only("notify_webhook_url", "notify_slack_url", "notify_emails").get(pk=event.space_id)
    payload = event.payload
    subject = str(payload.get("subject", "ops alert"))[:200]
    tally(event.space_id, subject)
    body = str(payload.get("body", ""))
    now = timezone.now()
    ids = [NotificationDelivery.objects.create(space_id=event.space_id, event=event, seq=event.seq, channel=channel, target=target,
                                               subject=subject, body=body, next_at=now).pk
           for channel, target in channels_of(space)]
    if ids:
        transaction.on_commit(lambda: enqueue(ids))
    return ids


def tally(space_id: int, subject: str) -> None:
    """One more alert of this kind (an F() increment: concurrent alerts never lose a count)."""
    subject = subject[:40]
    if AlertTally.objects.filter(space_id=space_id, subject=subject).update(count=F("count") + 1):
        return
    try:
        with transaction.atomic():
            AlertTally.objects.create(space_id=space_id, subject=subject, count=1)
    except IntegrityError:  # another alert created the row at the same moment
        AlertTally.objects.filter(space_id=space_id, subject=subject).update(count=F("count") + 1)


def enqueue(ids: list[int]) -> None:
    from django_q.tasks import async_task

    try:
        async_task("veronica.notify.deliver", ids, q_options={"task_name": f"notify-{ids[0]}"})
    except Exception:  # the tick's retry sweep picks the rows up
        log.warning("could not enqueue notification deliveries %s; the tick retries them", ids, exc_info=True)
