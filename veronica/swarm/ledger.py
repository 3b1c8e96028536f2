"""The task ledger: the only code that changes a task's status.

Every move is checked against ALLOWED, then applied with a conditional UPDATE on the status it was
read in, so an illegal or raced move raises and leaves the row exactly as it was.
"""
from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from veronica.engine import check_queue
from veronica.swarm import audit, bus, events
from veronica.plumbing.errors import IllegalTransition, NotFound, VeronicaError, column_limit, require_text
from veronica.models import Member, Space, Task, TaskStatus, VerifyPolicy

S = TaskStatus
ALLOWED: dict[str, set[str]] = {
    S.PENDING: {S.READY, S.BLOCKED, S.CANCELLED},
    S.READY: {S.RUNNING, S.PENDING, S.BLOCKED, S.CANCELLED},
    S.RUNNING: {S.VERIFYING, S.DONE, S.FAILED, S.BLOCKED, S.CANCELLED, S.READY},  # ready: requeued (reassign)
    S.VERIFYING: {S.DONE, S.FAILED, S.RUNNING},
    S.BLOCKED: {S.READY, S.PENDING, S.RUNNING, S.CANCELLED},
    S.FAILED: {S.READY, S.CANCELLED},
    S.DONE: set(),
    S.CANCELLED: set(),
}
TERMINAL = {S.DONE, S.CANCELLED}
MAX_TITLE, MAX_SPEC, MAX_RESULT, MAX_REASON = column_limit(Task, "title"), 20000, 20000, 2000
OPEN = {S.PENDING, S.READY, S.RUNNING, S.VERIFYING, S.BLOCKED}


def get_task(space: Space, task_id: int) -> Task:
    task = Task.objects.filter(space=space, pk=task_id).select_related("assignee").first()
    if task is None:
        raise NotFound(f"no task #{task_id} in this space", field="task_id")
    return task


def deps_met(task: Task) -> bool:
    return not task.depends_on.exclude(status=S.DONE).exists()


def is_due(task: Task, now: datetime | None = None) -> bool:
    return task.not_before is None or task.not_before <= (now or timezone.now())


def transition(task: Task, to: str, *, actor: str, reason: str = "", **fields: object) -> Task:
    """Move one task. Raises IllegalTransition (naming what is allowed) and changes nothing."""
    if to not in S.values:
        raise VeronicaError(f"unknown status {to!r}; one of {', '.join(S.values)}", field="status")
    reason = require_text(reason, "reason", max_len=MAX_REASON, allow_empty=True).strip()
    current = task.status
    if to not in ALLOWED[current]:
        allowed = ", ".join(sorted(ALLOWED[current])) or "none (terminal)"
        raise IllegalTransition(f"task #{task.pk} cannot go from {current} to {to}; allowed from {current}: {allowed}", field="status")
    now = timezone.now()
    updates: dict[str, object] = {"status": to, "updated_at": now, **fields}
    if to == S.RUNNING and task.started_at is None:
        updates["started_at"] = now
    if to in (S.DONE, S.FAILED, S.CANCELLED):
        updates["finished_at"] = now
    if reason:
        updates["status_reason"] = reason
    with transaction.atomic():
        if task.assignee_id and (to == S.RUNNING or current == S.RUNNING):
            lock_member_first(task.assignee_id)
        if Task.objects.filter(pk=task.pk, status=current).update(**updates) != 1:
            raise IllegalTransition(f"task #{task.pk} changed while moving it from {current}; reload and retry")
        for key, value in updates.items():
            setattr(task, key, value)
        events.emit(task.space_id, "task.status", task=task.pk, title=task.title, frm=current, to=to, actor=actor,
                    reason=reason[:300], assignee=task.assignee.name if task.assignee_id else None)
        if task.assignee_id and (to == S.RUNNING or current == S.RUNNING):
            _track_current_task(task.assignee_id)
        if to == S.DONE:
            _release_dependents(task, actor)
        if to == S.VERIFYING:
            check_queue.enqueue_on_commit(task)
    return task


def lock_member_first(member_id: int) -> None:
    """Lock order on PostgreSQL: member row, then space row. A run's fenced write renews its lease
    (member) before it emits (space); a ledger write that emitted first and then touched the member
    (current_task) would deadlock with it. SQLite serializes writers (IMMEDIATE): nothing to do."""
    if connection.features.has_select_for_update:
        list(Member.objects.select_for_update().filter(pk=member_id).values_list("pk", flat=True))


def _track_current_task(member_id: int) -> None:
    """The member's current task is its newest running one (none once it has no running task)."""
    running = Task.objects.filter(assignee_id=member_id, status=S.RUNNING).order_by("-started_at", "-pk").values("pk")[:1]
    Member.objects.filter(pk=member_id).update(current_task=running)


def _release_dependents(task: Task, actor: str) -> None:
    for dependent in task.dependents.filter(status=S.PENDING).select_related("assignee"):
        if deps_met(dependent) and is_due(dependent):
            transition(dependent, S.READY, actor=actor, reason=f"dependency #{task.pk} done")


