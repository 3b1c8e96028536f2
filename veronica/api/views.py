"""JSON endpoints under /api/. Thin: check access, parse input, call one verb or selector."""
from __future__ import annotations

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from veronica.swarm import access, blackboard, bus, memory
from veronica.ops import notify, webhooks
from veronica.swarm.access import OPERATOR, OWNER
from veronica.api import cockpit
from veronica.api import selectors as sel
from veronica.api.base import _actor, _space, endpoint, error, json_body, text_field
from veronica.engine import approvals as approval_verbs
from veronica.engine import checks, retention, supervisor, watchdogs
from veronica.plumbing.errors import NotFound, VeronicaError
from veronica.models import ApprovalStatus, RetirePolicy, TaskStatus

# --- who am I, tokens -----------------------------------------------------------------------------------

ENDPOINTS = [
    "GET /api/me/", "GET|POST /api/tokens/", "DELETE /api/tokens/<id>/", "GET /api/spaces/",
    "GET /api/spaces/<slug>/", "GET /api/spaces/<slug>/usage/", "POST /api/spaces/<slug>/halt/",
    "GET|POST(owner) /api/spaces/<slug>/members/", "GET|PATCH(owner)|DELETE(owner) /api/spaces/<slug>/members/<name>/",
    "GET|POST(owner) /api/spaces/<slug>/skills/", "DELETE(owner) /api/spaces/<slug>/skills/<skill>/",
    "POST(owner) /api/spaces/<slug>/members/<name>/skills/", "DELETE(owner) /api/spaces/<slug>/members/<name>/skills/<skill>/",
    "GET|POST /api/spaces/<slug>/tasks/", "POST /api/spaces/<slug>/tasks/<id>/(assign|reassign|cancel|retry)/",
    "GET /api/spaces/<slug>/members/<name>/transcript/?session=&after=&limit=",
    "GET /api/spaces/<slug>/members/<name>/skills/", "GET|POST /api/spaces/<slug>/members/<name>/memory/",
    "GET|PUT|DELETE /api/spaces/<slug>/members/<name>/memory/<file>/",
    "GET|PUT|DELETE /api/spaces/<slug>/members/<name>/schedule/",
    "POST /api/spaces/<slug>/members/<name>/(suspend|resume|freeze|unfreeze|clear|compact|permission|spawn)/",
    "GET /api/spaces/<slug>/tasks/?status=&assignee=&limit=", "GET|POST /api/spaces/<slug>/messages/?member=&before=&limit=",
    "GET /api/spaces/<slug>/events/?after=&limit=", "GET|PUT /api/spaces/<slug>/blackboard/",
    "GET /api/spaces/<slug>/approvals/?status=", "POST /api/spaces/<slug>/approvals/<id>/(approve|deny)/",
    "GET /api/spaces/<slug>/questions/?all=1", "POST /api/spaces/<slug>/questions/<id>/answer/",
    "GET|POST(owner) /api/spaces/<slug>/access/", "DELETE(owner) /api/spaces/<slug>/access/<username>/",
    "POST(HMAC) /api/spaces/<slug>/webhook/", "POST(HMAC) /api/spaces/<slug>/members/<name>/webhook/",
    "GET|POST|DELETE(owner) /api/spaces/<slug>/webhook/secret/", "GET|PUT(owner)|POST(owner) /api/spaces/<slug>/retention/",
    "GET|PUT(owner) /api/spaces/<slug>/notify/", "POST(owner) /api/spaces/<slug>/notify/test/",
    "GET|PUT(owner) /api/spaces/<slug>/checks/", "GET|PUT(owner) /api/spaces/<slug>/watchdogs/",
    "GET|POST(owner) /api/spaces/<slug>/[members/<name>/]secrets/ (names only)", "DELETE(owner) .../secrets/<name>/",
    "WS /ws/spaces/<slug>/?after=<seq>",
]


@endpoint("GET")
def index(request: HttpRequest) -> dict:
    from veronica.api import steer

    return {"endpoints": ENDPOINTS + steer.ENDPOINTS, "auth": "session (CSRF on writes) or 'Authorization: Bearer <token>'",
            "errors": '{"error": "...", "field": "..."} with 400 / 401 / 403 / 404 / 405 / 409'}


