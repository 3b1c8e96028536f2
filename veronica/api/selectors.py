"""Reads for the console and the JSON API: plain dicts, a fixed number of queries each.

Markdown fields carry an `html` twin rendered by render_markdown (sanitized). Nothing here writes.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime

from django.db import connection
from django.db.models import Count, IntegerField, Min, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from veronica.swarm import blackboard as board_verbs, ledger
from veronica.engine import budget, checks
from veronica.plumbing.errors import NotFound, VeronicaError
from veronica.plumbing.markdown import render_markdown
from veronica.swarm.chat import message_row  # noqa: F401 (the message's wire shape lives with the chat verbs)
from veronica.swarm.session_usage import with_session_usage
from veronica.models import (
    ROLE_RANK, AccessRole, Approval, ApprovalStatus, Blackboard, Event, Member, MemoryFile, Message, Question, Session, Skill, Space, Task, TaskStatus,
    Turn, UsageDay,
)

log = logging.getLogger(__name__)

BOARD_ORDER = [TaskStatus.PENDING, TaskStatus.READY, TaskStatus.RUNNING, TaskStatus.VERIFYING, TaskStatus.BLOCKED,
               TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED]
MAX_LIMIT = 500


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


# --- query parameters ------------------------------------------------------------------------------

def int_param(params, name: str, default: int | None, *, minimum: int = 0, maximum: int | None = None) -> int | None:
    """A strict integer query parameter: bad or out-of-range values are a 400 naming the limit."""
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise VeronicaError(f"{name} must be an integer", field=name) from None
    if value < minimum or (maximum is not None and value > maximum):
        limit = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise VeronicaError(f"{name} is {value}; it must be {limit}", field=name)
    return value


def choice_param(params, name: str, choices: list[str]) -> str | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    if raw not in choices:
        raise VeronicaError(f"{name} must be one of {', '.join(choices)}", field=name)
    return raw


# --- spaces and roster -----------------------------------------------------------------------------

def count_per_space(qs: QuerySet) -> Coalesce:
    """A correlated COUNT(*) of qs's rows in the outer space: one index range per space, so the
    list costs members + tasks + approvals rows, not their product (three JOINs and COUNT DISTINCT)."""
    counted = qs.filter(space=OuterRef("pk")).order_by().values("space").annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


class CappedCount(Subquery):
    """COUNT(*) of a sliced subquery's rows: counting stops at the slice's end (one index range of at most
    that many entries), where a plain COUNT reads every matching row."""
    template = "(SELECT COUNT(*) FROM (%(subquery)s) AS capped)"

    def __init__(self, queryset: QuerySet, **extra) -> None:
        super().__init__(queryset, output_field=IntegerField(), **extra)


OPEN_TASKS_CAP = 1_000  # the spaces list says "1,000+" past it, like a board column


def open_tasks_per_space() -> CappedCount:
    """The outer space's open tasks, counted up to OPEN_TASKS_CAP + 1 (more than the cap: "1,000+")."""
    open_tasks = Task.objects.filter(space=OuterRef("pk"), status__in=sorted(ledger.OPEN)).order_by().values("pk")
    return CappedCount(open_tasks[:OPEN_TASKS_CAP + 1])


def space_list(spaces: QuerySet[Space], roles: dict[int, str]) -> list[dict]:
    """open_tasks is exact up to OPEN_TASKS_CAP; past it, open_tasks is the cap and open_tasks_more is true (an exact
    count read every open task of each space on each call: 20,000 index entries for a space of 100,000 tasks)."""
    rows = spaces.only("slug", "name", "description", "event_seq").annotate(  # not each space's settings and JSON
        member_count=count_per_space(Member.objects.filter(removed_at__isnull=True)),
        open_tasks=open_tasks_per_space(),
        pending_approvals=count_per_space(Approval.objects.filter(status=ApprovalStatus.PENDING)),
    ).order_by("name")
    return [{"slug": s.slug, "name": s.name, "description": s.description, "role": roles.get(s.pk), "event_seq": s.event_seq,
             "members": s.member_count, "open_tasks": min(s.open_tasks, OPEN_TASKS_CAP),
             "open_tasks_more": s.open_tasks > OPEN_TASKS_CAP, "pending_approvals": s.pending_approvals} for s in rows]


