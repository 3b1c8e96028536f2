"""System prompt and wake brief. Both are built at run start from the rows, so skill and prompt
changes apply at the next run boundary and never mid-run."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from veronica.agent import runstart
from veronica.swarm import blackboard, memory
from veronica.plumbing.compiled_select import fetch
from veronica.models import Member, Message, Task, TaskStatus
from veronica.swarm.skills import skills_for

if TYPE_CHECKING:
    from veronica.agent.tools import Tool

log = logging.getLogger(__name__)

WAKE_REASONS = {
    "message": "you have new mail",
    "task": "a task was dispatched to you",
    "timer": "your schedule fired",
    "alarm": "an alarm you (or a teammate) set went off",
    "resume": "you were resumed or an operator answered you",
}


def rules_block(member: Member) -> str | None:
    """The learning app's rules for this member's routed domains: its own space's domains and the
    global ones it names, never another space's (never waits on a pass)."""
    if not member.rule_domains:
        return None
    try:
        from veronica.swarm.learning_bridge import member_rules_block
    except ImportError:  # pragma: no cover
        return None
    try:
        return member_rules_block(member)
    except Exception:  # a broken rule store must not stop a run
        log.exception("rules block failed for %s", member.name)
        return None


def system_parts(member: Member, tools: "dict[str, Tool] | None" = None) -> list[tuple[str, str]]:
    """The system prompt as (part, text) pairs, in order: the prompt inspector counts each one. Given
    the run's tools, it names the member's deferred ones."""
    parts = [("persona", member.persona.strip() or f"You are {member.name}, a {member.role} in team {member.space.name}.")]
    parts.append(("identity", f"You are '{member.name}' ({member.role}) in the space '{member.space.name}'. Teammates reach you "
                              "by mail; use the tools to act. Your workspace tools only see the space's folder."))
    if member.when_to_use:
        parts.append(("when to use", f"When the team uses you: {member.when_to_use}"))
    catalog = [] if runstart.empty("skills") else skills_for(member)  # the run's claim found none: no read
    if catalog:
        lines = ["# Skills"]
        for skill in catalog:
            lines.append(f"## {skill.name}" + (f" — {skill.description}" if skill.description else ""))
            lines.append(skill.body.strip())
        parts.append(("skills", "\n".join(lines)))
    parts.append(("memory index", memory.prompt_block(member, [] if runstart.empty("memory") else None)))
    block = rules_block(member)
    if block:
        parts.append(("rules", block))
    if tools:
        from veronica.agent.tools import deferred_block, deferred_of

        block = deferred_block(tools, deferred_of(member, tools))
        if block:
            parts.append(("deferred tools", block))
    return parts


def system_prompt(member: Member, tools: "dict[str, Tool] | None" = None) -> str:
    return "\n\n".join(text for _, text in system_parts(member, tools))


def brief_parts(member: Member, source: str, unread: list[Message]) -> list[tuple[str, str]]:
    """The wake brief as (part, text) pairs: why it woke, its mail, its open tasks, the blackboard."""
    parts = [("wake", f"# Wake: {WAKE_REASONS.get(source, source)}")]
    if unread:
        lines = [f"\n## Unread mail ({len(unread)})"]
        for msg in unread:
            subject = f" — {msg.subject}" if msg.subject else ""
            task = f" [task #{msg.task_id}]" if msg.task_id else ""
            lines.append(f"\n### From {msg.sender_name}{subject}{task}\n{msg.body}")
        parts.append(("mail", "\n".join(lines)))
    tasks = [] if runstart.empty("tasks") else fetch(("open-tasks-of",), lambda s: Task.objects.filter(assignee_id=s.int("member")).exclude(
        status__in=[TaskStatus.DONE, TaskStatus.CANCELLED]).order_by("id")[:20], {"member": member.pk})  # compiled once
    if tasks:
        parts.append(("tasks", "\n".join(["\n## Your open tasks"] + [f"- #{t.pk} [{t.status}] {t.title}" for t in tasks])))
    # cut at the space's current cap, and says so; none to read when the run's claim found it empty
    board, content = (None, "") if runstart.empty("blackboard") else blackboard.for_members(member.space)
    if content:
        parts.append(("blackboard", f"\n## Blackboard (updated {blackboard.age_string(board.updated_at)} by {board.updated_by})\n"
                                    f"{content}"))
    return parts


def wake_brief(member: Member, source: str, unread: list[Message]) -> str:
    return "\n".join(text for _, text in brief_parts(member, source, unread))