@audit.verb("task.create", created=True)
def create_task(space: Space, creator: str, title: str, *, spec: str = "", assignee: Member | None = None,
                depends_on: list[int] | None = None, not_before: datetime | None = None,
                engine_managed: bool = False, verify_policy: str = VerifyPolicy.AUTO) -> Task:
    title = require_text(title, "title", max_len=MAX_TITLE)
    spec = require_text(spec, "spec", max_len=MAX_SPEC, allow_empty=True)
    if verify_policy not in VerifyPolicy.values:
        raise VeronicaError(f"verify must be one of {', '.join(VerifyPolicy.values)}", field="verify")
    if verify_policy == VerifyPolicy.CHECKS and not space.verify_checks:
        # without checks nothing would ever move the task out of verifying
        raise VeronicaError("verify 'checks' needs checks, and this space configures none (manifest verify_checks); "
                            "use verify 'leader' or 'auto'", field="verify")
    dep_ids = sorted(set(depends_on or []))
    with transaction.atomic():
        if assignee is not None:
            lock_member_first(assignee.pk)
        deps = list(Task.objects.filter(space=space, pk__in=dep_ids))
        missing = set(dep_ids) - {d.pk for d in deps}
        if missing:
            raise VeronicaError(f"depends_on names unknown tasks: {', '.join(f'#{i}' for i in sorted(missing))}", field="depends_on")
        if any(d.status == S.CANCELLED for d in deps):
            raise VeronicaError("depends_on includes a cancelled task", field="depends_on")
        task = Task.objects.create(space=space, title=title, spec=spec, creator_name=creator, not_before=not_before,
                                   engine_managed=engine_managed, verify_policy=verify_policy)
        task.depends_on.set(deps)
        events.emit(space.pk, "task.created", task=task.pk, title=title, creator=creator, depends_on=dep_ids)
        if all(d.status == S.DONE for d in deps) and is_due(task):
            transition(task, S.READY, actor=creator)
        if assignee is not None:
            assign(task, assignee, actor=creator)
    return task


def resolve_assignee(space: Space, target: object) -> Member | None:
    """An assignee by name, or by role: the active member of that role with the fewest open tasks.
    Blank is nobody (the task waits on the board)."""
    from django.db.models import Count, Q

    from veronica.models import Membership, Role

    if target is None or (isinstance(target, str) and not target.strip()):
        return None
    name = require_text(target, "assignee", max_len=column_limit(Member, "name")).strip()
    live = Member.objects.filter(space=space, removed_at__isnull=True)
    member = live.filter(name=name).first()
    if member is None and name in Role.values:
        member = (live.filter(role=name, membership=Membership.ACTIVE)
                  .annotate(open=Count("tasks", filter=Q(tasks__status__in=list(OPEN)))).order_by("open", "name").first())
    if member is None:
        raise VeronicaError(f"no member or role named '{name}' in this space (roles: {', '.join(Role.values)})", field="assignee")
    return member


def assignment_mail(task: Task, auto: bool) -> tuple[str, str]:
    """One body for manual and automatic dispatch; the automatic one says so."""
    marker = " (auto-dispatched)" if auto else ""
    lines = [f"You are assigned task #{task.pk}: {task.title}{marker}", ""]
    if task.spec:
        lines += [task.spec, ""]
    if auto:
        lines.append("No leader run preceded this dispatch: if the spec is ambiguous, ask the leader rather than guess.")
    lines.append(f"When finished call task_done with task_id={task.pk} and a short result.")
    return f"Task #{task.pk}: {task.title}{marker}", "\n".join(lines)


def check_assign(task: Task, member: Member) -> None:
    """What assign refuses, checked without writing (the admin form shows it as a field error)."""
    if member.space_id != task.space_id or member.removed_at is not None:
        raise VeronicaError(f"{member.name} is not a member of this space", field="assignee")
    if task.status in TERMINAL or (task.status in (S.RUNNING, S.VERIFYING) and task.assignee_id not in (None, member.pk)):
        raise IllegalTransition(f"task #{task.pk} is {task.status}; it cannot be (re)assigned now", field="task_id")


@audit.verb("task.assign", watch="task")
def assign(task: Task, member: Member, *, actor: str, auto: bool = False) -> Task:
    """Give a task to a member. A ready task starts now (mail wakes the assignee); a pending one
    is engine-managed and dispatched by the tick once its dependencies and not-before allow."""
    check_assign(task, member)
    with transaction.atomic():
        lock_member_first(member.pk)
        Task.objects.filter(pk=task.pk).update(assignee=member)
        task.assignee = member
        events.emit(task.space_id, "task.assigned", task=task.pk, title=task.title, assignee=member.name, actor=actor, auto=auto)
        if task.status == S.READY:
            dispatch(task, actor=actor, auto=auto)
        elif task.status in (S.PENDING, S.BLOCKED):
            Task.objects.filter(pk=task.pk).update(engine_managed=True)
            task.engine_managed = True
    return task


