"""Verify checks (CHK): a task with verify "checks" that enters `verifying` gets the space's
configured commands run against the workspace, in the same sandbox as run_command, by a django-q2
task off the member's run. The evidence lands on the task; the ledger then moves it to `done`, or
back to `running` with the failure mailed to its assignee.

A claim (a conditional update of Task.check_claimed_at) makes one verification run once even when
the on-commit enqueue and the tick's recovery both deliver it.
"""
from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable

from django.db import transaction
from django.db.models import Count, Max, Q
from django.utils import timezone

from veronica.engine import check_queue
from veronica.swarm import audit, bus, events, ledger
from veronica.agent.tools.base import ToolError, truncate
from veronica.agent.tools.sandbox import Capped, limit_note, run, sandbox_env, sandboxed
from veronica.plumbing.errors import Conflict, IllegalTransition, NotFound, VeronicaError
from veronica.models import Space, Task, TaskCheck, TaskStatus, VerifyPolicy

log = logging.getLogger(__name__)

ACTOR = bus.CHECKS
MAX_CHECKS = 20
TIMEOUT_DEFAULT = 60
TIMEOUT_MAX = 1800
OUTPUT_CAP = 4000
COMMAND_MAX = 2000
RECOVER_AFTER = timedelta(minutes=1)  # a verifying task nobody has claimed by then lost its enqueue
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,59}$")


# --- configuration ----------------------------------------------------------------------------------

def clean_check(item: object, where: str = "", field: str = "") -> dict:
    """One {name, command, timeout} entry. `where` prefixes the key in the message
    ("verify_checks[2]."); the error's field is `field`, or the key itself when field is empty
    (the console form, whose inputs are named after the keys)."""
    def bad(key: str, problem: str) -> VeronicaError:
        return VeronicaError(f"{where}{key} {problem}", field=field or key)

    if not isinstance(item, dict):
        raise VeronicaError(f"{where.rstrip('.') or 'check'} must be a table with name, command and timeout", field=field or "check")
    unknown = set(item) - {"name", "command", "timeout"}
    if unknown:
        key = sorted(unknown)[0]
        raise VeronicaError(f"{where}{key}: unknown key (known: command, name, timeout)", field=field or key)
    name, command, timeout = item.get("name"), item.get("command"), item.get("timeout", TIMEOUT_DEFAULT)
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad("name", "must be 1-60 letters, digits, '_', '.' or '-'")
    if not isinstance(command, str) or not command.strip() or len(command) > COMMAND_MAX:
        raise bad("command", f"must be a non-empty string of at most {COMMAND_MAX} characters")
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= TIMEOUT_MAX:
        raise bad("timeout", f"must be an integer from 1 to {TIMEOUT_MAX} (seconds)")
    return {"name": name, "command": command, "timeout": timeout}


def clean_spec(value: object, field: str = "verify_checks") -> list[dict]:
    """[{name, command, timeout}] validated; errors name the entry and the field."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise VeronicaError(f"{field} must be a list of {{name, command, timeout}} tables", field=field)
    if len(value) > MAX_CHECKS:
        raise VeronicaError(f"{field} has {len(value)} checks; the limit is {MAX_CHECKS}", field=field)
    out, seen = [], set()
    for i, item in enumerate(value):
        check = clean_check(item, f"{field}[{i}].", field)
        if check["name"] in seen:
            raise VeronicaError(f"{field}[{i}].name {check['name']!r} is used twice", field=field)
        seen.add(check["name"])
        out.append(check)
    total, budget = sum(c["timeout"] for c in out), worker_budget()
    if total > budget:
        # the django-q2 worker would be killed mid-verification and the tick would retry it forever
        raise VeronicaError(f"{field}: the timeouts add up to {total} s; checks run in one worker task, which may take at most "
                            f"{budget} s (VERONICA_Q_TIMEOUT minus 30 s)", field=field)
    return out


def worker_budget() -> int:
    from django.conf import settings

    return settings.Q_TIMEOUT - 30


def configured(space: Space) -> bool:
    return bool(space.verify_checks)


# --- queueing ---------------------------------------------------------------------------------------

def _stale_claim_cutoff(space: Space, now) -> object:
    total = sum(c["timeout"] for c in space.verify_checks) + 60
    return now - timedelta(seconds=total)


def recover() -> int:
    """Engine tick duty: re-enqueue verifying check tasks nobody holds (lost enqueue, dead worker)."""
    from veronica.engine import clock

    now = clock.now()
    count = 0
    qs = Task.objects.filter(status=TaskStatus.VERIFYING, verify_policy=VerifyPolicy.CHECKS, updated_at__lt=now - RECOVER_AFTER)
    for task in qs.select_related("space"):
        if task.check_claimed_at is None or task.check_claimed_at < _stale_claim_cutoff(task.space, now):
            check_queue.enqueue(task.pk)
            count += 1
    return count


def pending(task: Task) -> bool:
    """The board's 'checking' chip: queued or executing (evidence lands only when a run finishes)."""
    return status_pending(task.status, task.verify_policy)


