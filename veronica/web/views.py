"""The operator console: server-rendered pages, and the panels the page's JS re-fetches live.

Each panel is one template rendered by both the full page and /panels/<name>/, so a live refresh
and a reload show the same sanitized HTML. Mutations from the pages go through the JSON API
(veronica.api); the few plain forms here (tokens, access, members) call the same verbs.
"""
from __future__ import annotations

import functools
import json
from typing import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.staticfiles.views import serve as staticfiles_serve
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from veronica.web import run_trace, views_a2a, views_steer
from veronica.web.page_parts import _context, _member_or_404, task_controls
from veronica.swarm import a2a_settings, access
from veronica.ops import metrics as metrics_module, notify, webhooks
from veronica.swarm.access import OPERATOR, OWNER
from veronica.api import selectors as sel
from veronica.api.base import Unauthorized, authenticate
from veronica.engine import budget, checks, retention, supervisor, watchdogs
from veronica.plumbing.errors import VeronicaError, storable, text_problem
from veronica.models import AccessRole, PermissionMode, Role, Space, UsageDay

# --- panels -----------------------------------------------------------------------------------------------


# Panels the space page leaves to its script (it fetches each from /panels/<name>/ as soon as it loads, with the
# page's access check): the board is a page of cards of its own (up to 50 per column, 8 columns), the usage bars a
# second copy of the roster with the checks' and waggle's counts; the roster, the approvals and the chat, what an
# operator opens the page for, would otherwise wait on them.
LAZY_SPACE_PANELS = frozenset({"tasks", "usage"})


def _space_panels(space: Space) -> dict[str, Callable[[], dict]]:
    roster = functools.cache(lambda: sel.roster(space))  # the roster and the usage panel show the same rows: read once
    return {
        "roster": lambda: {"members": roster()},
        "tasks": lambda: {"board": sel.task_board(space)},
        "approvals": lambda: {"approvals": _with_args_json(sel.approvals(space)), "questions": sel.questions(space),
                              "approval_rules": views_steer.approval_rules(space)},
        "blackboard": lambda: {"board": sel.blackboard(space)},
        "messages": lambda: {"messages": list(reversed(sel.messages(space, limit=30)["messages"]))},
        "usage": lambda: {"usage": sel.usage_panel(space, roster()), "waggle": _bars(sel.waggle_saved(space))},
    }


def _with_args_json(rows: list[dict]) -> list[dict]:
    return [{**row, "args_json": json.dumps(row["args"], indent=2, sort_keys=True, default=str)} for row in rows]


def _bars(days: list[dict] | None, height: int = 40, step: int = 10) -> dict | None:
    """Geometry for the inline SVG bar chart (None keeps the panel hidden)."""
    if days is None:
        return None
    bars = [{**d, "x": i * step + 1, "h": round(height * d["pct"] / 100, 1)} for i, d in enumerate(days)]
    for bar in bars:
        bar["y"] = height - bar["h"]
    return {"days": bars, "width": len(days) * step, "height": height, "total": sum(d["tokens"] for d in days)}


def _member_panels(space: Space, name: str, found=None) -> dict[str, Callable[[], dict]]:
    """found: the member when the caller has read it already (the page checked it exists)."""
    @functools.cache
    def member():  # read once per request (each panel asked for it again: ten reads of one row, and of its space)
        got = found if found is not None else supervisor.get_member(space, name)
        got.space = space
        return got

    skills = functools.cache(lambda: sel.skills_of(member()))  # the header and its own panel show them: read once
    memory = functools.cache(lambda: sel.memory_of(member()))
    usage = functools.cache(lambda: UsageDay.objects.filter(member=member(), day=budget.today()).first())  # header, budget
    return {
        "header": lambda: {"member": sel.member_detail(member(), skills=skills(), memory=memory(), usage=usage())},
        "transcript": lambda: {"transcript": _transcript_with_runs(member())},
        "runs": lambda: {"runs": run_trace.recent_runs(member())},
        "skills": lambda: {"skills": skills()},
        "memory": lambda: {"memory": memory()},
        "schedule": lambda: {"schedule": sel.schedule_of(member())},
        **views_steer.member_panels(member, usage),
    }


