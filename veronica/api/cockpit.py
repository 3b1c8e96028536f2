"""The cockpit's JSON doors: tasks (create, assign, reassign, cancel, retry), member configuration
and skills. Each parses its input and calls the one verb the console's forms call too."""
from __future__ import annotations

from django.http import HttpRequest

from veronica.swarm import access, ledger, skills
from veronica.swarm.access import OPERATOR, OWNER
from veronica.api import selectors as sel
from veronica.api.base import endpoint, json_body, text_field
from veronica.engine import supervisor
from veronica.plumbing.errors import VeronicaError
from veronica.models import Member, Space, Task, VerifyPolicy

MAX_DEPENDS_ON = 1000


def _actor(request: HttpRequest) -> str:
    return access.actor_name(request.user)


# --- tasks (operators) ---------------------------------------------------------------------------------

def depends_on_ids(raw: object) -> list[int]:
    """Task ids from a JSON list or a form's "3, 5 #7" text."""
    if isinstance(raw, str):
        raw = [part.lstrip("#") for part in raw.replace(",", " ").split()]
        if not all(part.isdigit() for part in raw):
            raise VeronicaError("depends_on must be task numbers, e.g. '3, 5'", field="depends_on")
        raw = [int(part) for part in raw]
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_DEPENDS_ON or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 < d < 2 ** 63 for d in raw):
        raise VeronicaError(f"depends_on must be a list of at most {MAX_DEPENDS_ON} positive task ids", field="depends_on")
    return raw


def create_task(space: Space, data, actor: str) -> Task:
    """One task from the API's JSON or the board's form: title, spec, assignee (a name or a role),
    depends_on, verify. An assigned ready task starts at once (mail and dispatch), as from the tools."""
    verify = (data.get("verify") or VerifyPolicy.AUTO)
    if not isinstance(verify, str):
        raise VeronicaError("verify must be a string", field="verify")
    spec = data.get("spec") if data.get("spec") is not None else data.get("body", "")
    task = ledger.create_task(space, actor, data.get("title", ""), spec=spec or "",
                              assignee=ledger.resolve_assignee(space, data.get("assignee")),
                              depends_on=depends_on_ids(data.get("depends_on")), verify_policy=verify)
    task.refresh_from_db()
    return task


def task_action(space: Space, task_id: int, action: str, data, actor: str) -> Task:
    """assign / reassign / cancel / retry one task of the space."""
    task = ledger.get_task(space, task_id)
    if action in ("assign", "reassign"):
        member = ledger.resolve_assignee(space, data.get("assignee"))
        if member is None:
            raise VeronicaError("assignee is required: a member's name or a role", field="assignee")
        (ledger.assign if action == "assign" else ledger.reassign)(task, member, actor=actor)
    elif action == "cancel":
        ledger.cancel(task, actor=actor, reason=data.get("reason") or "")  # the ledger checks its type and length
    elif action == "retry":
        ledger.retry(task, actor=actor, assignee=ledger.resolve_assignee(space, data.get("assignee")))
    else:
        raise VeronicaError(f"action must be one of {', '.join(TASK_ACTIONS)}", field="action")
    task.refresh_from_db()
    return task


TASK_ACTIONS = ("assign", "reassign", "cancel", "retry")


def tasks_post(request: HttpRequest, space: Space):
    return sel.task_row(create_task(space, json_body(request), _actor(request))), 201


@endpoint("POST")
def task_act(request: HttpRequest, slug: str, task_id: int, action: str) -> dict:
    space, _ = access.space_for(request.user, slug, OPERATOR)
    return sel.task_row(task_action(space, task_id, action, json_body(request), _actor(request)))


# --- members (owners) -----------------------------------------------------------------------------------

NEW_MEMBER_KEYS = {"name", "role", "persona", "when_to_use", "model", "fallback", "permission_mode", "schedule", "rule_domains",
                   "budget_override", "max_iterations", "tools", "deferred_tools"}


