"""JSON endpoints of the operator's cockpit (issue 22): chat, resume all, rename, prompt inspector,
budget reset, approval rules. Thin like veronica.api.views: check access, parse, call one verb."""
from __future__ import annotations

from django.http import HttpRequest

from veronica.swarm import chat
from veronica.swarm.access import OWNER
from veronica.api import selectors as sel
from veronica.api.base import _actor, _space, endpoint, json_body, text_field
from veronica.engine import budget, supervisor
from veronica.plumbing.errors import VeronicaError

ENDPOINTS = [
    "GET|POST /api/spaces/<slug>/members/<name>/chat/?before=&limit=",
    "POST /api/spaces/<slug>/resume/", "PUT(owner) /api/spaces/<slug>/name/",
    "GET|PUT(owner) /api/spaces/<slug>/members/<name>/budget/", "POST(owner) /api/spaces/<slug>/members/<name>/budget/reset/",
    "GET|PUT(owner) /api/spaces/<slug>/budget/",
    "GET /api/spaces/<slug>/members/<name>/prompt/?call=<assistant turn id>",
    "POST /api/spaces/<slug>/approvals/<id>/approve/ {\"always\": true}: and always for this tool on this member",
    "GET|POST /api/spaces/<slug>/approval-rules/?member=&all=1", "DELETE /api/spaces/<slug>/approval-rules/<id>/",
]


@endpoint("GET", "POST")
def member_chat(request: HttpRequest, slug: str, name: str):
    """GET: the operator's thread with this member. POST {"body", "subject"}: write to it."""
    space, _ = _space(request, slug)
    member = supervisor.get_member(space, name)
    if request.method == "POST":
        data = json_body(request)
        sent = chat.send_to(member, text_field(data, "body"), subject=text_field(data, "subject", required=False))
        return sel.message_row(sent), 201
    params = request.GET
    return chat.conversation(member, before=sel.int_param(params, "before", None, minimum=1),
                             limit=sel.int_param(params, "limit", 50, minimum=1, maximum=200))


@endpoint("POST")
def resume_all(request: HttpRequest, slug: str) -> dict:
    space, _ = _space(request, slug)
    return {"resumed": supervisor.resume_all(space, actor=_actor(request))}


@endpoint("PUT", "POST")
def space_name(request: HttpRequest, slug: str) -> dict:
    space, role = _space(request, slug, OWNER)
    space = supervisor.rename_space(space, text_field(json_body(request), "name"), actor=_actor(request))
    return sel.space_detail(space, role)


# --- budgets: a raise or an owner's reset reopens a tripped day ---------------------------------------------

@endpoint("GET", "PUT")
def member_budget(request: HttpRequest, slug: str, name: str) -> dict:
    """PUT {"budget_override": int or null}: > 0 caps, < 0 unlimited, null the space default."""
    space, _ = _space(request, slug, None if request.method == "GET" else OWNER)
    member = supervisor.get_member(space, name)
    if request.method == "PUT":
        data = json_body(request)
        if "budget_override" not in data:
            raise VeronicaError("budget_override is required (an integer, or null for the space default)", field="budget_override")
        member = budget.set_member_budget(member, data["budget_override"], actor=_actor(request))
    return budget.budget_state(member)


@endpoint("POST")
def member_budget_reset(request: HttpRequest, slug: str, name: str) -> dict:
    space, _ = _space(request, slug, OWNER)
    return budget.budget_state(budget.reset_day(supervisor.get_member(space, name), actor=_actor(request)))


def _space_budget(space) -> dict:
    return {field: str(getattr(space, field)) for field in budget.SPACE_LIMITS} | {"today": {
        k: str(v) for k, v in budget.space_today(space).items()}}


@endpoint("GET", "PUT")
def space_budget(request: HttpRequest, slug: str) -> dict:
    """PUT any of member_daily_tokens, daily_token_ceiling, daily_usd_ceiling (0: none)."""
    space, _ = _space(request, slug, None if request.method == "GET" else OWNER)
    if request.method == "PUT":
        reopened = budget.set_space_limits(space, json_body(request), actor=_actor(request))
        return {**_space_budget(space), "reopened": reopened}
    return _space_budget(space)


# --- the prompt inspector --------------------------------------------------------------------------------

@endpoint("GET")
def member_prompt(request: HttpRequest, slug: str, name: str) -> dict:
    """The next model call's system prompt and messages (or, with ?call=, a past one's), tokens per part.
    Viewers too: every part is already on pages a viewer reads (persona, skills, memory, rules,
    blackboard, transcript)."""
    from veronica.web import prompt_inspector

    space, _ = _space(request, slug)
    member = supervisor.get_member(space, name)
    call = sel.int_param(request.GET, "call", None, minimum=1, maximum=2**63 - 1)
    return prompt_inspector.next_call(member) if call is None else prompt_inspector.past_call(member, call)


# --- standing approvals: "always for this tool on this member" ---------------------------------------------

@endpoint("GET", "POST")
def approval_rules(request: HttpRequest, slug: str):
    """GET: the live rules (?all=1: revoked ones too; ?member=). POST {"member", "tool"}: add one (operators,
    who may also switch a member to bypass, a wider grant)."""
    from veronica.engine import approvals

    space, _ = _space(request, slug)
    if request.method == "POST":
        data = json_body(request)
        member = supervisor.get_member(space, text_field(data, "member"))
        return approvals.rule_row(approvals.allow_always(member, text_field(data, "tool"), user=request.user)), 201
    who = request.GET.get("member")
    member = supervisor.get_member(space, who) if who else None
    return {"rules": approvals.rules_of(space, member=member, live_only=request.GET.get("all") not in ("1", "true"))}


@endpoint("DELETE")
def approval_rule(request: HttpRequest, slug: str, rule_id: int) -> dict:
    from veronica.engine import approvals

    space, _ = _space(request, slug)
    return approvals.rule_row(approvals.revoke_rule(approvals.get_rule(space, rule_id), user=request.user))