@endpoint("GET")
def me(request: HttpRequest) -> dict:
    return {"username": request.user.get_username(), "is_staff": request.user.is_staff, "token": request.auth_by_token}


def _token_row(token) -> dict:
    return {"id": token.pk, "name": token.name, "prefix": token.prefix, "created_at": sel.iso(token.created_at),
            "last_used_at": sel.iso(token.last_used_at), "revoked_at": sel.iso(token.revoked_at),
            "expires_at": sel.iso(token.expires_at), "read_only": token.read_only}


@endpoint("GET", "POST")
def tokens(request: HttpRequest):
    if request.method == "GET":
        return {"tokens": [_token_row(t) for t in access.tokens_of(request.user)]}
    if request.auth_by_token:
        # a leaked key must not be able to outlive its own revocation by minting a successor
        raise PermissionDenied("tokens are created from a logged-in session, not with another token")
    data = json_body(request)
    token, key = access.create_token(request.user, text_field(data, "name"), expires_in_days=data.get("expires_in_days"),
                                     read_only=data.get("read_only", False))
    return {**_token_row(token), "key": key, "note": "Store the key now; it is never shown again."}, 201


@endpoint("DELETE")
def token_detail(request: HttpRequest, token_id: int) -> dict:
    return _token_row(access.revoke_token(request.user, token_id))


# --- spaces ----------------------------------------------------------------------------------------------

@endpoint("GET")
def spaces(request: HttpRequest) -> dict:
    user = request.user
    return {"spaces": sel.space_list(access.visible_spaces(user), access.roles_by_space(user))}


@endpoint("GET")
def space_detail(request: HttpRequest, slug: str) -> dict:
    space, role = _space(request, slug)
    return sel.space_detail(space, role)


@endpoint("GET")
def usage(request: HttpRequest, slug: str) -> dict:
    space, _ = _space(request, slug)
    return {**sel.usage_panel(space), "waggle_saved": sel.waggle_saved(space)}


@endpoint("POST")
def halt(request: HttpRequest, slug: str) -> dict:
    space, _ = _space(request, slug)
    return {"suspended": supervisor.halt_all(space, actor=_actor(request))}


# --- members ---------------------------------------------------------------------------------------------

@endpoint("GET", "POST")
def members(request: HttpRequest, slug: str):
    if request.method == "GET":
        space, _ = _space(request, slug)
        return {"members": sel.roster(space)}
    space, _ = _space(request, slug, OWNER)
    member = cockpit.add_member(space, json_body(request), _actor(request))
    return cockpit.member_config(member), 201


@endpoint("GET", "DELETE", "PATCH")
def member_detail(request: HttpRequest, slug: str, name: str) -> dict:
    if request.method == "PATCH":  # owners edit the configuration (supervisor.edit_member)
        return cockpit.member_patch(request, slug, name)
    if request.method == "GET":
        space, _ = _space(request, slug)
        return cockpit.member_config(supervisor.get_member(space, name))  # with the editable fields as stored
    space, _ = _space(request, slug, OWNER)
    removed = supervisor.remove_member(supervisor.get_member(space, name), actor=_actor(request))
    return {"name": removed.name, "removed_at": sel.iso(removed.removed_at)}


@endpoint("GET")
def transcript(request: HttpRequest, slug: str, name: str) -> dict:
    space, _ = _space(request, slug)
    member = supervisor.get_member(space, name)
    params = request.GET
    return sel.transcript(member, session_id=sel.int_param(params, "session", None, minimum=1),
                          after=sel.int_param(params, "after", None), limit=sel.int_param(params, "limit", 200, minimum=1, maximum=sel.MAX_LIMIT))


@endpoint("GET", "POST")
def member_skills(request: HttpRequest, slug: str, name: str) -> dict:
    if request.method == "POST":  # owners author the member's own skills
        return cockpit.member_skills_post(request, slug, name)
    space, _ = _space(request, slug)
    return {"skills": sel.skills_of(supervisor.get_member(space, name))}