def _transcript_with_runs(member) -> dict:
    transcript = sel.transcript(member)
    run_trace.run_for_turns(member, transcript["turns"])  # each turn links to the run it was written in
    return transcript


def _current_seq(space: Space) -> int:
    # read before rendering (with the space itself, by access.space_for, just before the panels are read): an
    # event that lands mid-render is > seq, so the socket replays it; no second read of the same column
    return space.event_seq


# --- pages ------------------------------------------------------------------------------------------------

@login_required
def home(request: HttpRequest) -> HttpResponse:
    user = request.user
    rows = sel.space_list(access.visible_spaces(user), access.roles_by_space(user))
    return render(request, "console/home.html", {"spaces": rows})


@login_required
def space_page(request: HttpRequest, slug: str) -> HttpResponse:
    space, role = access.space_for(request.user, slug)
    seq = _current_seq(space)
    panels = {name: build() for name, build in _space_panels(space).items() if name not in LAZY_SPACE_PANELS}
    return render(request, "console/space.html", _context(space, role, seq=seq, panels=panels, page="space"))


@login_required
def space_panel(request: HttpRequest, slug: str, panel: str) -> HttpResponse:
    space, role = access.space_for(request.user, slug)
    build = _space_panels(space).get(panel)
    if build is None:
        raise Http404("no such panel")
    return render(request, f"console/panels/{panel}.html", _context(space, role, **build()))


@login_required
def task_page(request: HttpRequest, slug: str, task_id: int) -> HttpResponse:
    space, role = access.space_for(request.user, slug)
    task = space.tasks.select_related("assignee").filter(pk=task_id).first()
    if task is None:
        raise Http404("no such task")
    return render(request, "console/task.html", _context(
        space, role, task=sel.task_row(task), attempts=sel.check_results(task, role), verify_checks=sel.configured_checks(space, role),
        page="task", controls=task_controls(space) if access.allows(role, OPERATOR) else None))  # viewers get no forms


@login_required
def member_page(request: HttpRequest, slug: str, name: str) -> HttpResponse:
    space, role = access.space_for(request.user, slug)
    member = _member_or_404(space, name, session_usage=True)  # the header's numbers in the same read
    seq = _current_seq(space)
    panels = {key: build() for key, build in _member_panels(space, name, found=member).items()}
    return render(request, "console/member.html", _context(
        space, role, seq=seq, panels=panels, member_name=member.name, page="member",
        permission_modes=PermissionMode.values))


@login_required
def member_panel(request: HttpRequest, slug: str, name: str, panel: str) -> HttpResponse:
    space, role = access.space_for(request.user, slug)
    _member_or_404(space, name)
    build = _member_panels(space, name).get(panel)
    if build is None:
        raise Http404("no such panel")
    return render(request, f"console/panels/member_{panel}.html", _context(space, role, member_name=name, **build(),
                                                                           permission_modes=PermissionMode.values))


# --- forms ------------------------------------------------------------------------------------------------
# A refused form re-renders its page with the error and the verb's status (400 / 404 / 409); only a
# success redirects. Values no column can store are refused here, before any lookup or verb.

def refuse_unstorable(data) -> None:
    for name, values in data.lists():
        for value in values:
            if text_problem(value):
                raise VeronicaError(f"{name} {text_problem(value)}", field=name)


def form_error(request: HttpRequest, exc: VeronicaError) -> int:
    # storable: the message may quote what was refused, e.g. an archive's file name that is not UTF-8
    # (a lone surrogate), which no page can be encoded with
    messages.error(request, storable(f"{exc.field + ': ' if exc.field else ''}{exc.message}"))
    return exc.status


# --- owners: access and members ------------------------------------------------------------------------------

