"""The cockpit's console forms: tasks from the board and the task page, members' configuration and
skills. Plain POST forms (no script needed); each parses the form and calls the same function the
JSON API calls (veronica.api.cockpit), which calls the verb. A refused form re-renders its page with
the error and the verb's status; only a success redirects."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from veronica.web import views
from veronica.swarm import access, skills
from veronica.swarm.access import OPERATOR, OWNER
from veronica.agent.tools import builtin_tools
from veronica.api import cockpit
from veronica.api import selectors as sel
from veronica.engine import supervisor
from veronica.plumbing.errors import VeronicaError
from veronica.models import Member, PermissionMode, Role, Space

# --- tasks (operators) -------------------------------------------------------------------------------------


@login_required
@require_POST
def task_new(request: HttpRequest, slug: str) -> HttpResponse:
    """The board's "New task" form."""
    space, _ = access.space_for(request.user, slug, OPERATOR)
    try:
        views.refuse_unstorable(request.POST)
        task = cockpit.create_task(space, request.POST, access.actor_name(request.user))
    except VeronicaError as exc:
        status = views.form_error(request, exc)  # flashed before the page renders
        return _refused(views.space_page(request, slug), status)
    messages.success(request, f"created task #{task.pk}" + (f", {task.status} with {task.assignee.name}" if task.assignee_id else ""))
    return redirect("console:task", slug=space.slug, task_id=task.pk)


@login_required
@require_POST
def task_act(request: HttpRequest, slug: str, task_id: int) -> HttpResponse:
    """The task page's assign / reassign / cancel / retry buttons."""
    space, _ = access.space_for(request.user, slug, OPERATOR)
    action = request.POST.get("action", "")
    try:
        views.refuse_unstorable(request.POST)
        task = cockpit.task_action(space, task_id, action, request.POST, access.actor_name(request.user))
        messages.success(request, f"task #{task.pk}: {action} done; it is {task.status}"
                         + (f" with {task.assignee.name}" if task.assignee_id else ""))
    except VeronicaError as exc:
        status = views.form_error(request, exc)
        return _refused(views.task_page(request, slug, task_id), status)
    return redirect("console:task", slug=space.slug, task_id=task_id)


def _refused(response: HttpResponse, status: int) -> HttpResponse:
    """The page the form was on, with the error flashed, under the verb's status."""
    response.status_code = status
    return response


# --- members (owners) ------------------------------------------------------------------------------------------

def _names(raw: str) -> list[str]:
    return raw.replace(",", " ").split()


def _number(raw: str, blank: object) -> object:
    """A form's number: blank is `blank`; a non-number is passed on for the verb to refuse by name."""
    raw = raw.strip()
    if not raw:
        return blank
    try:
        return int(raw)
    except ValueError:
        return raw


def member_form_values(data) -> dict:
    """The member form's strings as the verbs' types. A blank tool set offers every tool of the role."""
    tools = data.get("tools", "").strip()
    return {
        "persona": data.get("persona", ""), "when_to_use": data.get("when_to_use", ""), "model": data.get("model", "").strip(),
        "fallback": _names(data.get("fallback", "")),
        "budget_override": _number(data.get("budget_override", ""), None),
        "max_iterations": _number(data.get("max_iterations", ""), 24),
        "rule_domains": _names(data.get("rule_domains", "")),
        "tools": _names(tools) if tools else None, "deferred_tools": _names(data.get("deferred_tools", "")),
        "schedule": data.get("schedule", "").strip(), "permission_mode": data.get("permission_mode", ""),
    }


FORM_FIELDS = ("name", "role", "persona", "when_to_use", "model", "fallback", "budget_override", "max_iterations", "rule_domains", "tools",
               "deferred_tools", "schedule", "permission_mode")


def _initial(member: Member | None, space: Space) -> dict[str, str]:
    """The form's strings for a member as stored (a new one: the defaults)."""
    if member is None:
        return {"role": Role.WORKER, "model": "offline", "max_iterations": "24", "permission_mode": space.default_permission_mode}
    return {"name": member.name, "role": member.role, "persona": member.persona, "when_to_use": member.when_to_use,
            "model": member.model, "fallback": ", ".join(member.fallback or []), "budget_override": "" if member.budget_override is None else str(member.budget_override),
            "max_iterations": str(member.max_iterations), "rule_domains": ", ".join(member.rule_domains or []),
            "tools": "" if member.tools is None else ", ".join(member.tools), "deferred_tools": ", ".join(member.deferred_tools or []),
            "schedule": member.schedule, "permission_mode": member.permission_mode}