@endpoint("GET", "POST")
def member_memory(request: HttpRequest, slug: str, name: str):
    space, _ = _space(request, slug)
    member = supervisor.get_member(space, name)
    if request.method == "POST":  # operators create or replace a file: {"name", "content"}
        data = json_body(request)
        row = memory.write(member, text_field(data, "name"), text_field(data, "content", required=False), actor=_actor(request))
        return sel.memory_row(row), 201
    return {"memory": sel.memory_of(member), "limits": memory.limits(member)}


@endpoint("GET", "PUT", "DELETE")
def member_memory_file(request: HttpRequest, slug: str, name: str, file: str):
    space, _ = _space(request, slug)
    member = supervisor.get_member(space, name)
    if request.method == "PUT":
        data = json_body(request)
        return sel.memory_row(memory.write(member, file, text_field(data, "content", required=False), actor=_actor(request)))
    if request.method == "DELETE":
        return {"name": memory.delete(member, file, actor=_actor(request)), "deleted": True}
    return sel.memory_row(memory.get(member, file))


@endpoint("GET", "PUT", "POST", "DELETE")
def member_schedule(request: HttpRequest, slug: str, name: str) -> dict:
    space, _ = _space(request, slug)
    member = supervisor.get_member(space, name)
    if request.method in ("PUT", "POST"):
        member = supervisor.set_schedule(member, text_field(json_body(request), "cron"), actor=_actor(request))
    elif request.method == "DELETE":
        member = supervisor.clear_schedule(member, actor=_actor(request))
    return sel.schedule_of(member)


def _compact(member, request):
    return supervisor.compact(member, text_field(json_body(request), "kind"), actor=_actor(request))


def _permission(member, request):
    return supervisor.set_permission_mode(member, text_field(json_body(request), "mode"), actor=_actor(request))


def _spawn(member, request):
    """An operator's clone: the spawn cap is the leader's guardrail, not the operator's."""
    data = json_body(request) if request.body else {}
    retire = text_field(data, "retire", required=False) or RetirePolicy.ON_COMPLETE
    clone = supervisor.spawn(member, retire_policy=retire, actor=_actor(request), capped=False)
    return {"spawned": clone.name, "retire": clone.retire_policy}


MEMBER_ACTIONS = {
    "suspend": lambda m, r: supervisor.suspend(m, actor=_actor(r)),
    "resume": lambda m, r: supervisor.resume(m, actor=_actor(r)),
    "freeze": lambda m, r: supervisor.freeze(m, actor=_actor(r)),
    "unfreeze": lambda m, r: supervisor.unfreeze(m, actor=_actor(r)),
    "clear": lambda m, r: supervisor.clear_session(m, actor=_actor(r)),
    "compact": _compact,
    "permission": _permission,
    "spawn": _spawn,
}


@endpoint("POST")
def member_action(request: HttpRequest, slug: str, name: str, action: str) -> dict:
    space, _ = _space(request, slug)
    verb = MEMBER_ACTIONS.get(action)
    if verb is None:
        raise VeronicaError(f"action must be one of {', '.join(MEMBER_ACTIONS)}", field="action")
    member = supervisor.get_member(space, name)
    result = verb(member, request)
    member.refresh_from_db()
    out = sel.member_detail(member)
    if isinstance(result, dict):
        out["result"] = result
    return out


# --- tasks, messages, events -------------------------------------------------------------------------------

@endpoint("GET", "POST")
def tasks(request: HttpRequest, slug: str) -> dict:
    space, _ = _space(request, slug)
    if request.method == "POST":  # operators create tasks (ledger.create_task)
        return cockpit.tasks_post(request, space)
    params = request.GET
    return {"tasks": sel.tasks(space, status=sel.choice_param(params, "status", TaskStatus.values),
                               assignee=params.get("assignee") or None,
                               limit=sel.int_param(params, "limit", 200, minimum=1, maximum=sel.MAX_LIMIT))}


