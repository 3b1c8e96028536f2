"""The message bus: the one place mail is sent and marked read. History is never deleted here."""
from __future__ import annotations

from datetime import datetime, timezone as dt_timezone

from django.db import connections, transaction
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from veronica.swarm import audit, events
from veronica.engine.wakes import wake_on_commit
from veronica.plumbing.compiled_select import fetch, instances
from veronica.plumbing.errors import RecipientError, column_limit, require_text, text_problem
from veronica.models import Member, Membership, Message, Space, Task

BROADCAST = "all"
OPERATOR = "operator"
SYSTEM = "system"
WEBHOOK = "webhook"  # the sender of mail that arrived through the inbound webhook
CHECKS = "checks"  # the actor of the verify-check runner's task moves
A2A = "a2a"  # the sender kind of mail from an outside A2A agent: "a2a:<its credential's name>"
# names the engine itself sends or acts as: no member may take one, or its mail would pass for the engine's
ENGINE_NAMES = (BROADCAST, OPERATOR, SYSTEM, WEBHOOK, CHECKS, A2A)
MAX_BODY = 20000
MAX_SUBJECT = column_limit(Message, "subject")


def live_members(space: Space):
    return Member.objects.filter(space=space, removed_at__isnull=True)


def resolve_recipients(space: Space, to: str, sender_name: str) -> list[Member] | None:
    """Members a target reaches; None means the operator.

    A member name wins; 'all' is every active member but the sender (frozen ones never); any other
    target is a role, resolved to its unique active member. Unknown or ambiguous names the candidates.
    """
    if to is not None and not isinstance(to, str):
        raise RecipientError("to must be a string", field="to")
    if text_problem(to or ""):
        raise RecipientError(f"to {text_problem(to)}", field="to")
    target = (to or "").strip()
    if not target:
        raise RecipientError("to must name a member, a role, 'all' or 'operator'", field="to")
    if target == OPERATOR:
        return None
    members = list(live_members(space))
    if target == BROADCAST:
        return [m for m in members if m.membership == Membership.ACTIVE and m.name != sender_name]
    by_name = [m for m in members if m.name == target]
    if by_name:
        return by_name
    by_role = [m for m in members if m.role == target and m.membership == Membership.ACTIVE]
    if len(by_role) == 1:
        return by_role
    listing = ", ".join(f"{m.name} ({m.role}{', frozen' if m.membership == Membership.FROZEN else ''})" for m in members)
    if by_role:
        names = ", ".join(m.name for m in by_role)
        raise RecipientError(f"'{target}' is ambiguous: {len(by_role)} active members have that role ({names}); send to one of them by name", field="to")
    raise RecipientError(f"no member or role named '{target}'; candidates: {listing or 'none'}, 'all', 'operator'", field="to")


@audit.verb("message.send", target=lambda a, rows: a["to"])
def send(space: Space, sender_name: str, to: str, body: str, *, subject: str = "", task: Task | None = None,
         wake_source: str = "message") -> list[Message]:
    """Persist the mail, emit one event per message, and wake the recipients after the commit."""
    body = require_text(body, "body", max_len=MAX_BODY)
    subject = require_text(subject, "subject", max_len=MAX_SUBJECT, allow_empty=True).strip()
    sender = live_members(space).filter(name=sender_name).first()
    with events.transaction_batch():  # the events in one statement, with the commit
        recipients = resolve_recipients(space, to, sender_name)
        if recipients is None:
            rows = [Message(space=space, sender=sender, sender_name=sender_name, recipient=None,
                            recipient_name=OPERATOR, subject=subject, body=body, task=task)]
        else:
            rows = [Message(space=space, sender=sender, sender_name=sender_name, recipient=m, recipient_name=m.name,
                            subject=subject, body=body, task=task, broadcast=to == BROADCAST) for m in recipients]
        for row in rows:
            row.save()
            events.emit(space.pk, "message.sent", member=sender, id=row.pk, sender=sender_name, to=row.recipient_name,
                        subject=subject, body=body[:500], task=task.pk if task else None, broadcast=row.broadcast)
    # After the mail's own savepoint is released: its ring then joins the ring the enclosing transaction
    # already holds (veronica.engine.wakes), so mail to many in one commit rings them all in one go.
    wake_on_commit([m.pk for m in recipients or [] if m.membership == Membership.ACTIVE], wake_source)
    return rows