def _usage_by_member(space: Space) -> dict[int, UsageDay]:
    return {u.member_id: u for u in UsageDay.objects.filter(space=space, day=budget.today())}


def member_row(member: Member, usage: UsageDay | None) -> dict:
    task = member.current_task
    return {
        "name": member.name,
        "role": member.role,
        "model": member.model,
        "membership": member.membership,
        "run_status": member.run_status,
        "phase": member.phase,
        "tool": member.phase_tool,
        "display_phase": member.display_phase,
        "state": member.display_phase.split(":", 1)[0],
        "phase_since": iso(member.phase_since),
        "current_task": {"id": task.pk, "title": task.title, "status": task.status} if task else None,
        "permission_mode": member.permission_mode,
        "schedule": member.schedule,
        "session_tokens": getattr(member, "session_tokens", 0),
        "last_turn_input": getattr(member, "last_turn_input", 0),
        "tokens_today": usage.total_tokens if usage else 0,
        "usd_today": str(usage.usd) if usage else "0",
        "tripped": bool(usage and usage.tripped),
        "budget": budget.effective_budget(member),
        "offline": member.model.startswith("offline"),
        "error_reason": member.error_reason,  # the failure model: why it failed, and whether it is parked
        "parked": bool(member.parked_config) and member.parked_config == f"{member.model}|{member.permission_mode}",
        "retry_at": iso(member.retry_at),
    }


def live_members(space: Space) -> QuerySet[Member]:
    return with_session_usage(Member.objects.filter(space=space, removed_at__isnull=True).select_related("current_task"))


# what member_row never reads: a member's prompt text and tool lists (kilobytes each, five JSON fields decoded
# per row), its current task's spec, result and evidence; a 50-member roster read them all on each refresh
ROSTER_UNREAD = ("persona", "when_to_use", "fallback", "rule_domains", "tools", "deferred_tools", "runtime_fields",
                 "current_task__spec", "current_task__result", "current_task__check_evidence", "current_task__status_reason")


def roster(space: Space) -> list[dict]:
    usage = _usage_by_member(space)
    rows = []
    for member in live_members(space).defer(*ROSTER_UNREAD).order_by("role", "name"):
        member.space = space  # effective_budget reads the space default; no query per row
        rows.append(member_row(member, usage.get(member.pk)))
    return rows


