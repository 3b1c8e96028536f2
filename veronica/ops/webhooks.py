"""Inbound webhooks: outside events (CI, a ticket system, a monitor) mail a member and wake it.

    POST /api/spaces/<slug>/webhook/                    body {"to": member-or-role, "subject", "body"}
    POST /api/spaces/<slug>/members/<name>/webhook/     body {"subject", "body"} ("to" is the member)
    X-Veronica-Timestamp: <unix seconds>
    X-Veronica-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>." + raw body)>

The timestamp must be within WEBHOOK_TOLERANCE_SECONDS of the server's clock, and an accepted
signature is remembered (a WebhookDelivery row, unique per space) for that window, so a captured
delivery cannot be replayed: outside the window it is stale, inside it the signature is taken.
The secret is stored (HMAC needs it) and shown only by rotate_secret's return value.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from veronica.swarm import audit, bus, events
from veronica.plumbing.errors import MAX_JSON_DEPTH, Conflict, NotFound, VeronicaError, check_tree, text_problem
from veronica.models import Message, Space, WebhookDelivery

SENDER = bus.WEBHOOK
SECRET_PREFIX = "whsec_"
TIMESTAMP_HEADER = "X-Veronica-Timestamp"
SIGNATURE_HEADER = "X-Veronica-Signature"


class Unsigned(VeronicaError):
    """A missing, stale or wrong signature: the caller did not prove it holds the secret."""

    status = 401


class TooLarge(VeronicaError):
    status = 413


@dataclass(frozen=True)
class Delivery:
    timestamp: str
    signature: str
    body: bytes


def sign(secret: str, timestamp: str | int, body: bytes) -> str:
    """The header value a sender puts in X-Veronica-Signature."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


# --- owners: the secret ------------------------------------------------------------------------------

@audit.verb("space.webhook_secret_rotate", watch="space")
def rotate_secret(space: Space, *, actor: str) -> str:
    """A new secret replaces the old at once; the caller shows it once and it is never shown again."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        Space.objects.filter(pk=space.pk).update(webhook_secret=secret, webhook_rotated_at=timezone.now())
        events.emit(space.pk, "webhook.secret_rotated", by=actor)
    space.refresh_from_db(fields=["webhook_secret", "webhook_rotated_at"])
    return secret


@audit.verb("space.webhook_secret_clear", watch="space")
def clear_secret(space: Space, *, actor: str) -> None:
    """No secret: the space's webhook answers 404, as if it did not exist."""
    with transaction.atomic():
        Space.objects.filter(pk=space.pk).update(webhook_secret="", webhook_rotated_at=timezone.now())
        events.emit(space.pk, "webhook.secret_cleared", by=actor)
    space.refresh_from_db(fields=["webhook_secret", "webhook_rotated_at"])


def status(space: Space) -> dict:
    """What anyone may see about the secret: whether one is set and when it changed. Never the value."""
    return {"secret_set": bool(space.webhook_secret), "rotated_at": space.webhook_rotated_at.isoformat() if space.webhook_rotated_at else None,
            "url": f"/api/spaces/{space.slug}/webhook/", "max_bytes": settings.WEBHOOK_MAX_BYTES,
            "tolerance_seconds": settings.WEBHOOK_TOLERANCE_SECONDS}


def masked(space: Space) -> str:
    return f"{space.webhook_secret[:len(SECRET_PREFIX) + 2]}… (set)" if space.webhook_secret else "(not set)"


# --- senders: one delivery ---------------------------------------------------------------------------------

def space_for_webhook(slug: str) -> Space:
    space = Space.objects.filter(slug=slug).first()
    if space is None or not space.webhook_secret:
        # the same answer either way: an unauthenticated caller learns nothing about which spaces exist
        raise NotFound("no webhook here: the space does not exist or has no webhook secret")
    return space


def check_size(content_length: str | None) -> None:
    """Refuse an oversize body from its Content-Length, before reading it."""
    try:
        length = int(content_length or 0)
    except ValueError:
        raise VeronicaError("Content-Length must be an integer", field="Content-Length") from None
    if length > settings.WEBHOOK_MAX_BYTES:
        raise TooLarge(f"the body is {length} bytes; the limit is {settings.WEBHOOK_MAX_BYTES}", field="body")


