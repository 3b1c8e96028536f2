"""The outbound notifier: every `ops.alert` event also leaves through the space's channels.

An alert writes one NotificationDelivery row per configured channel in the same transaction as the
event (so an alert is never half-notified, and the alert's once-per-episode dedup is the
notification's), then a django-q2 task delivers them after the commit. A failed attempt backs off
exponentially; the engine tick retries due rows, so retries survive a restart.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import URLValidator, validate_email
from django.db import transaction
from django.utils import timezone

from veronica.swarm import audit, events
from veronica.ops import outbound
from veronica.ops.alerts import channels_of, enqueue, record, tally  # noqa: F401 (the hook, moved: ops.alerts)
from veronica.plumbing.errors import VeronicaError
from veronica.models import Channel, DeliveryStatus, Event, NotificationDelivery, Space

log = logging.getLogger(__name__)

ALERT_KIND = "ops.alert"
MAX_ATTEMPTS = 6
BACKOFF_BASE_SECONDS = 30
BACKOFF_CAP_SECONDS = 3600
CLAIM_SECONDS = 120  # an attempt in flight holds its row this long; a crashed sender's row comes back
HTTP_TIMEOUT_SECONDS = 10
MAX_RECIPIENTS = 20
_url = URLValidator(schemes=["http", "https"])


# --- configuration ----------------------------------------------------------------------------------

def clean_url(value: object, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise VeronicaError(f"{field} must be a string", field=field)
    value = value.strip()
    if len(value) > 500:
        raise VeronicaError(f"{field} is {len(value)} characters; the limit is 500", field=field)
    if value:
        try:
            _url(value)
        except ValidationError:
            raise VeronicaError(f"{field} must be an http:// or https:// URL", field=field) from None
        outbound.check_url(value, field)
    return value


def clean_emails(value: object, field: str = "emails") -> str:
    """A list or a comma/space-separated string of addresses, stored comma-separated."""
    if value is None:
        return ""
    if isinstance(value, str):
        items = [v for v in value.replace(",", " ").split() if v]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value if v.strip()]
    else:
        raise VeronicaError(f"{field} must be a list of addresses or a comma-separated string", field=field)
    if len(items) > MAX_RECIPIENTS:
        raise VeronicaError(f"{field} names {len(items)} addresses; the limit is {MAX_RECIPIENTS}", field=field)
    for item in items:
        try:
            validate_email(item)
        except ValidationError:
            raise VeronicaError(f"{field}: {item!r} is not an email address", field=field) from None
    return ", ".join(items)


def config_of(space: Space) -> dict:
    return {"webhook_url": space.notify_webhook_url, "slack_url": space.notify_slack_url,
            "emails": [e for e in space.notify_emails.replace(",", " ").split() if e]}


@audit.verb("space.notify_set", watch="space")
def configure(space: Space, *, webhook_url: object = None, slack_url: object = None, emails: object = None, actor: str) -> Space:
    """Replace the space's notifier settings (all validated before anything is written)."""
    cleaned = {"notify_webhook_url": clean_url(webhook_url, "webhook_url"), "notify_slack_url": clean_url(slack_url, "slack_url"),
               "notify_emails": clean_emails(emails)}
    with transaction.atomic():
        Space.objects.filter(pk=space.pk).update(**cleaned)
        for key, value in cleaned.items():
            setattr(space, key, value)
        events.emit(space.pk, "space.notify_configured", actor=actor,
                    channels=[c for c, on in zip(Channel.values, cleaned.values()) if on])
    return space


# --- the hook (an alert becomes delivery rows) lives in veronica.ops.alerts -----------------------------

@audit.verb("space.notify_test")
def send_test(space: Space, *, actor: str) -> Event:
    """The 'send test notification' button: a real alert through the real path."""
    if not channels_of(space):
        raise VeronicaError("no notifier channel is configured (set a webhook URL, a Slack URL or email recipients)",
                            field="notify")
    return events.emit(space.pk, ALERT_KIND, subject="test notification",
                       body=f"A test notification from space {space.slug}, sent by {actor}.", test=True, actor=actor)