def status_pending(status: str, verify_policy: str) -> bool:
    """pending() from the two columns it reads (the board reads its cards as plain rows, not Tasks)."""
    return status == TaskStatus.VERIFYING and verify_policy == VerifyPolicy.CHECKS


# --- running --------------------------------------------------------------------------------------

def run_one(root: Path, check: dict) -> dict:
    """One check in the run_command sandbox and its bounds; its output is read as it comes and kept as
    a head and a tail. A timeout kills its whole process group."""
    started = time.monotonic()
    timeout = check["timeout"]
    try:
        argv, home = sandboxed(root, check["command"])
    except ToolError as exc:
        return {"exit_code": None, "timed_out": False, "output": f"could not start: {exc}", "duration_ms": 0}
    out = Capped(OUTPUT_CAP // 2, OUTPUT_CAP // 2)
    outcome = run(argv, cwd=root, env=sandbox_env(home), timeout=timeout, streams=(out,))
    duration_ms = int((time.monotonic() - started) * 1000)
    output = out.text().strip()
    note = limit_note(outcome, output)
    if outcome.timed_out:
        note = f"timed out after {timeout} s"
    if note:
        output = (note + "\n" + output).strip()
    return {"exit_code": outcome.returncode, "timed_out": outcome.timed_out,
            "output": truncate(output, OUTPUT_CAP + 300), "duration_ms": duration_ms}


def _claim(task_id: int) -> Task | None:
    now = timezone.now()
    task = Task.objects.filter(pk=task_id).select_related("space", "assignee").first()
    if task is None or task.status != TaskStatus.VERIFYING or task.verify_policy != VerifyPolicy.CHECKS:
        return None
    free = Q(check_claimed_at__isnull=True) | Q(check_claimed_at__lt=_stale_claim_cutoff(task.space, now))
    if not Task.objects.filter(free, pk=task_id, status=TaskStatus.VERIFYING).update(check_claimed_at=now):
        return None
    task.check_claimed_at = now
    return task


def evidence_text(rows: list[TaskCheck]) -> str:
    lines = []
    for r in rows:
        verdict = "passed" if r.passed else ("timed out" if r.timed_out else "FAILED")
        code = "" if r.exit_code is None else f" (exit {r.exit_code})"
        lines.append(f"- {r.name}: {verdict}{code} in {r.duration_ms / 1000:.1f} s")
        if not r.passed and r.output:
            lines += ["    " + line for line in r.output.splitlines()[:40]]
    return "\n".join(lines)


def run_checks(task_id: int) -> dict | None:
    """The django-q2 task: run every configured check once, then move the task through the ledger."""
    task = _claim(task_id)
    if task is None:
        return None
    space = task.space
    root = Path(space.workdir).resolve()
    attempt = (TaskCheck.objects.filter(task=task).aggregate(n=Max("attempt"))["n"] or 0) + 1
    rows = []
    for check in space.verify_checks:
        result = run_one(root, check)
        passed = not result["timed_out"] and result["exit_code"] == 0
        rows.append(TaskCheck.objects.create(task=task, space=space, attempt=attempt, name=check["name"], command=check["command"],
                                             passed=passed, **result))
    passed = all(r.passed for r in rows)
    evidence = evidence_text(rows)
    with transaction.atomic():
        Task.objects.filter(pk=task.pk).update(check_evidence=evidence, check_claimed_at=None)
        task.check_evidence, task.check_claimed_at = evidence, None
        events.emit(space.pk, "task.check_done", task=task.pk, title=task.title, attempt=attempt, passed=passed,
                    checks=[{"name": r.name, "passed": r.passed, "exit_code": r.exit_code, "timed_out": r.timed_out,
                             "duration_ms": r.duration_ms} for r in rows])
        try:
            _settle(task, passed, evidence)
        except IllegalTransition:  # someone moved it meanwhile (a leader's verdict): the evidence stays
            log.info("task %s left verifying while its checks ran", task.pk)
    return {"task": task.pk, "passed": passed, "attempt": attempt}


def _settle(task: Task, passed: bool, evidence: str) -> None:
    if passed:
        ledger.transition(task, TaskStatus.DONE, actor=ACTOR, reason="all checks passed")
        creator = bus.live_members(task.space).filter(name=task.creator_name).first()
        if creator is not None and creator.pk != task.assignee_id:
            bus.send(task.space, bus.SYSTEM, creator.name, f"Task #{task.pk} ({task.title}) passed its checks.\n\n{evidence}",
                     subject=f"Task #{task.pk} done (checks passed)", task=task)
        return
    ledger.transition(task, TaskStatus.RUNNING, actor=ACTOR, reason="checks failed")
    if task.assignee_id and task.assignee.removed_at is None:
        body = (f"Task #{task.pk} ({task.title}) failed its checks and is back with you.\n\n{evidence}\n\n"
                f"Fix the problem, then call task_done with task_id={task.pk} again.")
        bus.send(task.space, bus.SYSTEM, task.assignee.name, body, subject=f"Task #{task.pk}: checks failed", task=task)


# --- counts ---------------------------------------------------------------------------------------

def counts(space_ids: list[int]) -> dict[int, dict]:
    """Checks run / failed / timed out per space, in one grouped query."""
    rows = (TaskCheck.objects.filter(space_id__in=space_ids).values("space_id")
            .annotate(run=Count("id"), failed=Count("id", filter=Q(passed=False)), timed_out=Count("id", filter=Q(timed_out=True)))
            .order_by("space_id"))
    out = {sid: {"run": 0, "failed": 0, "timed_out": 0} for sid in space_ids}
    for row in rows:
        out[row["space_id"]] = {"run": row["run"], "failed": row["failed"], "timed_out": row["timed_out"]}
    return out


@audit.verb("space.checks_set", watch="space")
def configure(space: Space, spec: object, *, actor: str) -> Space:
    """Replace the space's checks (validated first). Tasks already verifying use the new list."""
    cleaned = clean_spec(spec)
    with transaction.atomic():
        Space.objects.filter(pk=space.pk).update(verify_checks=cleaned)
        space.verify_checks = cleaned
        events.emit(space.pk, "space.checks_configured", actor=actor, checks=[c["name"] for c in cleaned])
    return space


# --- one check at a time (the console form) -------------------------------------------------------
# Each reads the list under the space row's lock and hands the whole new list to configure, so the
# form, the API, the admin and the manifest share one writer and two owners editing at once both land.

def _edit(space: Space, edit: Callable[[list[dict]], list[dict]], *, actor: str) -> Space:
    with transaction.atomic():
        current = Space.objects.select_for_update().filter(pk=space.pk).values_list("verify_checks", flat=True).get()
        return configure(space, edit([dict(c) for c in current or []]), actor=actor)


def _index(current: list[dict], name: str) -> int:
    for i, check in enumerate(current):
        if check["name"] == name:
            return i
    raise NotFound(f"this space has no check named {name!r}", field="check")


@audit.verb("space.check_add", watch="space")
def add_check(space: Space, item: dict, *, actor: str) -> Space:
    check = clean_check(item)

    def edit(current: list[dict]) -> list[dict]:
        if any(c["name"] == check["name"] for c in current):
            raise Conflict(f"a check named {check['name']!r} already exists; edit it instead", field="name")
        return [*current, check]
    return _edit(space, edit, actor=actor)


@audit.verb("space.check_update", watch="space")
def update_check(space: Space, name: str, item: dict, *, actor: str) -> Space:
    """Replace the check called `name` (it may be renamed) in place, keeping the order."""
    check = clean_check(item)

    def edit(current: list[dict]) -> list[dict]:
        i = _index(current, name)
        if check["name"] != name and any(c["name"] == check["name"] for c in current):
            raise Conflict(f"a check named {check['name']!r} already exists", field="name")
        current[i] = check
        return current
    return _edit(space, edit, actor=actor)


@audit.verb("space.check_remove", watch="space")
def remove_check(space: Space, name: str, *, actor: str) -> Space:
    def edit(current: list[dict]) -> list[dict]:
        del current[_index(current, name)]
        return current
    return _edit(space, edit, actor=actor)


def results_of(task: Task) -> list[dict]:
    """The task page: every verification of the task, newest attempt first, each with its checks."""
    attempts: dict[int, list[dict]] = {}
    for r in TaskCheck.objects.filter(task=task).order_by("-attempt", "id"):
        verdict = "passed" if r.passed else ("timed out" if r.timed_out else "failed")
        attempts.setdefault(r.attempt, []).append({
            "name": r.name, "command": r.command, "verdict": verdict, "passed": r.passed, "exit_code": r.exit_code,
            "timed_out": r.timed_out, "duration_ms": r.duration_ms, "output": r.output, "at": r.created_at.isoformat()})
    return [{"attempt": n, "passed": all(c["passed"] for c in rows), "checks": rows} for n, rows in attempts.items()]
