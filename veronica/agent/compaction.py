"""Compaction. micro: elide older tool outputs (no model call). full: one summarizing call that
replaces the conversation before the work in progress with a summary.

Compaction always holds the member's run slot, so it never races a run: the operator's verb claims
the slot like a wake (veronica.engine.supervisor.compact), and the automatic one runs inside the
run that is about to pass the threshold (`maybe_compact`). Its writes are fenced by that lease and
its summarizing call is metered like any other.
"""
from __future__ import annotations

from django.conf import settings
from django.db.models.functions import Now

from veronica.swarm import events
from veronica.agent import metering, transcript
from veronica.agent.providers import Provider, get_provider, member_key, split_spec
from veronica.agent.providers.base import Cancelled as ProviderCancelled
from veronica.agent.providers.base import ProviderError
from veronica.agent.runctx import RunContext
from veronica.plumbing.errors import storable
from veronica.models import Member, Phase, Session, Turn, TurnRole

KEEP_RECENT = 6
DEEP_KEEP = 4  # a run too long on its own keeps its last two steps (call + result) verbatim
SUMMARY_SYSTEM = ("Summarize this agent conversation for the agent itself: the goals, what was done, open threads, "
                  "and facts it must not forget. Be concise; bullet points.")
COPIED = ("role", "content", "tool_calls", "tool_call_id", "tool_name", "elided", "mail_ids", "tokens")


def context_window(spec: str) -> int:
    """The model's context window in tokens: exact name, then the longest known prefix, then the default."""
    kind, model = split_spec(spec)
    name = model or kind
    windows = settings.CONTEXT_WINDOWS
    if name in windows:
        return windows[name]
    prefixes = [key for key in windows if name.startswith(key)]
    return windows[max(prefixes, key=len)] if prefixes else settings.CONTEXT_WINDOW_DEFAULT


def threshold(spec: str) -> int:
    return context_window(spec) * settings.COMPACT_AT_PERCENT // 100


def compact_session(member: Member, kind: str, ctx: RunContext, *, actor: str) -> dict:
    """The operator's compaction (the caller has claimed the slot)."""
    session = transcript.open_session(member)
    rows = transcript.turns(session)
    before = member.phase
    ctx.phase(Phase.COMPACTING)
    if kind == "micro":
        with ctx.fenced():
            result = _micro(session, rows)
    else:
        result = _full(member, ctx, session, rows)
    with ctx.fenced():
        events.emit(member.space_id, "member.compacted", member=member, actor=actor, **result)
    ctx.phase(Phase.ERROR if before == Phase.ERROR else Phase.READY)  # a parked member stays visibly parked
    return result


def maybe_compact(member: Member, ctx: RunContext, session: Session, rows: list[Turn], system: str,
                  tools: list[dict], provider: Provider) -> tuple[Session, list[Turn]]:
    """Before a model call: compact when the request would pass the threshold of the model's window.
    micro first (free); full (one metered call) only if that was not enough."""
    limit = threshold(member.model)
    size = metering.estimate_tokens(system, transcript.to_messages(rows), tools)
    if size < limit:
        return session, rows
    ctx.phase(Phase.COMPACTING)
    with ctx.fenced():
        result = _micro(session, rows)
    rows = transcript.turns(session)
    for deep in (False, True):  # the earlier conversation first; then this run's own older steps
        if metering.estimate_tokens(system, transcript.to_messages(rows), tools) < limit:
            break
        result = {**_full(member, ctx, session, rows, provider, deep=deep), "elided": result["elided"]}
        session = transcript.open_session(member)
        rows = transcript.turns(session)
    after = metering.estimate_tokens(system, transcript.to_messages(rows), tools)
    with ctx.fenced():
        events.emit(member.space_id, "member.compacted", member=member, actor="auto", tokens_before=size, threshold=limit,
                    tokens_after=after, **result)
    ctx.phase(Phase.THINKING)
    return session, rows


def _micro(session: Session, rows: list[Turn]) -> dict:
    old = [t.pk for t in rows[:-KEEP_RECENT] if t.role == TurnRole.TOOL and not t.elided]
    session.turns.filter(pk__in=old).update(elided=True)
    return {"mode": "micro", "elided": len(old)}


def split(rows: list[Turn], *, deep: bool = False) -> tuple[list[Turn], list[Turn]]:
    """What to summarize and what must survive verbatim. A finished conversation is summarized whole.
    Work in progress (an unanswered brief, tool results, held calls) keeps its last brief and what
    followed; deep (one run that alone is too long) keeps only its recent steps, from a model turn on,
    so no tool result is ever separated from its call."""
    if not rows or (rows[-1].role == TurnRole.ASSISTANT and not rows[-1].tool_calls):
        return rows, []
    cut = max((i for i, t in enumerate(rows) if t.role == TurnRole.USER), default=0)
    if deep or cut == 0:
        cut = len(rows) - DEEP_KEEP
        while cut > 1 and rows[cut].role != TurnRole.ASSISTANT:
            cut -= 1
        if cut <= 1:
            return [], rows
    return rows[:cut], rows[cut:]


def _full(member: Member, ctx: RunContext, session: Session, rows: list[Turn], provider: Provider | None = None,
          *, deep: bool = False) -> dict:
    head, tail = split(rows, deep=deep)
    if not head:
        return {"mode": "full", "turns": 0}
    summary = _summarize(member, ctx, head, provider)  # the model call runs outside any transaction
    briefs = [t for t in head if t.role == TurnRole.USER]
    if tail and briefs and not any(t.role == TurnRole.USER for t in tail):  # the goal in progress stays verbatim
        summary += "\n\nThe request you are working on (verbatim):\n" + briefs[-1].content
    with ctx.fenced():
        Session.objects.filter(pk=session.pk).update(ended_at=Now(), end_reason="compacted")
        fresh = Session.objects.create(member=member)
        transcript.append(fresh, TurnRole.USER, summary)
        if not tail or tail[0].role == TurnRole.USER:  # roles keep alternating
            transcript.append(fresh, TurnRole.ASSISTANT, "Understood; continuing from this summary.")
        for turn in tail:  # the work in progress carries over verbatim (an unanswered brief keeps its mail ids)
            transcript.append(fresh, turn.role, **{f: getattr(turn, f) for f in COPIED if f != "role"})
    return {"mode": "full", "turns": len(head), "kept": len(tail), "summary_chars": len(summary)}


def _summarize(member: Member, ctx: RunContext, head: list[Turn], provider: Provider | None) -> str:
    if split_spec(member.model)[0] == "offline":
        digest = [f"- {t.role}: {(t.content or ', '.join(c['name'] for c in t.tool_calls))[:200]}" for t in head[-20:]]
        return "Summary of the earlier conversation (deterministic digest):\n" + "\n".join(digest)
    messages = transcript.to_messages(head) + [{"role": "user", "content": "Summarize the conversation above."}]
    try:
        key = None if provider else member_key(member)
        provider = provider or (get_provider(member.model, key) if key else get_provider(member.model))
        reply = provider.complete(SUMMARY_SYSTEM, messages, [], should_stop=ctx.should_stop)
    except ProviderCancelled:
        raise ctx.stop_reason() from None
    except ProviderError as exc:
        metering.record(ctx, member.model, exc.usage, purpose="compaction")
        raise
    metering.record(ctx, reply.model or member.model, metering.with_usage(reply, SUMMARY_SYSTEM, messages, []).usage,
                    purpose="compaction")
    if reply.empty:
        raise ProviderError("the summarizing call returned an empty reply; the transcript was left as it was")
    return "Summary of the earlier conversation:\n" + storable(reply.text)  # kept like any reply