# --- delivery ------------------------------------------------------------------------------------------

def backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(BACKOFF_BASE_SECONDS * 2 ** max(attempts - 1, 0), BACKOFF_CAP_SECONDS))


def deliver(ids: list[int]) -> dict:
    """Attempt each due row once. A row is claimed with a conditional update, so two senders (the
    enqueued task and the tick) never send the same row at the same time."""
    sent = failed = 0
    now = timezone.now()
    for row in NotificationDelivery.objects.filter(pk__in=ids, status=DeliveryStatus.PENDING, next_at__lte=now).select_related("space"):
        claimed = NotificationDelivery.objects.filter(pk=row.pk, status=DeliveryStatus.PENDING, next_at=row.next_at).update(
            next_at=now + timedelta(seconds=CLAIM_SECONDS), attempts=row.attempts + 1)
        if not claimed:
            continue
        row.attempts += 1
        try:
            _send(row)
        except Exception as exc:  # any failure is a retry, with the reason kept for the owner
            error = f"{type(exc).__name__}: {exc}"[:1000]
            final = row.attempts >= MAX_ATTEMPTS
            NotificationDelivery.objects.filter(pk=row.pk).update(
                status=DeliveryStatus.FAILED if final else DeliveryStatus.PENDING, last_error=error,
                next_at=None if final else timezone.now() + backoff(row.attempts))
            failed += 1
            log.warning("notification %s (%s) attempt %s failed: %s", row.pk, row.channel, row.attempts, error)
        else:
            NotificationDelivery.objects.filter(pk=row.pk).update(status=DeliveryStatus.SENT, sent_at=timezone.now(),
                                                                   next_at=None, last_error="")
            sent += 1
    return {"sent": sent, "failed": failed}


def retry_due() -> int:
    """Engine tick duty: attempt every pending row whose next attempt is due."""
    from veronica.engine import clock

    ids = list(NotificationDelivery.objects.filter(status=DeliveryStatus.PENDING, next_at__lte=clock.now())
               .order_by("next_at").values_list("pk", flat=True)[:200])
    if not ids:
        return 0
    result = deliver(ids)
    return result["sent"] + result["failed"]


def payload_of(row: NotificationDelivery) -> dict:
    event_payload = row.event.payload if row.event_id else {}
    return {"space": row.space.slug, "seq": row.seq, "kind": ALERT_KIND, "subject": row.subject, "body": row.body,
            "member": event_payload.get("member_name"), "task": event_payload.get("task"),
            "test": bool(event_payload.get("test")), "at": row.created_at.isoformat()}


def _post(url: str, body: dict) -> None:
    with outbound.client(HTTP_TIMEOUT_SECONDS) as http:  # refuses internal addresses at connect time
        response = http.post(url, json=body, headers={"User-Agent": "veronica-notifier"})
    if not 200 <= response.status_code < 300:
        raise RuntimeError(f"HTTP {response.status_code} from {url}: {response.text[:200]}")


def _send(row: NotificationDelivery) -> None:
    title = f"[{row.space.slug}] {row.subject}"
    if row.channel == Channel.WEBHOOK:
        _post(row.target, payload_of(row))
    elif row.channel == Channel.SLACK:
        _post(row.target, {"text": f"*{title}*\n{row.body}".strip()})
    elif row.channel == Channel.EMAIL:
        recipients = [e for e in row.target.replace(",", " ").split() if e]
        send_mail(title, row.body or row.subject, settings.DEFAULT_FROM_EMAIL, recipients, fail_silently=False)
    else:
        raise RuntimeError(f"unknown channel {row.channel}")


def delivery_rows(space: Space, limit: int = 50) -> list[dict]:
    rows = NotificationDelivery.objects.filter(space=space).order_by("-id")[:limit]
    return [{"id": r.pk, "seq": r.seq, "channel": r.channel, "subject": r.subject, "status": r.status, "attempts": r.attempts,
             "next_at": r.next_at.isoformat() if r.next_at else None, "last_error": r.last_error,
             "sent_at": r.sent_at.isoformat() if r.sent_at else None, "created_at": r.created_at.isoformat()} for r in rows]
