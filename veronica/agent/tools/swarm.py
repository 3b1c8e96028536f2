"""Swarm tools: thin wrappers over the verbs (bus, ledger, blackboard, skills, the roster, alarms, the meter)."""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from veronica.swarm import blackboard, bus, ledger, meter, skills
from veronica.agent.tools.base import I, S, Tool, ToolContext, ToolError, arg_int, arg_str
from veronica.engine import alarms, roster
from veronica.plumbing.errors import require_text
from veronica.models import Member, Role, Space, Task, TaskStatus
from veronica.swarm.session_usage import with_session_usage


class WaitForOperator(Exception):
    """ask_operator: the run parks (waiting-input) until the operator answers."""

    def __init__(self, question_id: int) -> None:
        super().__init__(question_id)
        self.question_id = question_id


def send_message(ctx: ToolContext, args: dict) -> str:
    rows = bus.send(ctx.space, ctx.member.name, arg_str(args, "to"), arg_str(args, "body"),
                    subject=arg_str(args, "subject", required=False, max_len=200))
    return f"sent to {', '.join(r.recipient_name for r in rows) or 'nobody (no active recipients)'}"


def list_members(ctx: ToolContext, args: dict) -> str:
    lines = []
    members = with_session_usage(Member.objects.filter(space=ctx.space, removed_at__isnull=True).select_related("current_task"))
    for m in members.order_by("role", "name"):
        cap = meter.effective_budget(m)
        sched = f" schedule '{m.schedule}' ({m.schedule_origin}{', set ' + m.schedule_set_at.date().isoformat() if m.schedule_set_at else ''})" if m.schedule else ""
        task = f" on task #{m.current_task.pk} ({m.current_task.title[:60]})" if m.current_task else ""
        lines.append(f"- {m.name} ({m.role}, {m.membership}, {m.display_phase}){task} today {meter.tokens_today(m)}/{cap or '∞'} tokens, "
                     f"session {m.session_tokens} (last turn input {m.last_turn_input}){sched}"
                     + (f" — {m.when_to_use}" if m.when_to_use else ""))
    return "\n".join(lines)


def is_stale(t: Task, space: Space, now=None) -> bool:
    """Running past the space's stale_task_minutes (the stale-task watchdog's own test)."""
    if t.status != TaskStatus.RUNNING or space.stale_task_minutes <= 0 or t.started_at is None:
        return False
    return t.started_at < (now or timezone.now()) - timedelta(minutes=space.stale_task_minutes)


def _task_line(t: Task) -> str:
    deps = ",".join(f"#{d}" for d in t.depends_on.values_list("pk", flat=True))
    stale = " [stale]" if is_stale(t, t.space) else ""
    line = f"#{t.pk} [{t.status}]{stale} {t.title} → {t.assignee.name if t.assignee_id else 'unassigned'}"
    if deps:
        line += f" (after {deps})"
    if t.result:
        line += f"\n    result: {t.result[:400]}"
    return line


def _member_arg(ctx: ToolContext, args: dict, key: str, *, required: bool = True) -> Member | None:
    name = arg_str(args, key, required=required)
    if not name:
        return None
    recipients = bus.resolve_recipients(ctx.space, name, ctx.member.name)
    if not recipients or len(recipients) != 1 or name == bus.BROADCAST:
        raise ToolError(f"'{key}' must name exactly one member")
    return recipients[0]


MAX_DEPENDS_ON = 1000


def task_create(ctx: ToolContext, args: dict) -> str:
    deps = args.get("depends_on") or []
    if not isinstance(deps, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in deps):
        raise ToolError("depends_on must be a list of task ids (integers)")
    if len(deps) > MAX_DEPENDS_ON or any(not 0 < d < 2 ** 63 for d in deps):  # a row id is a 64-bit integer
        raise ToolError(f"depends_on must hold at most {MAX_DEPENDS_ON} task ids, each a positive task number")
    not_before = None
    if args.get("delay_minutes") is not None:
        not_before = timezone.now() + timedelta(minutes=arg_int(args, "delay_minutes", minimum=0, maximum=60 * 24 * 30))
    task = ledger.create_task(ctx.space, ctx.member.name, arg_str(args, "title", max_len=200),
                              spec=arg_str(args, "spec", required=False), assignee=_member_arg(ctx, args, "assignee", required=False),
                              depends_on=deps, not_before=not_before, verify_policy=arg_str(args, "verify", required=False, default="auto"))
    task.refresh_from_db()
    return f"created {_task_line(task)}"