@endpoint("GET")
def task_detail(request: HttpRequest, slug: str, task_id: int) -> dict:
    """One task with every verification's check results (the console's task page)."""
    space, role = _space(request, slug)
    task = space.tasks.select_related("assignee").filter(pk=task_id).first()
    if task is None:
        raise NotFound(f"no task #{task_id} in space {slug}", field="task_id")
    return {**sel.task_row(task), "check_results": sel.check_results(task, role)}


@endpoint("GET", "POST")
def messages(request: HttpRequest, slug: str):
    space, _ = _space(request, slug)
    if request.method == "GET":
        params = request.GET
        return sel.messages(space, member=params.get("member") or None, before=sel.int_param(params, "before", None, minimum=1),
                            limit=sel.int_param(params, "limit", 50, minimum=1, maximum=200))
    data = json_body(request)
    to = text_field(data, "to")
    if to.strip() == bus.OPERATOR:
        raise VeronicaError("to must name a member, a role or 'all'", field="to")
    sent = bus.send(space, bus.OPERATOR, to, text_field(data, "body"), subject=text_field(data, "subject", required=False))
    return {"messages": [sel.message_row(m) for m in sent]}, 201


@endpoint("GET")
def events(request: HttpRequest, slug: str) -> dict:
    space, _ = _space(request, slug)
    params = request.GET
    return sel.events_after(space, sel.int_param(params, "after", 0), sel.int_param(params, "limit", 200, minimum=1, maximum=1000))


@endpoint("GET", "PUT")
def blackboard_view(request: HttpRequest, slug: str) -> dict:
    space, _ = _space(request, slug)
    if request.method == "PUT":
        blackboard.write(space, _actor(request), text_field(json_body(request), "content"))
    return sel.blackboard(space)


# --- approvals and questions -----------------------------------------------------------------------------

@endpoint("GET")
def approvals(request: HttpRequest, slug: str) -> dict:
    space, _ = _space(request, slug)
    status = sel.choice_param(request.GET, "status", ApprovalStatus.values + ["any"]) or ApprovalStatus.PENDING
    return {"approvals": sel.approvals(space, status=None if status == "any" else status)}


@endpoint("POST")
def approval_decide(request: HttpRequest, slug: str, approval_id: int, decision: str) -> dict:
    space, _ = _space(request, slug)
    data = json_body(request)
    approval = approval_verbs.get_approval(space, approval_id)
    decided = approval_verbs.decide(approval, approve=decision == "approve", user=request.user,
                                    reason=text_field(data, "reason", required=False), always=data.get("always", False))
    return sel.approval_row(decided)


@endpoint("GET")
def questions(request: HttpRequest, slug: str) -> dict:
    space, _ = _space(request, slug)
    return {"questions": sel.questions(space, open_only=request.GET.get("all") not in ("1", "true"))}


@endpoint("POST")
def question_answer(request: HttpRequest, slug: str, question_id: int) -> dict:
    space, _ = _space(request, slug)
    data = json_body(request)
    question = sel.get_question(space, question_id)
    return sel.question_row(approval_verbs.answer(question, text=text_field(data, "answer"), user=request.user))


# --- access (owners) -------------------------------------------------------------------------------------

@endpoint("GET", "POST")
def space_access(request: HttpRequest, slug: str):
    space, _ = _space(request, slug, OWNER)
    if request.method == "GET":
        return {"access": access.access_list(space)}
    data = json_body(request)
    granted = access.grant(space, text_field(data, "username"), text_field(data, "role"), actor=_actor(request))
    return {"username": granted.user.get_username(), "role": granted.role}, 201


@endpoint("DELETE")
def space_access_detail(request: HttpRequest, slug: str, username: str) -> dict:
    space, _ = _space(request, slug, OWNER)
    access.revoke(space, username, actor=_actor(request))
    return {"username": username, "revoked": True}


# --- inbound webhook (HMAC, no session) and its secret (owners) ---------------------------------------------

