"""The member's conversation as rows: one Turn per message, written as it happens."""
from __future__ import annotations

import json
from contextlib import contextmanager

from django.db.models import Max

from veronica.swarm import events
from veronica.plumbing.compiled_select import fetch
from veronica.plumbing.secret_store import mask, mask_data
from veronica.models import Member, Session, Turn, TurnRole

ELIDED = "[older tool output elided by compaction]"


def current_session(member: Member) -> Session | None:
    found = fetch(("open-session",), lambda s: Session.objects.filter(member_id=s.int("member"), ended_at__isnull=True)
                  .order_by("pk")[:1], {"member": member.pk})
    session = found[0] if found else None
    if session is not None:
        session.member = member  # known: append() reads its space without a query
    return session


def new_session(member: Member) -> Session:
    return Session.objects.create(member=member)


def open_session(member: Member) -> Session:
    return current_session(member) or new_session(member)


def turns(session: Session) -> list[Turn]:
    return fetch(("turns",), lambda s: Turn.objects.filter(session_id=s.int("session")).order_by("seq"), {"session": session.pk})


def _masked(content: str, fields: dict, space_id: int) -> tuple[str, dict]:
    """No secret value of the space is ever written to a transcript (tool results, replies, tool-call arguments)."""
    if fields.get("tool_calls"):
        fields = {**fields, "tool_calls": mask_data(fields["tool_calls"], space_id)}
    return mask(content, space_id), fields


def append(session: Session, role: str, content: str = "", **fields) -> Turn:
    content, fields = _masked(content, fields, session.member.space_id)
    seq = (session.turns.aggregate(m=Max("seq"))["m"] or 0) + 1
    return Turn.objects.create(session=session, seq=seq, role=role, content=content, **fields)


def message(t: Turn) -> dict:
    if t.role == TurnRole.USER:
        return {"role": "user", "content": t.content}
    if t.role == TurnRole.ASSISTANT:
        return {"role": "assistant", "content": t.content, "tool_calls": t.tool_calls or []}
    return {"role": "tool", "tool_call_id": t.tool_call_id, "name": t.tool_name, "content": ELIDED if t.elided else t.content}


def to_messages(rows: list[Turn]) -> list[dict]:
    return [message(t) for t in rows]


def message_chars(m: dict) -> int:
    """What metering.estimate_tokens counts for one message."""
    return len(m.get("content") or "") + len(json.dumps(m.get("tool_calls") or []))


class Log:
    """A run's transcript in memory: loaded once, appended as the run writes its turns (the run holds
    the member's slot, so nobody else writes this session meanwhile). Every model call then costs
    O(1) in the transcript's length: no reload, no re-conversion, no MAX(seq) per append."""

    def __init__(self, session: Session, rows: list[Turn] | None = None) -> None:
        self.session = session
        self.space_id = session.member.space_id  # whose secrets are masked in its turns (open_session knows the member)
        self.rows = turns(session) if rows is None else rows
        self.messages = to_messages(self.rows)
        self.chars = sum(message_chars(m) for m in self.messages)
        self.next_seq = (self.rows[-1].seq if self.rows else 0) + 1
        self.marked: set[int] = set()  # brief turns whose mail this run has marked read
        # the latest user turn (the brief a reply answers), kept so a step need not search back for it
        self.last_user = next((t for t in reversed(self.rows) if t.role == TurnRole.USER), None)
        self._pending: list[Turn] | None = None  # inside batched(): turns not yet written

    def append(self, role: str, content: str = "", **fields) -> Turn:
        content, fields = _masked(content, fields, self.space_id)
        if self._pending is not None:
            turn = Turn(session=self.session, seq=self.next_seq, role=role, content=content, **fields)
            self._pending.append(turn)
        else:
            turn = Turn.objects.create(session=self.session, seq=self.next_seq, role=role, content=content, **fields)
        self.next_seq += 1
        if role == TurnRole.USER:
            self.last_user = turn
        self.rows.append(turn)
        self.messages.append(message(turn))
        self.chars += message_chars(self.messages[-1])
        return turn

    @contextmanager
    def batched(self):
        """Inside the caller's transaction: this block's turns are written in one multi-row INSERT at
        its end (or at flush(), before anything that reads the session's rows). On an exception the
        in-memory log drops what the block appended: the caller's transaction rolls it back."""
        if self._pending is not None:
            yield
            return
        self._pending, start = [], len(self.rows)
        try:
            yield
            if not events.defer_insert(Turn, list(self._pending)):  # PostgreSQL: in the step's event statement
                self.flush()
        except BaseException:  # the fence rolls back: whatever this block appended is gone from the table too
            self.chars -= sum(message_chars(m) for m in self.messages[start:])
            del self.rows[start:], self.messages[start:]
            self.next_seq = (self.rows[-1].seq if self.rows else 0) + 1
            self.last_user = next((t for t in reversed(self.rows) if t.role == TurnRole.USER), None)
            raise
        finally:
            self._pending = None

    def flush(self) -> None:
        """Write the batched turns now (one INSERT; their ids are set)."""
        if self._pending:
            pending, self._pending[:] = list(self._pending), []
            insert_turns(pending)


def insert_turns(rows: list[Turn]) -> None:
    """One multi-row INSERT, its SQL written once (veronica.plumbing.returning.insert_rows)."""
    from veronica.plumbing.returning import insert_rows

    insert_rows(Turn, rows)


def dangling_calls(rows: list[Turn]) -> list[dict]:
    """Tool calls of the last assistant turn that have no result yet (held, asked, or interrupted)."""
    last_assistant = next((t for t in reversed(rows) if t.role == TurnRole.ASSISTANT), None)
    if last_assistant is None or not last_assistant.tool_calls:
        return []
    answered = {t.tool_call_id for t in rows if t.role == TurnRole.TOOL and t.seq > last_assistant.seq}
    return [c for c in last_assistant.tool_calls if c["id"] not in answered]