def task_assign(ctx: ToolContext, args: dict) -> str:
    task = ledger.get_task(ctx.space, arg_int(args, "task_id"))
    ledger.assign(task, _member_arg(ctx, args, "assignee"), actor=ctx.member.name)
    task.refresh_from_db()
    return f"assigned {_task_line(task)}"


def task_list(ctx: ToolContext, args: dict) -> str:
    qs = Task.objects.filter(space=ctx.space).select_related("assignee", "space").prefetch_related("depends_on").order_by("id")
    status = arg_str(args, "status", required=False)
    if status and status not in TaskStatus.values:
        raise ToolError(f"argument 'status' must be one of {', '.join(TaskStatus.values)}")
    if status:
        qs = qs.filter(status=status)
    if args.get("mine"):
        qs = qs.filter(assignee=ctx.member)
    return "\n".join(_task_line(t) for t in qs[:100]) or "(no tasks)"


def task_done(ctx: ToolContext, args: dict) -> str:
    task = ledger.get_task(ctx.space, arg_int(args, "task_id"))
    if task.assignee_id != ctx.member.pk and ctx.member.role != Role.LEADER:
        raise ToolError(f"task #{task.pk} is assigned to {task.assignee.name if task.assignee_id else 'nobody'}, not you")
    ledger.complete(task, actor=ctx.member.name, result=arg_str(args, "result", required=False),
                    failed=bool(args.get("failed", False)))
    return f"task #{task.pk} is now {task.status}{_checks_note(task)}"


def _checks_note(task: Task) -> str:
    if task.status != TaskStatus.VERIFYING or task.verify_policy != "checks":
        return ""
    names = ", ".join(c["name"] for c in _space_checks(task))
    return f"; its checks ({names}) are queued and the result comes back by mail"


def _space_checks(task: Task) -> list[dict]:
    return Space.objects.filter(pk=task.space_id).values_list("verify_checks", flat=True).get() or []


def task_update_status(ctx: ToolContext, args: dict) -> str:
    task = ledger.get_task(ctx.space, arg_int(args, "task_id"))
    ledger.transition(task, arg_str(args, "status"), actor=ctx.member.name, reason=arg_str(args, "reason", required=False))
    return f"task #{task.pk} is now {task.status}{_checks_note(task)}"


def blackboard_read(ctx: ToolContext, args: dict) -> str:
    board, content = blackboard.for_members(ctx.space)
    if not content:
        return "(the blackboard is empty)"
    return f"(updated {blackboard.age_string(board.updated_at)} by {board.updated_by})\n{content}"


def blackboard_write(ctx: ToolContext, args: dict) -> str:
    board = blackboard.write(ctx.space, ctx.member.name, arg_str(args, "content", max_len=1_000_000))
    return "blackboard cleared" if not board.content else f"blackboard replaced ({len(board.content)} characters)"


def schedule_set(ctx: ToolContext, args: dict) -> str:
    target = _member_arg(ctx, args, "member", required=False) or ctx.member
    member = roster.set_schedule(target, arg_str(args, "cron", max_len=120), actor=ctx.member.name)
    return f"{member.name} now wakes on '{member.schedule}' (next {member.schedule_next_at:%Y-%m-%d %H:%M} UTC)"


def schedule_clear(ctx: ToolContext, args: dict) -> str:
    target = _member_arg(ctx, args, "member", required=False) or ctx.member
    roster.clear_schedule(target, actor=ctx.member.name)
    return f"{target.name} has no schedule now"


def alarm_set(ctx: ToolContext, args: dict) -> str:
    target = _member_arg(ctx, args, "member", required=False) or ctx.member
    minutes = arg_int(args, "in_minutes", minimum=0, maximum=60 * 24 * 366)
    alarm = alarms.set_alarm(target, timezone.now() + timedelta(minutes=minutes), arg_str(args, "note", max_len=2000),
                             created_by=ctx.member.name)
    return f"alarm #{alarm.pk} for {target.name} at {alarm.fire_at:%Y-%m-%d %H:%M} UTC"