def add_member(space: Space, data: dict, actor: str) -> Member:
    """A new member from JSON (the API) or a form's parsed values (the console)."""
    unknown = sorted(set(data) - NEW_MEMBER_KEYS)
    if unknown:
        raise VeronicaError(f"unknown field {unknown[0]} (known: {', '.join(sorted(NEW_MEMBER_KEYS))})", field=unknown[0])
    rule_domains = data.get("rule_domains") or []
    if not isinstance(rule_domains, list):
        raise VeronicaError("rule_domains must be a list of strings", field="rule_domains")
    text = {key: text_field(data, key, required=False) for key in ("role", "persona", "when_to_use", "model", "permission_mode",
                                                                   "schedule")}
    return supervisor.add_member(
        space, text_field(data, "name"), role=text["role"] or "worker", persona=text["persona"], when_to_use=text["when_to_use"],
        model=text["model"] or "offline", permission_mode=text["permission_mode"], schedule=text["schedule"].strip(),
        rule_domains=rule_domains, budget_override=data.get("budget_override"), max_iterations=data.get("max_iterations", 24),
        tools=data.get("tools"), deferred_tools=data.get("deferred_tools"), fallback=data.get("fallback"), actor=actor)


def member_patch(request: HttpRequest, slug: str, name: str) -> dict:
    space, _ = access.space_for(request.user, slug, OWNER)
    member = supervisor.edit_member(supervisor.get_member(space, name), json_body(request), actor=_actor(request))
    return member_config(member)


def member_config(member: Member) -> dict:
    """What edit_member can change, as stored (the API's and the console form's view)."""
    return {**sel.member_detail(member), "persona": member.persona, "model": member.model,
            "fallback": list(member.fallback or []),
            "budget_override": member.budget_override, "max_iterations": member.max_iterations, "tools": member.tools,
            "deferred_tools": member.deferred_tools, "runtime_fields": member.runtime_fields}


# --- skills (owners author and remove; everyone reads) -------------------------------------------------------

def add_skill(space: Space, data, actor: str, member: Member | None = None):
    overwrite = data.get("overwrite", False)
    if not isinstance(overwrite, bool):
        overwrite = str(overwrite).lower() in ("1", "true", "on", "yes")
    return skills.add_skill(space, data.get("name", ""), data.get("body", ""), member=member,
                            description=data.get("description", "") or "", overwrite=overwrite, actor=actor)


def skill_row(skill) -> dict:
    return {"name": skill.name, "scope": skill.scope, "description": skill.description, "body": skill.body,
            "updated_at": sel.iso(skill.updated_at)}


def member_skills_post(request: HttpRequest, slug: str, name: str):
    space, _ = access.space_for(request.user, slug, OWNER)
    return skill_row(add_skill(space, json_body(request), _actor(request), supervisor.get_member(space, name))), 201


@endpoint("GET", "POST")
def space_skills(request: HttpRequest, slug: str):
    if request.method == "GET":
        space, _ = access.space_for(request.user, slug)
        return {"skills": [skill_row(s) for s in space.skills.filter(member__isnull=True).order_by("name")]}
    space, _ = access.space_for(request.user, slug, OWNER)
    return skill_row(add_skill(space, json_body(request), _actor(request))), 201


@endpoint("DELETE")
def space_skill_detail(request: HttpRequest, slug: str, skill: str) -> dict:
    space, _ = access.space_for(request.user, slug, OWNER)
    skills.remove_skill(space, skill, actor=_actor(request))
    return {"name": skill, "scope": "shared", "removed": True}


@endpoint("DELETE")
def member_skill_detail(request: HttpRequest, slug: str, name: str, skill: str) -> dict:
    space, _ = access.space_for(request.user, slug, OWNER)
    skills.remove_skill(space, skill, member=supervisor.get_member(space, name), actor=_actor(request))
    return {"name": skill, "scope": "member", "member": name, "removed": True}