def _manage_action(request: HttpRequest, space: Space) -> str:
    data, actor = request.POST, access.actor_name(request.user)
    action = data.get("action", "")
    if action == "grant":
        granted = access.grant(space, data.get("username", ""), data.get("role", ""), actor=actor)
        return f"{granted.user.get_username()} is now {granted.role}"
    if action == "revoke":
        access.revoke(space, data.get("username", ""), actor=actor)
        return f"{data.get('username')} no longer has access"
    if action == "add_member":
        member = supervisor.add_member(space, data.get("name", ""), role=data.get("role", Role.WORKER),
                                       persona=data.get("persona", ""), model=data.get("model", "") or "offline", actor=actor,
                                       rule_domains=data.get("rule_domains", "").replace(",", " ").split())
        return f"added member {member.name}"
    if action == "remove_member":
        removed = supervisor.remove_member(supervisor.get_member(space, data.get("name", "")), actor=actor)
        return f"removed member {removed.name}"
    if action == "clear_webhook":
        webhooks.clear_secret(space, actor=actor)
        return "the webhook secret is removed; the webhook answers 404 until a new one is set"
    if action == "retention":
        days = retention.set_retention_days(space, data.get("retention_days", ""), actor=actor)
        return f"retention is now {days} days" if days else "retention is off (keep forever)"
    if action == "notify":
        notify.configure(space, webhook_url=data.get("webhook_url", ""), slack_url=data.get("slack_url", ""),
                         emails=data.get("emails", ""), actor=actor)
        return "notifier saved"
    if action == "watchdogs":
        watchdogs.set_thresholds(space, {name: data.get(name, "") for name in watchdogs.THRESHOLDS}, actor=actor)
        return "watchdog thresholds saved"
    if action == "notify_test":
        event = notify.send_test(space, actor=actor)
        return f"test notification queued (alert #{event.seq}); see the delivery log below"
    if action in ("add_check", "edit_check", "remove_check"):
        return _check_action(space, action, data, actor)
    if action in ("add_mcp", "remove_mcp", "check_mcp", "env_mcp"):
        return _mcp_action(space, action, data, actor)
    if action in views_a2a.CONSOLE_ACTIONS:
        return views_a2a.console_action(space, data, actor)
    raise VeronicaError("action must be grant, revoke, add_member, remove_member, rotate_webhook, clear_webhook, retention, "
                        "notify, notify_test, watchdogs, add_check, edit_check, remove_check, add_mcp, remove_mcp, env_mcp "
                        "or check_mcp",
                        field="action")


def _check_from_form(data) -> dict:
    """The form's strings as the check verb's types; a blank timeout takes the default."""
    item = {"name": data.get("name", "").strip(), "command": data.get("command", "")}
    raw = data.get("timeout", "").strip()
    if raw:
        item["timeout"] = int(raw) if raw.isdigit() else raw  # a non-number is refused by the verb, naming the limit
    return item


def _check_action(space: Space, action: str, data, actor: str) -> str:
    if action == "add_check":
        checks.add_check(space, _check_from_form(data), actor=actor)
        return f"added check {data.get('name', '').strip()}"
    if action == "edit_check":
        checks.update_check(space, data.get("check", ""), _check_from_form(data), actor=actor)
        return f"saved check {data.get('name', '').strip()}"
    checks.remove_check(space, data.get("check", ""), actor=actor)
    return f"removed check {data.get('check')}"


def _mcp_action(space: Space, action: str, data, actor: str) -> str:
    from veronica.swarm import mcp_servers
    from veronica.plumbing.errors import NotFound

    who = data.get("member", "").strip()
    member = supervisor.get_member(space, who) if who else None
    if action == "add_mcp":
        server = mcp_servers.add(space, mcp_servers.from_form(data), member=member, actor=actor)
        return f"added MCP server {server.name}" + (f" for {member.name}" if member else "")
    if action == "remove_mcp":
        mcp_servers.remove(space, data.get("name", ""), member=member, actor=actor)
        return f"removed MCP server {data.get('name')}"
    if action == "env_mcp":
        server = mcp_servers.set_env(space, data.get("name", ""), data.get("env", ""), member=member, actor=actor)
        return f"saved the environment of MCP server {server.name} ({len(server.env)} variables)"
    from veronica.agent.tools import mcp

    server = space.mcp_servers.filter(member=member, name=data.get("name", "")).first()
    if server is None:
        raise NotFound(f"no MCP server named '{data.get('name', '')}'", field="name")
    checked = mcp.check(server, space.workdir)
    if checked is None:
        server.refresh_from_db()
        unavailable = VeronicaError(server.last_error, field=f"mcp {server.name}")
        unavailable.status = 502  # the server, not the form, is at fault
        raise unavailable
    return f"MCP server {server.name} is up: {len(checked[1])} tools"


