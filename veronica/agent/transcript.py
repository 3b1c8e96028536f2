"""The member's conversation as rows: one Turn per message, written as it happens."""
from __future__ import annotations

from django.db.models import Max

from veronica.models import Member, Session, Turn, TurnRole

ELIDED = "[older tool output elided by compaction]"


def open_session(member: Member) -> Session:
    session = Session.objects.filter(member=member, ended_at__isnull=True).first()
    return session or Session.objects.create(member=member)


def turns(session: Session) -> list[Turn]:
    return list(session.turns.order_by("seq"))


def append(session: Session, role: str, content: str = "", **fields) -> Turn:
    seq = (session.turns.aggregate(m=Max("seq"))["m"] or 0) + 1
    return Turn.objects.create(session=session, seq=seq, role=role, content=content, **fields)


def to_messages(rows: list[Turn]) -> list[dict]:
    out = []
    for t in rows:
        if t.role == TurnRole.USER:
            out.append({"role": "user", "content": t.content})
        elif t.role == TurnRole.ASSISTANT:
            out.append({"role": "assistant", "content": t.content, "tool_calls": t.tool_calls or []})
        else:
            out.append({"role": "tool", "tool_call_id": t.tool_call_id, "name": t.tool_name,
                        "content": ELIDED if t.elided else t.content})
    return out


def dangling_calls(rows: list[Turn]) -> list[dict]:
    """Tool calls of the last assistant turn that have no result yet (held, asked, or interrupted)."""
    last_assistant = next((t for t in reversed(rows) if t.role == TurnRole.ASSISTANT), None)
    if last_assistant is None or not last_assistant.tool_calls:
        return []
    answered = {t.tool_call_id for t in rows if t.role == TurnRole.TOOL and t.seq > last_assistant.seq}
    return [c for c in last_assistant.tool_calls if c["id"] not in answered]