def skill_publish(ctx: ToolContext, args: dict) -> str:
    skill = skills.add_skill(ctx.space, arg_str(args, "name", max_len=80), arg_str(args, "body", max_len=50000),
                             description=arg_str(args, "description", required=False, max_len=300),
                             overwrite=bool(args.get("overwrite", False)), actor=ctx.member.name)
    return f"published shared skill '{skill.name}'; every member sees it from its next run"


def member_spawn(ctx: ToolContext, args: dict) -> str:
    base = _member_arg(ctx, args, "base")
    clone = roster.spawn(base, retire_policy=arg_str(args, "retire", required=False, default="on_complete"), actor=ctx.member.name)
    return f"spawned {clone.name} (clone of {base.name}, retire {clone.retire_policy})"


def member_retire(ctx: ToolContext, args: dict) -> str:
    member = _member_arg(ctx, args, "member")
    roster.retire(member, actor=ctx.member.name)
    return f"retired {member.name}"


def ask_operator(ctx: ToolContext, args: dict) -> str:
    from veronica.swarm import events
    from veronica.models import Question

    text = require_text(arg_str(args, "question", max_len=5000), "question", max_len=5000)
    question = Question.objects.create(space=ctx.space, member=ctx.member, text=text,
                                       tool_call_id=str(args.get("_call_id", "")))
    events.emit(ctx.space.pk, "question.asked", member=ctx.member, question=question.pk, text=question.text[:500])
    raise WaitForOperator(question.pk)


TOOLS = [
    Tool("send_message", "Mail a member by name, a role (e.g. 'leader'), 'all', or 'operator'.", send_message,
         {"to": S, "body": S, "subject": S}, ("to", "body"), mutates=True, gated=False),
    Tool("list_members", "The roster: names, roles, phases, budgets, schedules.", list_members),
    Tool("task_create", "Create a task (optionally assigned, with dependencies and a delay).", task_create,
         {"title": S, "spec": S, "assignee": S, "depends_on": {"type": "array", "items": I}, "delay_minutes": I, "verify": S},
         ("title",), mutates=True, gated=False),
    Tool("task_assign", "Assign a task to a member; a ready task starts now.", task_assign, {"task_id": I, "assignee": S},
         ("task_id", "assignee"), mutates=True, gated=False),
    Tool("task_list", "List tasks, optionally by status or only yours.", task_list, {"status": S, "mine": {"type": "boolean"}}),
    Tool("task_done", "Report a task finished (or failed) with a result.", task_done,
         {"task_id": I, "result": S, "failed": {"type": "boolean"}}, ("task_id",), mutates=True, gated=False),
    Tool("task_update_status", "Move a task to another status (the ledger refuses illegal moves).", task_update_status,
         {"task_id": I, "status": S, "reason": S}, ("task_id", "status"), mutates=True, gated=False),
    Tool("blackboard_read", "Read the team's shared blackboard.", blackboard_read),
    Tool("blackboard_write", "Replace the whole blackboard (empty clears it).", blackboard_write, {"content": S}, ("content",),
         mutates=True, gated=False),
    Tool("schedule_set", "Put a member (default: you) on a cron schedule.", schedule_set, {"cron": S, "member": S}, ("cron",),
         mutates=True, leader_only=True),
    Tool("schedule_clear", "Remove a member's cron schedule.", schedule_clear, {"member": S}, mutates=True, leader_only=True),
    Tool("alarm_set", "Wake a member (default: you) once, in N minutes, with a note.", alarm_set,
         {"in_minutes": I, "note": S, "member": S}, ("in_minutes", "note"), mutates=True, gated=False),
    Tool("skill_publish", "Publish a markdown skill shared with the whole team.", skill_publish,
         {"name": S, "body": S, "description": S, "overwrite": {"type": "boolean"}}, ("name", "body"), mutates=True, leader_only=True),
    Tool("member_spawn", "Clone a worker into a temporary member.", member_spawn, {"base": S, "retire": S}, ("base",),
         mutates=True, leader_only=True),
    Tool("member_retire", "Retire a spawned clone.", member_retire, {"member": S}, ("member",), mutates=True, leader_only=True),
    Tool("ask_operator", "Ask the human operator a question and wait for the answer.", ask_operator, {"question": S},
         ("question",), mutates=True, gated=False),
]