clock = time.time  # the server's clock for the timestamp window (a test freezes it here)


def verify(space: Space, delivery: Delivery, *, now: float | None = None) -> None:
    """Size, timestamp window and signature (constant-time). Raises; returns nothing on success."""
    if len(delivery.body) > settings.WEBHOOK_MAX_BYTES:
        raise TooLarge(f"the body is {len(delivery.body)} bytes; the limit is {settings.WEBHOOK_MAX_BYTES}", field="body")
    if not delivery.timestamp:
        raise Unsigned(f"{TIMESTAMP_HEADER} is required (unix seconds)", field=TIMESTAMP_HEADER)
    try:
        stamp = int(delivery.timestamp)
    except ValueError:
        raise Unsigned(f"{TIMESTAMP_HEADER} must be unix seconds, an integer", field=TIMESTAMP_HEADER) from None
    skew = abs((clock() if now is None else now) - stamp)
    if skew > settings.WEBHOOK_TOLERANCE_SECONDS:
        raise Unsigned(f"{TIMESTAMP_HEADER} is {int(skew)} seconds from the server's clock; the limit is "
                       f"{settings.WEBHOOK_TOLERANCE_SECONDS}", field=TIMESTAMP_HEADER)
    if not delivery.signature:
        raise Unsigned(f"{SIGNATURE_HEADER} is required: sha256=<hex HMAC-SHA256 of '<timestamp>.<body>'>", field=SIGNATURE_HEADER)
    expected = sign(space.webhook_secret, delivery.timestamp, delivery.body)
    if not hmac.compare_digest(expected.encode(), delivery.signature.strip().encode()):
        raise Unsigned("the signature does not match the body and timestamp for this space's secret", field=SIGNATURE_HEADER)


def _payload(body: bytes) -> dict:
    try:
        data = json.loads(body or b"{}")
    except RecursionError:  # the parser's own guard (about 1,000 levels), far past the limit check_tree enforces
        raise VeronicaError(f"the body nests deeper than {MAX_JSON_DEPTH} levels", field="json") from None
    except (ValueError, UnicodeDecodeError):
        raise VeronicaError("the body is not valid JSON", field="json") from None
    if not isinstance(data, dict):
        raise VeronicaError('the body must be a JSON object: {"to", "subject", "body"}', field="json")
    for key in ("to", "subject", "body"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise VeronicaError(f"{key} must be a string", field=key)
    return data


def _target(data: dict, member_name: str | None) -> str:
    to = (data.get("to") or "").strip()
    if member_name is not None:
        if to and to != member_name:
            raise VeronicaError(f"to is '{to}' but this webhook is {member_name}'s; leave to out", field="to")
        return member_name
    if not to:
        raise VeronicaError("to is required: a member name or a role", field="to")
    if to in (bus.OPERATOR, bus.BROADCAST):
        raise VeronicaError(f"to must name a member or a role, not '{to}'", field="to")
    return to


def deliver(space: Space, delivery: Delivery, *, member_name: str | None = None) -> list[Message]:
    """Verify, refuse a replay, and send the mail through the bus (which wakes the recipient)."""
    verify(space, delivery)
    data = _payload(delivery.body)
    check_tree(data, what="the body")  # before the delivery row: a NUL or lone surrogate is a 400, nothing written
    if member_name is not None and text_problem(member_name):
        raise VeronicaError(f"name {text_problem(member_name)}", field="name")
    if member_name is not None and not bus.live_members(space).filter(name=member_name).exists():
        raise NotFound(f"no member named '{member_name}' in space {space.slug}", field="member")  # after the signature: names stay private
    to = _target(data, member_name)
    digest = delivery.signature.strip().removeprefix("sha256=")
    try:
        with transaction.atomic():
            WebhookDelivery.objects.create(space=space, signature=digest, member_name=to[:60])
            rows = bus.send(space, SENDER, to, data.get("body") or "", subject=data.get("subject") or "")
    except IntegrityError:
        raise Conflict("this delivery was already accepted (same signature); send a new timestamp", field=SIGNATURE_HEADER) from None
    return rows