def _member_page(request: HttpRequest, space: Space, role: str, member: Member | None, form, status: int) -> HttpResponse:
    current = cockpit.member_config(member) if member is not None else None
    initial = {f: form.get(f, "") for f in FORM_FIELDS} if form is not None else _initial(member, space)
    return render(request, "console/cockpit/member_form.html", views._context(
        space, role, member=current, initial=initial, page="member-form", roles=Role.values, permission_modes=PermissionMode.values,
        builtin=sorted(builtin_tools(member.role if member else Role.LEADER)), skills=sel.skills_of(member) if member else []),
        status=status)


@login_required
@require_http_methods(["GET", "POST"])
def member_new(request: HttpRequest, slug: str) -> HttpResponse:
    space, role = access.space_for(request.user, slug, OWNER)
    if request.method == "GET":
        return _member_page(request, space, role, None, None, 200)
    try:
        views.refuse_unstorable(request.POST)
        values = member_form_values(request.POST)
        values.update(name=request.POST.get("name", ""), role=request.POST.get("role", "") or Role.WORKER)
        values["model"] = values["model"] or "offline"
        member = cockpit.add_member(space, values, access.actor_name(request.user))
    except VeronicaError as exc:
        status = views.form_error(request, exc)
        return _member_page(request, space, role, None, request.POST, status)
    messages.success(request, f"added member {member.name}")
    return redirect("console:member", slug=space.slug, name=member.name)


@login_required
@require_http_methods(["GET", "POST"])
def member_edit(request: HttpRequest, slug: str, name: str) -> HttpResponse:
    """The member's configuration (supervisor.edit_member) and its own skills (veronica.swarm.skills)."""
    space, role = access.space_for(request.user, slug, OWNER)
    try:
        member = supervisor.get_member(space, name)
    except VeronicaError:
        raise Http404("no such member") from None
    if request.method == "GET":
        return _member_page(request, space, role, member, None, 200)
    actor, action = access.actor_name(request.user), request.POST.get("action", "save")
    try:
        views.refuse_unstorable(request.POST)
        if action == "add_skill":
            skill = cockpit.add_skill(space, request.POST, actor, member)
            messages.success(request, f"saved skill {skill.name} for {member.name}")
        elif action == "remove_skill":
            skills.remove_skill(space, request.POST.get("skill", ""), member=member, actor=actor)
            messages.success(request, f"removed skill {request.POST.get('skill')} of {member.name}")
        else:
            supervisor.edit_member(member, member_form_values(request.POST), actor=actor)
            messages.success(request, f"saved {member.name}; it applies from its next run")
            return redirect("console:member", slug=space.slug, name=member.name)
    except VeronicaError as exc:
        status = views.form_error(request, exc)
        return _member_page(request, space, role, member, request.POST if action == "save" else None, status)
    return redirect("console:member-edit", slug=space.slug, name=member.name)


# --- shared skills (owners author; everyone reads) --------------------------------------------------------------

@login_required
@require_http_methods(["GET", "POST"])
def skills_page(request: HttpRequest, slug: str) -> HttpResponse:
    space, role = access.space_for(request.user, slug, OWNER if request.method == "POST" else access.VIEWER)
    status = 200
    if request.method == "POST":
        actor = access.actor_name(request.user)
        try:
            views.refuse_unstorable(request.POST)
            if request.POST.get("action") == "remove_skill":
                skills.remove_skill(space, request.POST.get("skill", ""), actor=actor)
                messages.success(request, f"removed shared skill {request.POST.get('skill')}")
            else:
                skill = cockpit.add_skill(space, request.POST, actor)
                messages.success(request, f"saved shared skill {skill.name}")
            return redirect("console:skills", slug=space.slug)
        except VeronicaError as exc:
            status = views.form_error(request, exc)
    shared = [cockpit.skill_row(s) for s in space.skills.filter(member__isnull=True).order_by("name")]
    return render(request, "console/cockpit/skills.html", views._context(space, role, shared=shared, page="skills"), status=status)