def unread_for(member: Member | int):
    return Message.objects.filter(recipient=member, read_at__isnull=True).order_by("id")


def unread_list(member: Member) -> list[Message]:
    """unread_for(member) as a list, its SELECT compiled once (every run's start reads it)."""
    return fetch(("unread-of",), _unread_query, {"member": member.pk})


def unread_from(rows: list) -> list[Message]:
    """unread_list() from rows another statement read (a wake's claim): Message's columns, in order."""
    return instances(("unread-of",), _unread_query, rows)


def _unread_query(s):
    return unread_for(s.int("member"))


def mark_read(member: Member, message_ids: list[int]) -> int:
    """Explicit, per member: only the recipient's own unread rows change."""
    with transaction.atomic(savepoint=False):
        count = _mark_read_update(member.pk, message_ids)
        if count:
            events.emit(member.space_id, "message.read", member=member, ids=sorted(message_ids), count=count)
    return count


# mark_read's UPDATE as the ORM writes it, compiled once per backend and number of ids: every run's
# first model turn marks its brief's mail, and compiling the queryset cost more than running it.
_MEMBER_AT, _READ_AT = -918273646, datetime(2000, 1, 1, 0, 0, 0, 918273, tzinfo=dt_timezone.utc)
_mark_sql: dict[tuple, tuple[str, list, int, int, list[int]]] = {}


def _mark_read_update(member_id: int, message_ids: list[int]) -> int:
    conn = connections[Message.objects.db]
    ids = list(dict.fromkeys(int(pk) for pk in message_ids))  # as the ORM's IN (its OrderedSet): each id once, in order
    if not ids:
        return 0
    key = (conn.alias, conn.vendor, len(ids))
    compiled = _mark_sql.get(key)
    if compiled is None:
        fake = [-(10**15) - i for i in range(len(ids))]
        query = Message.objects.filter(recipient_id=_MEMBER_AT, pk__in=fake, read_at__isnull=True).query.chain(UpdateQuery)
        query.add_update_values({"read_at": _READ_AT})
        sql, params = query.get_compiler(conn.alias).as_sql()
        params = list(params)
        read_at = Message._meta.get_field("read_at").get_db_prep_save(_READ_AT, conn)
        at = {p: i for i, p in enumerate(params) if isinstance(p, int) and not isinstance(p, bool)}
        when = [i for i, p in enumerate(params) if p == read_at]
        if _MEMBER_AT not in at or len(when) != 1 or any(f not in at for f in fake):
            raise RuntimeError("mark_read's UPDATE did not compile to one member, one time and its ids")
        if len(_mark_sql) > 64:
            _mark_sql.clear()
        compiled = _mark_sql[key] = (sql, params, at[_MEMBER_AT], when[0], [at[f] for f in fake])
    sql, params, member_at, when_at, ids_at = compiled
    params = list(params)
    params[member_at] = member_id
    params[when_at] = Message._meta.get_field("read_at").get_db_prep_save(timezone.now(), conn)
    for i, pk in zip(ids_at, ids):
        params[i] = pk
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


@audit.verb("message.accept", watch="message")
def accept_operator_mail(message: Message, *, user, body: str | None = None) -> Message:
    """The operator accepts a member's mail, optionally editing it first (kept beside the original)."""
    if message.recipient_name != OPERATOR:
        raise RecipientError("only mail to the operator can be accepted", field="message_id")
    edited = require_text(body, "body", max_len=MAX_BODY) if body is not None and body.strip() != message.body.strip() else ""
    with transaction.atomic():
        if not Message.objects.filter(pk=message.pk, accepted_at__isnull=True).update(
                accepted_at=timezone.now(), accepted_by=user, accepted_body=edited, read_at=timezone.now()):
            from veronica.plumbing.errors import Conflict

            raise Conflict(f"message #{message.pk} was already accepted", field="message_id")
        events.emit(message.space_id, "message.accepted", id=message.pk, edited=bool(edited),
                    by=getattr(user, "username", str(user)))
    message.refresh_from_db()
    return message