def space_counts(space: Space) -> dict:
    by_status = dict(Task.objects.filter(space=space).values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    return {
        "tasks": {s.value: by_status.get(s.value, 0) for s in BOARD_ORDER},
        "pending_approvals": Approval.objects.filter(space=space, status=ApprovalStatus.PENDING).count(),
        "open_questions": Question.objects.filter(space=space, answered_at__isnull=True).count(),
        "checks": checks.counts([space.pk])[space.pk],
    }


def space_detail(space: Space, role: str) -> dict:
    today = budget.space_today(space)
    return {
        "slug": space.slug, "name": space.name, "description": space.description, "role": role,
        "event_seq": Space.objects.filter(pk=space.pk).values_list("event_seq", flat=True).get(),
        "members": roster(space),
        "usage_today": {"tokens": today["tokens"], "usd": str(today["usd"])},
        "counts": space_counts(space),
        "settings": {"member_daily_tokens": space.member_daily_tokens, "daily_token_ceiling": space.daily_token_ceiling,
                     "blackboard_cap": space.blackboard_cap, "spawn_cap": space.spawn_cap,
                     "retention_days": space.retention_days, "webhook_secret_set": bool(space.webhook_secret),
                     "stale_task_minutes": space.stale_task_minutes, "stuck_run_minutes": space.stuck_run_minutes,
                     "mailbox_backlog_minutes": space.mailbox_backlog_minutes,
                     "verify_checks": [{"name": c["name"], "timeout": c["timeout"]} for c in space.verify_checks]},
    }


def usage_panel(space: Space, rows: list[dict] | None = None) -> dict:
    """Per member tokens today, with each bar's width relative to its budget (or to the busiest).
    rows: the roster when the caller has read it already (the space page shows both)."""
    rows = [dict(r) for r in (roster(space) if rows is None else rows)]
    peak = max([r["tokens_today"] for r in rows] + [1])
    for r in rows:
        scale = r["budget"] or peak
        r["pct"] = min(100, round(100 * r["tokens_today"] / scale)) if scale else 0
    return {"members": rows, "total": sum(r["tokens_today"] for r in rows), "checks": checks.counts([space.pk])[space.pk],
            "checks_configured": checks.configured(space)}


def waggle_saved(space: Space) -> list[dict] | None:
    """Estimated tokens saved by waggle replays per day; None hides the panel (app missing or failing)."""
    try:
        from waggle.service import saved_tokens_per_day

        days = saved_tokens_per_day(str(space.pk))
    except Exception:  # the waggle app is optional here: its absence or failure only hides the panel
        log.debug("waggle saved tokens unavailable", exc_info=True)
        return None
    peak = max([n for _, n in days] + [1])
    return [{"day": d.isoformat(), "tokens": n, "pct": round(100 * n / peak)} for d, n in days]


# --- members -----------------------------------------------------------------------------------------

def member_detail(member: Member, *, skills: list[dict] | None = None, memory: list[dict] | None = None,
                  usage: UsageDay | None = budget.UNREAD) -> dict:
    """skills / memory / usage (today's UsageDay row or None): already read for this member (the member page shows
    them in panels of their own too: read once)."""
    if usage is budget.UNREAD:
        usage = UsageDay.objects.filter(member=member, day=budget.today()).first()
    if not hasattr(member, "session_tokens"):
        numbers = with_session_usage(Member.objects.filter(pk=member.pk)).values("session_tokens", "last_turn_input").get()
        member.session_tokens, member.last_turn_input = numbers["session_tokens"], numbers["last_turn_input"]
    out = member_row(member, usage)
    out.update({
        "when_to_use": member.when_to_use,
        "persona_html": render_markdown(member.persona),
        "schedule": schedule_of(member),
        "rule_domains": member.rule_domains,
        "spawned_from": member.spawned_from.name if member.spawned_from_id else None,
        "skills": skills_of(member) if skills is None else skills,
        "memory": memory_of(member) if memory is None else memory,
    })
    return out


def schedule_of(member: Member) -> dict:
    return {"cron": member.schedule, "origin": member.schedule_origin, "set_at": iso(member.schedule_set_at),
            "tombstone": member.schedule_tombstone, "next_at": iso(member.schedule_next_at)}


def skills_of(member: Member) -> list[dict]:
    """The member's own skills and the space's shared ones it has no own skill of that name for (one statement)."""
    both = list(Skill.objects.filter(Q(member=member) | Q(member__isnull=True), space_id=member.space_id))
    own = {s.name for s in both if s.member_id}
    rows = sorted((s for s in both if s.member_id or s.name not in own), key=lambda s: s.name)
    return [{"name": s.name, "scope": s.scope, "description": s.description, "body": s.body,
             "html": render_markdown(s.body), "updated_at": iso(s.updated_at)} for s in rows]


def memory_row(f: MemoryFile) -> dict:
    return {"name": f.name, "content": f.content, "chars": len(f.content), "html": render_markdown(f.content),
            "updated_at": iso(f.updated_at)}


def memory_of(member: Member) -> list[dict]:
    return [memory_row(f) for f in MemoryFile.objects.filter(member=member)]


def transcript(member: Member, *, session_id: int | None = None, after: int | None = None, limit: int = 200) -> dict:
    """One session's turns (the open or latest one by default), the last `limit` or those after a seq."""
    sessions = list(Session.objects.filter(member=member).order_by("-id").values("id", "started_at", "ended_at", "end_reason")[:50])
    if session_id is not None:
        session = Session.objects.filter(member=member, pk=session_id).values("id", "started_at", "ended_at", "end_reason").first()
        if session is None:
            raise NotFound(f"{member.name} has no session #{session_id}", field="session")
    else:
        session = sessions[0] if sessions else None
    turns: list[Turn] = []
    if session is not None:
        qs = Turn.objects.filter(session_id=session["id"])
        if after is not None:
            turns = list(qs.filter(seq__gt=after).order_by("seq")[:limit])
        else:
            turns = list(reversed(qs.order_by("-seq")[:limit]))
    return {
        "session": _session_dict(session),
        "sessions": [_session_dict(s) for s in sessions],
        "turns": [{"seq": t.seq, "role": t.role, "content": t.content, "html": render_markdown(t.content),
                   "tool_calls": t.tool_calls, "calls": _calls(t.tool_calls), "tool_name": t.tool_name, "tool_call_id": t.tool_call_id,
                   "elided": t.elided, "created_at": iso(t.created_at)} for t in turns],
    }


def _calls(tool_calls: object) -> list[dict]:
    """Tool calls as {name, args_text} whatever shape the provider stored them in."""
    out = []
    for call in tool_calls if isinstance(tool_calls, list) else []:
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        args = call.get("args", call.get("arguments", function.get("arguments", {})))
        text = args if isinstance(args, str) else json.dumps(args, sort_keys=True, default=str)
        out.append({"name": str(call.get("name") or function.get("name") or "tool"), "args_text": text[:2000]})
    return out


def _session_dict(session: dict | None) -> dict | None:
    if session is None:
        return None
    return {"id": session["id"], "started_at": iso(session["started_at"]), "ended_at": iso(session["ended_at"]),
            "end_reason": session["end_reason"]}


# --- tasks, messages, events ---------------------------------------------------------------------------

def check_results(task: Task, role: str) -> list[dict]:
    """The task's check results; a viewer's copy leaves out each command (a command line may carry
    a token or an internal address: it is for those who steer, like the checks' configuration)."""
    attempts = checks.results_of(task)
    if ROLE_RANK[role] < ROLE_RANK[AccessRole.OPERATOR]:
        for attempt in attempts:
            attempt["checks"] = [{k: v for k, v in c.items() if k != "command"} for c in attempt["checks"]]
    return attempts


def configured_checks(space: Space, role: str) -> list[dict]:
    """The space's checks as the task page lists them: names and timeouts, commands from operator up."""
    show = ROLE_RANK[role] >= ROLE_RANK[AccessRole.OPERATOR]
    return [{"name": c["name"], "timeout": c["timeout"], **({"command": c["command"]} if show else {})} for c in space.verify_checks]


def task_row(task: Task) -> dict:
    return {"id": task.pk, "title": task.title, "status": task.status, "assignee": task.assignee.name if task.assignee_id else None,
            "creator": task.creator_name, "spec": task.spec, "result": task.result, "status_reason": task.status_reason,
            "verify_policy": task.verify_policy, "engine_managed": task.engine_managed,
            "checking": checks.pending(task), "check_evidence": task.check_evidence,
            "created_at": iso(task.created_at), "updated_at": iso(task.updated_at),
            "started_at": iso(task.started_at), "finished_at": iso(task.finished_at)}


TASK_COLUMNS = tuple(f.name for f in Task._meta.concrete_fields)


def tasks(space: Space, *, status: str | None = None, assignee: str | None = None, limit: int = 200) -> list[dict]:
    # of the assignee only its name: its whole row (persona, tool lists) per task was 40% of a 200-task list's cost
    qs = Task.objects.filter(space=space).select_related("assignee").only(*TASK_COLUMNS, "assignee__name")
    if status:
        qs = qs.filter(status=status)
    if assignee:
        if not Member.objects.filter(space=space, name=assignee).exists():
            raise VeronicaError(f"no member named '{assignee}' in this space", field="assignee")
        qs = qs.filter(assignee__name=assignee)
    return [task_row(t) for t in qs.order_by("-updated_at", "-id")[:limit]]


BOARD_COUNT_CAP = 1_000  # a column past it says "1,000+": nobody reads the board for the exact count of done tasks


def capped_status_counts(space: Space, cap: int) -> dict[str, int]:
    """The space's tasks per status, each counted up to cap + 1 only, in one statement: a column of 80,000
    done tasks reads cap + 1 index entries, not 80,000 (an exact GROUP BY read every task of the space on
    each board refresh: 96-146 ms at 100,000 tasks). A count over cap means "more than cap"; the API's
    space_counts stays exact."""
    one = f"(SELECT COUNT(*) FROM (SELECT 1 FROM {Task._meta.db_table} WHERE space_id = %s AND status = %s LIMIT %s) AS c)"
    params = [p for s in BOARD_ORDER for p in (space.pk, s.value, cap + 1)]
    with connection.cursor() as cur:
        cur.execute("SELECT " + ", ".join([one] * len(BOARD_ORDER)), params)
        return dict(zip((s.value for s in BOARD_ORDER), cur.fetchone()))


CARD_FIELDS = ("id", "title", "status", "creator_name", "verify_policy", "check_evidence", "status_reason", "assignee__name")


def task_card(row: dict) -> dict:
    """What a board card shows, from a row of CARD_FIELDS: no spec or result (a column of 50 read each whole,
    and each assignee's persona)."""
    return {"id": row["id"], "title": row["title"], "status": row["status"], "assignee": row["assignee__name"],
            "creator": row["creator_name"], "checking": checks.status_pending(row["status"], row["verify_policy"]),
            "check_evidence": row["check_evidence"], "status_reason": row["status_reason"]}


def board_cards(space: Space, statuses: list[str], per_column: int) -> dict[str, list[dict]]:
    """The newest per_column cards of each status, newest first, as plain rows (no model per card). On
    PostgreSQL one statement, a UNION ALL of one index range per column (it was one statement per
    non-empty column, each compiled and sent on its own); SQLite cannot limit the parts of a compound
    statement, so there it stays one statement per column."""
    recent = Task.objects.filter(space=space).order_by("-updated_at", "-id").values(*CARD_FIELDS, "updated_at")
    parts = [recent.filter(status=s)[:per_column] for s in statuses]
    if not parts:
        return {}
    if connection.features.supports_slicing_ordering_in_compound:
        rows = list(parts[0].union(*parts[1:], all=True)) if len(parts) > 1 else list(parts[0])
    else:
        rows = [row for part in parts for row in part]
    rows.sort(key=lambda r: (r["updated_at"], r["id"]), reverse=True)  # a union's order is the database's own
    cards: dict[str, list[dict]] = {s: [] for s in statuses}
    for row in rows:
        cards[row["status"]].append(task_card(row))
    return cards


def task_board(space: Space, per_column: int = 50) -> list[dict]:
    """Columns in lifecycle order; each shows its most recent tasks and its count, "1,000+" past the cap."""
    cap = BOARD_COUNT_CAP
    counts = capped_status_counts(space, cap)
    cards = board_cards(space, [s.value for s in BOARD_ORDER if counts[s.value]], per_column)
    return [{"status": s.value, "count": min(counts[s.value], cap), "more": counts[s.value] > cap,
             "tasks": cards.get(s.value, [])} for s in BOARD_ORDER]


def messages(space: Space, *, member: str | None = None, before: int | None = None, limit: int = 50) -> dict:
    """Newest first, paged by id: pass next_before back as before for the next page."""
    qs = Message.objects.filter(space=space)
    if member:
        if member != "operator" and not Member.objects.filter(space=space, name=member).exists():
            raise VeronicaError(f"no member named '{member}' in this space", field="member")
        qs = qs.filter(Q(sender_name=member) | Q(recipient_name=member))
    if before is not None:
        qs = qs.filter(pk__lt=before)
    rows = list(qs.order_by("-id")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return {"messages": [message_row(m) for m in rows], "next_before": rows[-1].pk if more and rows else None}


def events_after(space: Space, after: int, limit: int = 200) -> dict:
    rows = list(Event.objects.filter(space=space, seq__gt=after).order_by("seq")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    out = {"events": [e.as_wire() for e in rows], "last_seq": rows[-1].seq if rows else after, "more": more}
    if not rows or rows[0].seq > after + 1:  # seqs are gapless, so a jump means retention purged them
        oldest = Event.objects.filter(space=space).aggregate(m=Min("seq"))["m"]
        if oldest is not None and oldest > after + 1:
            out["purged_through"] = oldest - 1
    return out


# --- approvals and questions ---------------------------------------------------------------------------

# what approval_row and question_row read: selecting the whole member and user rows they join (50 columns)
# cost more to compile and decode than the rows themselves (the space page asks on every refresh, mostly for none)
APPROVAL_READ = ("id", "tool_name", "tool_args", "status", "reason", "decided_at", "created_at", "member__name",
                 "decided_by__username")
QUESTION_READ = ("id", "text", "answer", "answered_at", "created_at", "member__name", "answered_by__username")


def approval_row(a: Approval) -> dict:
    return {"id": a.pk, "member": a.member.name, "tool": a.tool_name, "args": a.tool_args, "status": a.status,
            "reason": a.reason, "decided_by": a.decided_by.get_username() if a.decided_by_id else None,
            "decided_at": iso(a.decided_at), "created_at": iso(a.created_at)}


def approvals(space: Space, *, status: str | None = ApprovalStatus.PENDING, limit: int = 100) -> list[dict]:
    qs = Approval.objects.filter(space=space).select_related("member", "decided_by").only(*APPROVAL_READ)
    if status:
        qs = qs.filter(status=status)
    return [approval_row(a) for a in qs.order_by("id" if status == ApprovalStatus.PENDING else "-id")[:limit]]


def question_row(q: Question) -> dict:
    return {"id": q.pk, "member": q.member.name, "text": q.text, "html": render_markdown(q.text), "answer": q.answer,
            "answered_by": q.answered_by.get_username() if q.answered_by_id else None,
            "answered_at": iso(q.answered_at), "created_at": iso(q.created_at)}


def questions(space: Space, *, open_only: bool = True, limit: int = 100) -> list[dict]:
    qs = Question.objects.filter(space=space).select_related("member", "answered_by").only(*QUESTION_READ)
    if open_only:
        qs = qs.filter(answered_at__isnull=True)
    return [question_row(q) for q in qs.order_by("id" if open_only else "-id")[:limit]]


def get_question(space: Space, question_id: int) -> Question:
    question = Question.objects.filter(space=space, pk=question_id).select_related("member").first()
    if question is None:
        raise NotFound(f"no question #{question_id} in this space", field="question_id")
    return question


# --- blackboard ----------------------------------------------------------------------------------------

def blackboard(space: Space) -> dict:
    board = Blackboard.objects.filter(space=space).first() or Blackboard(space=space)  # a read never writes
    return {"content": board.content, "html": render_markdown(board.content), "updated_by": board.updated_by,
            "updated_at": iso(board.updated_at), "age": board_verbs.age_string(board.updated_at, timezone.now()),
            "chars": len(board.content), "cap": space.blackboard_cap}