@csrf_exempt
def webhook(request: HttpRequest, slug: str, name: str | None = None) -> JsonResponse:
    """Signed by the space's secret instead of a login or CSRF token (see veronica.ops.webhooks)."""
    if request.method != "POST":
        response = error(405, f"{request.method} is not allowed here; use POST")
        response["Allow"] = "POST"
        return response
    try:
        space = webhooks.space_for_webhook(slug)
        webhooks.check_size(request.META.get("CONTENT_LENGTH"))
        try:
            body = request.body
        except RequestDataTooBig:
            raise webhooks.TooLarge(f"the body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes", field="body") from None
        delivery = webhooks.Delivery(timestamp=request.headers.get(webhooks.TIMESTAMP_HEADER, "").strip(),
                                     signature=request.headers.get(webhooks.SIGNATURE_HEADER, "").strip(), body=body)
        rows = webhooks.deliver(space, delivery, member_name=name)
    except VeronicaError as exc:
        return JsonResponse(exc.as_dict(), status=exc.status)
    return JsonResponse({"delivered": [{"id": m.pk, "to": m.recipient_name} for m in rows]}, status=202)


@endpoint("GET", "POST", "DELETE")
def webhook_secret(request: HttpRequest, slug: str):
    """GET: whether a secret is set. POST: a new one, returned this once. DELETE: none (webhook off)."""
    space, _ = _space(request, slug, OWNER)
    if request.method == "POST":
        secret = webhooks.rotate_secret(space, actor=_actor(request))
        return {**webhooks.status(space), "secret": secret, "note": "Store the secret now; it is never shown again."}, 201
    if request.method == "DELETE":
        webhooks.clear_secret(space, actor=_actor(request))
    return webhooks.status(space)


# --- retention (owners set and purge; everyone may preview) ---------------------------------------------

@endpoint("GET", "PUT", "POST")
def retention_view(request: HttpRequest, slug: str):
    """GET: the setting and a dry run. PUT {"retention_days"}: set it. POST: purge now."""
    if request.method == "GET":
        space, _ = _space(request, slug)
        return retention.preview(space)
    space, _ = _space(request, slug, OWNER)
    if request.method == "PUT":
        data = json_body(request)
        if "retention_days" not in data:
            raise VeronicaError("retention_days is required", field="retention_days")
        if isinstance(data["retention_days"], bool) or not isinstance(data["retention_days"], int):
            raise VeronicaError("retention_days must be an integer", field="retention_days")
        retention.set_retention_days(space, data["retention_days"], actor=_actor(request))
        return retention.preview(space)
    return {"removed": retention.purge_space(space), **retention.preview(space)}


# --- ops: notifier and verify checks (owners) --------------------------------------------------------

def _notify_state(space) -> dict:
    return {**notify.config_of(space), "deliveries": notify.delivery_rows(space)}


@endpoint("GET", "PUT")
def space_notify(request: HttpRequest, slug: str) -> dict:
    space, _ = _space(request, slug, OWNER)
    if request.method == "PUT":
        data = json_body(request)
        notify.configure(space, webhook_url=data.get("webhook_url"), slack_url=data.get("slack_url"), emails=data.get("emails"),
                         actor=_actor(request))
    return _notify_state(space)


@endpoint("POST")
def space_notify_test(request: HttpRequest, slug: str):
    space, _ = _space(request, slug, OWNER)
    event = notify.send_test(space, actor=_actor(request))
    return {"seq": event.seq, "queued": [r for r in notify.delivery_rows(space) if r["seq"] == event.seq]}, 202


@endpoint("GET", "PUT")
def space_checks(request: HttpRequest, slug: str) -> dict:
    space, _ = _space(request, slug, OWNER)
    if request.method == "PUT":
        checks.configure(space, json_body(request).get("checks"), actor=_actor(request))
    return {"checks": space.verify_checks, "counts": checks.counts([space.pk])[space.pk]}


@endpoint("GET", "PUT")
def space_watchdogs(request: HttpRequest, slug: str) -> dict:
    space, _ = _space(request, slug, OWNER)
    if request.method == "PUT":
        watchdogs.set_thresholds(space, json_body(request), actor=_actor(request))
    return watchdogs.thresholds_of(space)
