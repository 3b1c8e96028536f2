"""The prompt inspector (issue 22.5): the exact system prompt and messages of a member's next model
call, or of any past one, with tokens per part and the share of the model's context window.

Tokens are estimated as compaction estimates them (characters / metering.CHARS_PER_TOKEN): the same
figure that decides when a session is compacted. A past call also shows what the vendor reported.

* The next call: the system prompt as the next run will build it (prompt and skill changes apply at
  the run boundary), the open session's messages, and the wake brief the unread mail would add (built
  by the run's own brief_parts; waggle may append a replayed route's output to it).
* A past call: the assistant turn's session up to that turn, and the system prompt kept on the Run
  row it was made in (runs before issue 22 kept none). Tool outputs that compaction elided later show
  as elided.

Nothing here writes; MCP servers are not contacted (their tools are listed at the run boundary).
"""
from __future__ import annotations

import json

from django.db.models import Q

from veronica.swarm import bus
from veronica.agent import compaction, transcript
from veronica.agent.metering import CHARS_PER_TOKEN
from veronica.agent.prompt import brief_parts, system_parts
from veronica.agent.tools import builtin_tools, deferred_of, offered_tools
from veronica.plumbing.errors import NotFound
from veronica.models import Member, Run, Session, Turn, TurnRole

ROLE_PART = {TurnRole.USER: "transcript: briefs", TurnRole.ASSISTANT: "transcript: replies", TurnRole.TOOL: "transcript: tool results"}
PAST_CALLS = 50


def tokens(chars: int) -> int:
    return chars // CHARS_PER_TOKEN


def _part(name: str, chars: int, window: int) -> dict:
    return {"part": name, "chars": chars, "tokens": tokens(chars), "share": round(100 * tokens(chars) / window, 2) if window else 0}


def _offered(member: Member) -> dict:
    """The member's offered built-in tools (its tool set applied; no MCP server is contacted)."""
    return offered_tools(member, builtin_tools(member.role))


def _tools(member: Member) -> tuple[list[dict], list[str]]:
    offered = _offered(member)
    unloaded = deferred_of(member, offered)  # named in the system prompt, not sent until first used
    specs = [t.spec() for name, t in offered.items() if name not in unloaded]
    servers = list(member.space.mcp_servers.filter(Q(member__isnull=True) | Q(member=member)).values_list("name", flat=True))
    return specs, servers


def _messages(rows: list[Turn]) -> list[dict]:
    out = []
    for turn, message in zip(rows, transcript.to_messages(rows)):
        chars = transcript.message_chars(message)
        out.append({"seq": turn.seq, "role": message["role"], "part": ROLE_PART.get(turn.role, turn.role), "chars": chars,
                    "tokens": tokens(chars), "message": message})
    return out


def _summary(member: Member, system: list[tuple[str, str]], specs: list[dict], messages: list[dict],
             brief: list[tuple[str, str]]) -> dict:
    window = compaction.context_window(member.model)
    parts = [_part(name, len(text), window) for name, text in system]
    separators = max(len(system) - 1, 0) * 2  # "\n\n" between the system prompt's parts
    if separators:
        parts.append(_part("separators", separators, window))
    parts.append(_part("tool definitions", len(json.dumps(specs)), window))
    by_role: dict[str, int] = {}
    for m in messages:
        by_role[m["part"]] = by_role.get(m["part"], 0) + m["chars"]
    parts += [_part(name, chars, window) for name, chars in by_role.items()]
    parts += [_part(f"next brief: {name}", len(text), window) for name, text in brief]
    total = sum(p["tokens"] for p in parts)
    return {"parts": parts, "total_tokens": total, "context_window": window, "compact_at": compaction.threshold(member.model),
            "share": round(100 * total / window, 2) if window else 0, "chars_per_token": CHARS_PER_TOKEN}


def next_call(member: Member) -> dict:
    """What the member's next model call would send, were it made now."""
    system = system_parts(member, _offered(member))
    specs, servers = _tools(member)
    session = Session.objects.filter(member=member, ended_at__isnull=True).first()
    rows = transcript.turns(session) if session else []
    unread = list(bus.unread_for(member))
    last = rows[-1] if rows else None
    brief = []
    note = ""
    if last is not None and last.role == TurnRole.TOOL:
        note = "The run finishes its interrupted tool calls first; new mail waits for the run after."
    elif unread:
        brief = brief_parts(member, "message", unread)
        if last is not None and last.role == TurnRole.USER:
            note = "The last brief is unanswered: the new one is folded into it."
    elif last is None or last.role == TurnRole.ASSISTANT:
        note = "Nothing is waiting: the next wake's brief (mail, tasks, blackboard) will be added to these messages."
    messages = _messages(rows)
    if brief:
        text = "\n".join(t for _, t in brief)
        messages.append({"seq": None, "role": "user", "part": "next brief", "chars": len(text), "tokens": tokens(len(text)),
                         "message": {"role": "user", "content": text}})
    summary = _summary(member, system, specs, [m for m in messages if m["seq"] is not None], brief)
    return {"member": member.name, "call": "next", "model": member.model, "system_prompt": "\n\n".join(t for _, t in system),
            "system_parts": [{"part": n, "text": t} for n, t in system], "messages": messages,
            "tools": [s["name"] for s in specs], "mcp_servers": servers, "note": note, **summary,
            "past_calls": past_calls(member)}


def past_calls(member: Member) -> list[dict]:
    rows = (Turn.objects.filter(session__member=member, role=TurnRole.ASSISTANT).order_by("-id")
            .values("id", "created_at", "input_tokens", "tokens")[:PAST_CALLS])
    return [{"id": r["id"], "created_at": r["created_at"].isoformat() if r["created_at"] else None,
             "input_tokens": r["input_tokens"], "tokens": r["tokens"]} for r in rows]


def past_call(member: Member, turn_id: int) -> dict:
    """The call that produced the assistant turn `turn_id`: its messages, and its run's system prompt."""
    turn = Turn.objects.filter(pk=turn_id, session__member=member, role=TurnRole.ASSISTANT).select_related("session").first()
    if turn is None:
        raise NotFound(f"no model call #{turn_id} of {member.name} (an assistant turn's id)", field="call")
    rows = list(turn.session.turns.filter(seq__lt=turn.seq).order_by("seq"))
    run = (Run.objects.filter(member=member, started_at__lte=turn.created_at).order_by("-started_at")
           .values("id", "system_prompt").first())
    system = run["system_prompt"] if run else ""
    specs, servers = _tools(member)
    messages = _messages(rows)
    summary = _summary(member, [("system prompt (as the run kept it)", system)], specs, messages, [])
    return {"member": member.name, "call": turn.pk, "model": member.model, "system_prompt": system,
            "system_parts": [{"part": "system prompt", "text": system}], "messages": messages, "run": run["id"] if run else None,
            "tools": [s["name"] for s in specs], "mcp_servers": servers, "reply": transcript.message(turn),
            "reported_input_tokens": turn.input_tokens,
            "note": "" if system else "This run kept no system prompt (it ran before the inspector existed, or has not ended).",
            **summary, "past_calls": past_calls(member)}
