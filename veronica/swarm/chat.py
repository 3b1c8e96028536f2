"""The operator's conversation with one member: the operator's mail and the member's replies.

A run woken by operator mail ends in a final text; that text is the member's reply and is recorded
as a Message from the member to the operator (reply_to: the operator's latest message it answered).
It is written inside the run's fence, with the model turn that carries it, so a run that lost its
lease records no reply, and the message.sent event rings the sockets only after the commit (persist
before signal). A run that already mailed the operator itself (send_message) records no second copy.
"""
from __future__ import annotations

from veronica.swarm import audit, bus, events
from veronica.plumbing.errors import VeronicaError
from veronica.plumbing.markdown import render_markdown
from veronica.models import Member, Message, Turn

REPLY_SUBJECT_MAX = bus.MAX_SUBJECT
CUT_NOTE = "\n\n[reply cut at {limit} characters; the whole text is in the transcript]"


def record_reply(member: Member, brief: Turn | None, text: str, *, asked: list[Message] | None = None) -> Message | None:
    """Callers hold the run's fence. The reply to the operator's mail the brief carried, if any.
    asked: that mail when the run already knows it (its brief's unread), so no query finds it."""
    if brief is None or not brief.mail_ids or not text.strip():
        return None
    if asked is None:
        asked = list(Message.objects.filter(pk__in=brief.mail_ids, recipient=member, sender_name=bus.OPERATOR).only("pk", "subject"))
    asked = max(asked, key=lambda m: m.pk, default=None)
    if asked is None:
        return None
    if Message.objects.filter(sender=member, recipient_name=bus.OPERATOR, pk__gt=asked.pk).exists():
        return None  # the model answered with send_message already
    body = text if len(text) <= bus.MAX_BODY else text[:bus.MAX_BODY - 100] + CUT_NOTE.format(limit=bus.MAX_BODY - 100)
    subject = (f"Re: {asked.subject}" if asked.subject else "")[:REPLY_SUBJECT_MAX]
    reply = Message.objects.create(space_id=member.space_id, sender=member, sender_name=member.name, recipient=None,
                                   recipient_name=bus.OPERATOR, subject=subject, body=body, reply_to=asked)
    events.emit(member.space_id, "message.sent", member=member, id=reply.pk, sender=member.name, to=bus.OPERATOR,
                subject=subject, body=body[:500], task=None, broadcast=False, reply_to=asked.pk)
    return reply


def thread_directions(member: Member):
    """Every message between the operator and this member: the operator's to it, and its to the
    operator (msg_from_operator_idx and msg_to_operator_idx, veronica.models.messaging)."""
    mine = Message.objects.filter(space_id=member.space_id)
    return (mine.filter(sender_name=bus.OPERATOR, recipient=member), mine.filter(sender=member, recipient_name=bus.OPERATOR))


def message_row(m: Message) -> dict:
    """A message on the wire (the API, the chat pane): moved here from api.selectors so the verb need not import the web."""
    iso = lambda value: value.isoformat() if value else None  # noqa: E731 (api.selectors.iso, one line)
    return {"id": m.pk, "sender": m.sender_name, "to": m.recipient_name, "subject": m.subject, "body": m.body,
            "html": render_markdown(m.body), "task": m.task_id, "broadcast": m.broadcast, "read_at": iso(m.read_at),
            "created_at": iso(m.created_at), "reply_to": m.reply_to_id}


def conversation(member: Member, *, before: int | None = None, limit: int = 50) -> dict:
    """Oldest first within the page (a chat reads downwards); pages go back with next_before.
    Each direction is read on its own, newest first through its partial index, and the two are merged:
    as one query with an OR, SQLite walked the space's every message backwards instead (its planner
    takes the space's index to skip the sort; 101 ms for the member page beside 500,000 messages,
    bench/fleet_scale.py)."""
    rows: dict[int, Message] = {}
    for direction in thread_directions(member):
        if before is not None:
            direction = direction.filter(pk__lt=before)
        rows.update((m.pk, m) for m in direction.order_by("-id")[: limit + 1])
    newest = sorted(rows.values(), key=lambda m: m.pk, reverse=True)[: limit + 1]
    more = len(newest) > limit
    newest = newest[:limit]
    out = [message_row(m) for m in reversed(newest)]
    return {"member": member.name, "messages": out, "next_before": newest[-1].pk if more and newest else None}


@audit.verb("message.send")
def send_to(member: Member, body: str, *, subject: str = "") -> Message:
    """The operator writes to this one member (the same bus.send as the space's chat)."""
    if member.removed_at is not None:
        raise VeronicaError(f"member '{member.name}' is removed", field="member")
    return bus.send(member.space, bus.OPERATOR, member.name, body, subject=subject)[0]
