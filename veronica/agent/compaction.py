"""Compaction. micro: elide older tool outputs (no model call). full: one summarizing call that
replaces the transcript with a brief. The supervisor verb refuses a busy member before we get here."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from veronica import events
from veronica.agent import transcript
from veronica.agent.providers import get_provider, split_spec
from veronica.models import Member, Phase, Session, TurnRole

KEEP_RECENT = 6
SUMMARY_SYSTEM = ("Summarize this agent conversation for the agent itself: the goals, what was done, open threads, "
                  "and facts it must not forget. Be concise; bullet points.")


def _phase(member: Member, phase: str) -> None:
    from veronica.engine.runner import set_phase

    set_phase(member, phase)


def compact_session(member: Member, kind: str, *, actor: str) -> dict:
    session = transcript.open_session(member)
    rows = transcript.turns(session)
    _phase(member, Phase.COMPACTING)
    try:
        if kind == "micro":
            old = [t.pk for t in rows[:-KEEP_RECENT] if t.role == TurnRole.TOOL and not t.elided]
            session.turns.filter(pk__in=old).update(elided=True)
            result = {"mode": "micro", "elided": len(old)}
        else:
            result = {"mode": "full", **_full(member, session, rows)}
        events.emit(member.space_id, "member.compacted", member=member, actor=actor, **result)
        return result
    finally:
        _phase(member, Phase.READY)


def _full(member: Member, session: Session, rows) -> dict:
    if not rows:
        return {"turns": 0}
    if split_spec(member.model)[0] == "offline":
        digest = [f"- {t.role}: {(t.content or ', '.join(c['name'] for c in t.tool_calls))[:200]}" for t in rows[-20:]]
        summary = "Summary of the earlier conversation (deterministic digest):\n" + "\n".join(digest)
    else:
        reply = get_provider(member.model).complete(SUMMARY_SYSTEM, transcript.to_messages(rows) +
                                                    [{"role": "user", "content": "Summarize the conversation above."}], [],
                                                    should_stop=lambda: False)
        summary = "Summary of the earlier conversation:\n" + reply.text
    with transaction.atomic():
        Session.objects.filter(pk=session.pk).update(ended_at=timezone.now(), end_reason="compacted")
        fresh = Session.objects.create(member=member)
        transcript.append(fresh, TurnRole.USER, summary)
        transcript.append(fresh, TurnRole.ASSISTANT, "Understood; continuing from this summary.")
    return {"turns": len(rows), "summary_chars": len(summary)}