@login_required
@require_http_methods(["GET", "POST"])
def manage_page(request: HttpRequest, slug: str) -> HttpResponse:
    space, role = access.space_for(request.user, slug, OWNER)
    status, new_secret, new_a2a_key = 200, None, None
    if request.method == "POST":
        try:
            refuse_unstorable(request.POST)
            if request.POST.get("action") == "rotate_webhook":
                new_secret = webhooks.rotate_secret(space, actor=access.actor_name(request.user))
            elif request.POST.get("action") == "a2a_credential":  # shown once, like the webhook secret
                new_a2a_key = views_a2a.create_console_credential(space, request.POST, access.actor_name(request.user))
            else:
                messages.success(request, _manage_action(request, space))
                return redirect("console:manage", slug=space.slug)
        except VeronicaError as exc:
            status = form_error(request, exc)
    # no-store already covers every page; the one that shows a secret once says so itself as well
    return render(request, "console/manage.html", _context(
        space, role, access_rows=access.access_list(space), members=sel.roster(space), roles=AccessRole.values,
        member_roles=Role.values, page="manage", webhook=webhooks.status(space), new_secret=new_secret,
        retention=retention.preview(space), notifier=notify.config_of(space), deliveries=notify.delivery_rows(space, 30),
        thresholds=watchdogs.thresholds_of(space), verify_checks=space.verify_checks, check_timeout_max=checks.TIMEOUT_MAX,
        check_timeout_default=checks.TIMEOUT_DEFAULT, check_limit=checks.MAX_CHECKS, check_counts=checks.counts([space.pk])[space.pk],
        mcp_rows=space.mcp_servers.select_related("member").order_by("member__name", "name"),
        a2a=a2a_settings.status(space), new_a2a_key=new_a2a_key), status=status)


# --- tokens -----------------------------------------------------------------------------------------------

@login_required
@require_http_methods(["GET", "POST"])
def tokens_page(request: HttpRequest) -> HttpResponse:
    new_key, status = None, 200
    if request.method == "POST":
        try:
            refuse_unstorable(request.POST)
            if request.POST.get("action") == "revoke":
                token = access.revoke_token(request.user, _int(request.POST.get("token_id")))
                messages.success(request, f"revoked {token.name}")
            else:
                token, new_key = access.create_token(request.user, request.POST.get("name", ""),
                                                     expires_in_days=request.POST.get("expires_in_days", ""),
                                                     read_only=request.POST.get("read_only") == "on")
            if new_key is None:
                return redirect("console:tokens")
        except VeronicaError as exc:
            status = form_error(request, exc)
    rows = access.tokens_of(request.user)
    response = render(request, "console/tokens.html", {"tokens": rows, "new_key": new_key, "now": timezone.now(),
                                                       "max_days": access.TOKEN_MAX_DAYS}, status=status)
    response["Cache-Control"] = "no-store"  # the page that shows a key once must not be cached
    return response


def _int(raw: str | None) -> int:
    try:
        return int(raw or "")
    except ValueError:
        raise VeronicaError("token_id must be an integer", field="token_id") from None


# --- metrics, static, api 404 -----------------------------------------------------------------------------------

def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text for staff (session or a staff user's token) over the spaces they see; 401 anonymous, 403 others."""
    try:
        authenticate(request)
    except Unauthorized as exc:
        response = HttpResponse(f"{exc}\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="veronica"'
        return response
    if not request.user.is_staff:
        return HttpResponse("metrics are for staff\n", status=403, content_type="text/plain")
    body = metrics_module.render(access.visible_spaces(request.user))
    return HttpResponse(body, content_type="text/plain; version=0.0.4; charset=utf-8")


def static_file(request: HttpRequest, path: str) -> HttpResponse:
    """Static files through the finders, whatever DEBUG says: the embedded default has no other
    web server (daphne serves only the app). Hosted installs may put a CDN or proxy in front."""
    return staticfiles_serve(request, path, insecure=True)


def api_not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    return JsonResponse({"error": f"no API endpoint at /api/{rest}"}, status=404)