@audit.verb("task.reassign", watch="task")
def reassign(task: Task, member: Member, *, actor: str) -> Task:
    """Give a task to another member, whatever it is doing: a running task is requeued (its old
    assignee is told to stop) and starts again with the new one, as assign starts a ready task."""
    if task.status in TERMINAL or task.status == S.VERIFYING:
        raise IllegalTransition(f"task #{task.pk} is {task.status}; it cannot be reassigned now", field="task_id")
    if task.assignee_id == member.pk:
        raise VeronicaError(f"task #{task.pk} is already assigned to {member.name}", field="assignee")
    previous = task.assignee if task.assignee_id else None
    with transaction.atomic():
        if task.status == S.RUNNING:
            transition(task, S.READY, actor=actor, reason=f"reassigned from {previous.name} to {member.name}")
        if previous is not None and previous.removed_at is None and task.status in (S.READY, S.BLOCKED) and task.started_at:
            bus.send(task.space, actor, previous.name, f"Task #{task.pk} ({task.title}) was reassigned to {member.name}; "
                     "stop working on it.", subject=f"Task #{task.pk} reassigned", task=task)
        assign(task, member, actor=actor)
    return task


@audit.verb("task.cancel", watch="task")
def cancel(task: Task, *, actor: str, reason: str = "") -> Task:
    """Cancel a task; an assignee that was working on it is told to stop."""
    was_running = task.status in (S.RUNNING, S.VERIFYING, S.BLOCKED)
    with transaction.atomic():
        transition(task, S.CANCELLED, actor=actor, reason=reason or f"cancelled by {actor}")
        if was_running and task.assignee_id and task.assignee.removed_at is None:
            bus.send(task.space, actor, task.assignee.name, f"Task #{task.pk} ({task.title}) was cancelled by {actor}"
                     + (f": {reason}" if reason else "") + "; stop working on it.", subject=f"Task #{task.pk} cancelled", task=task)
    return task


@audit.verb("task.retry", watch="task")
def retry(task: Task, *, actor: str, assignee: Member | None = None) -> Task:
    """Run a failed task again: back to ready (its last result is kept until a new one), and started
    with its assignee (or the one given) as assign would."""
    if task.status != S.FAILED:
        raise IllegalTransition(f"task #{task.pk} is {task.status}; only a failed task can be retried", field="task_id")
    with transaction.atomic():
        transition(task, S.READY, actor=actor, reason=f"retried by {actor}")
        target = assignee or (task.assignee if task.assignee_id and task.assignee.removed_at is None else None)
        if target is not None:
            assign(task, target, actor=actor)
    return task


def dispatch(task: Task, *, actor: str, auto: bool) -> Task:
    transition(task, S.RUNNING, actor=actor)
    subject, body = assignment_mail(task, auto)
    bus.send(task.space, bus.SYSTEM if auto else actor, task.assignee.name, body, subject=subject, task=task, wake_source="task")
    return task


@audit.verb("task.complete", watch="task")
def complete(task: Task, *, actor: str, result: str, failed: bool = False) -> Task:
    """A worker reports a task finished. Verify policy `leader` / `checks` holds it in verifying."""
    result = require_text(result, "result", max_len=MAX_RESULT, allow_empty=True)
    with transaction.atomic():
        Task.objects.filter(pk=task.pk).update(result=result)
        task.result = result
        if failed:
            to = S.FAILED
        elif task.verify_policy in (VerifyPolicy.LEADER, VerifyPolicy.CHECKS) and task.status == S.RUNNING:
            to = S.VERIFYING
        else:
            to = S.DONE
        transition(task, to, actor=actor)
        creator = bus.live_members(task.space).filter(name=task.creator_name).exclude(name=actor).first()
        if creator is not None:
            bus.send(task.space, actor, creator.name, f"Task #{task.pk} ({task.title}) is {to}.\n\n{result}".strip(),
                     subject=f"Task #{task.pk} {to}", task=task)
    return task


def dispatch_ready(space: Space | None = None) -> list[Task]:
    """Engine turn: ready engine-managed tasks with an assignee start, due pending ones become ready."""
    from veronica.engine import clock

    now = clock.now()
    started: list[Task] = []
    due = Task.objects.filter(status=S.PENDING, not_before__lte=now)
    if space is not None:
        due = due.filter(space=space)
    for task in due.select_related("assignee"):
        if deps_met(task):
            try:
                transition(task, S.READY, actor=bus.SYSTEM, reason="not-before reached")
            except IllegalTransition:
                pass
    qs = Task.objects.filter(engine_managed=True, assignee__isnull=False, status__in=[S.PENDING, S.READY])
    if space is not None:
        qs = qs.filter(space=space)
    for task in qs.select_related("assignee", "space"):
        try:
            if task.status == S.PENDING:
                if not (deps_met(task) and is_due(task, now)):
                    continue
                transition(task, S.READY, actor=bus.SYSTEM)
            if task.assignee.removed_at is None:
                started.append(dispatch(task, actor=bus.SYSTEM, auto=True))
        except IllegalTransition:
            continue  # someone else moved it first
    return started
