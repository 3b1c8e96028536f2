"""The A2A doors: the served agents (a bearer credential of the space, no session, no CSRF) and the
owners' settings API (the API's usual token or session auth). Thin callers of a2a_serve and
a2a_settings.

    GET  /a2a/<slug>/.well-known/agent-card.json            the space's agent (its leader)
    POST /a2a/<slug>/                                       JSON-RPC
    GET  /a2a/<slug>/<member>/.well-known/agent-card.json   a member the owner exposes
    POST /a2a/<slug>/<member>/

A space that does not exist, has A2A off, or a member not exposed all answer the same 404."""
from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from veronica.web import a2a_serve
from veronica.swarm import a2a_settings, access
from veronica.web.a2a_serve import RpcError
from veronica.api.base import Unauthorized, bearer_key, endpoint, json_body
from veronica.plumbing.errors import VeronicaError
from veronica.models import Event, Space

NOT_SERVED = "no A2A agent here: the space does not exist, does not serve A2A, or does not expose that member"


def _agent(slug: str, member_name: str | None):
    space = Space.objects.filter(slug=slug[:100]).first()
    if space is None or not a2a_settings.config(space).enabled:
        return None, None
    return space, a2a_settings.agent_member(space, member_name)


def _rpc_error(request_id, exc: RpcError) -> JsonResponse:
    response = JsonResponse(a2a_serve.error_body(getattr(exc, "request_id", request_id), exc.error), status=exc.http_status)
    if exc.http_status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="veronica-a2a"'
    return response


@csrf_exempt
def card(request: HttpRequest, slug: str, name: str | None = None) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return JsonResponse({"error": "use GET"}, status=405, headers={"Allow": "GET, HEAD"})
    space, member = _agent(slug, name)
    if member is None:
        return JsonResponse({"error": NOT_SERVED}, status=404)
    base = f"/a2a/{space.slug}/" + (f"{member.name}/" if name else "")
    return JsonResponse(a2a_serve.card(space, member, request.build_absolute_uri(base)))


def _credential(request: HttpRequest, space: Space):
    from a2a import types as t

    try:
        key = bearer_key(request)
    except Unauthorized as exc:
        raise RpcError(t.InvalidRequestError(message=f"unauthorized: {exc}"), 401) from None
    cred = a2a_settings.credential_for_key(space, key or "")
    if cred is None:
        raise RpcError(t.InvalidRequestError(message="unauthorized: send this space's A2A credential as "
                                                     "'Authorization: Bearer a2a_…' (unknown, revoked or missing)"), 401)
    return cred


def _check_role(cred, method: str) -> None:
    from a2a import types as t

    need = access.VIEWER if method in a2a_serve.READ_METHODS else access.OPERATOR
    if not access.allows(cred.role, need):
        raise RpcError(t.InvalidRequestError(message=f"forbidden: {method} needs the {need} role; this credential is {cred.role}"), 403)


@csrf_exempt
def rpc(request: HttpRequest, slug: str, name: str | None = None) -> HttpResponse:
    from a2a import types as t

    if request.method != "POST":
        return JsonResponse({"error": "JSON-RPC: use POST"}, status=405, headers={"Allow": "POST"})
    space, member = _agent(slug, name)
    if member is None:
        return JsonResponse({"error": NOT_SERVED}, status=404)
    request_id = None
    try:
        cred = _credential(request, space)  # before the body is read: an anonymous caller learns nothing more
        try:
            raw = request.body
        except RequestDataTooBig:
            raise RpcError(t.InvalidRequestError(message="the request body is over the server's limit"), 413) from None
        parsed = a2a_serve.parse(raw)
        request_id = parsed.id
        _check_role(cred, parsed.method)
        params = parsed.request.params
        if parsed.method == "tasks/get":
            return JsonResponse(a2a_serve.result_body(request_id, a2a_serve.get(space, params)))
        if parsed.method == "tasks/cancel":
            return JsonResponse(a2a_serve.result_body(request_id, a2a_serve.cancel(space, cred, params)))
        after = Event.objects.filter(space=space).order_by("-seq").values_list("seq", flat=True).first() or 0
        link = a2a_serve.start(space, member, cred, params)
        if parsed.method == "message/send":
            return JsonResponse(a2a_serve.result_body(request_id, a2a_serve.as_task(link), wrap="task"))
        response = StreamingHttpResponse(a2a_serve.TaskStream(space, link, request_id, after_seq=after),
                                         content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
    except RpcError as exc:
        return _rpc_error(request_id, exc)
    except VeronicaError as exc:  # a verb's refusal (bad text, a frozen member): invalid params, nothing written
        return _rpc_error(request_id, RpcError(t.InvalidParamsError(message=f"{exc.field or 'params'}: {exc}")))


# --- owners: the settings (the API) ----------------------------------------------------------------

def _owner_space(request: HttpRequest, slug: str, need: str = access.OWNER) -> Space:
    return access.space_for(request.user, slug, need)[0]


@endpoint("GET", "POST")
def settings_api(request: HttpRequest, slug: str):
    """GET: the settings (no keys). POST {enabled?, members?}: turn serving on or off, expose members."""
    space = _owner_space(request, slug, access.VIEWER if request.method == "GET" else access.OWNER)
    if request.method == "POST":
        data = json_body(request)
        actor = access.actor_name(request.user)
        unknown = sorted(set(data) - {"enabled", "members"})
        if unknown:
            raise VeronicaError("unknown key (known: enabled, members)", field=unknown[0])
        with transaction.atomic():  # both or neither: a refused members list leaves serving as it was
            if "enabled" in data:
                a2a_settings.set_enabled(space, data["enabled"], actor=actor)
            if "members" in data:
                a2a_settings.set_members(space, data["members"], actor=actor)
    return a2a_settings.status(space)


@endpoint("POST")
def credentials_api(request: HttpRequest, slug: str):
    """POST {name, role}: a new caller credential, its key returned this once."""
    space = _owner_space(request, slug)
    data = json_body(request)
    cred, key = a2a_settings.create_credential(space, data.get("name"), data.get("role", access.OPERATOR),
                                               actor=access.actor_name(request.user))
    return {"id": cred.pk, "name": cred.name, "role": cred.role, "key": key,
            "note": "Store the key now; it is never shown again."}, 201


@endpoint("DELETE")
def credential_api(request: HttpRequest, slug: str, credential_id: int):
    space = _owner_space(request, slug)
    cred = a2a_settings.revoke_credential(space, credential_id, actor=access.actor_name(request.user))
    return {"id": cred.pk, "revoked": True}


@endpoint("POST")
def remotes_api(request: HttpRequest, slug: str):
    """POST {name, card_url, timeout?, token?}: declare a remote agent (its card is read now)."""
    space = _owner_space(request, slug)
    cfg = a2a_settings.check_remote(json_body(request))
    remote = a2a_settings.add_remote(space, cfg, actor=access.actor_name(request.user))
    return {"name": remote.name, "endpoint": remote.endpoint, "tool": f"a2a__{remote.name}"}, 201


@endpoint("DELETE")
def remote_api(request: HttpRequest, slug: str, name: str):
    space = _owner_space(request, slug)
    a2a_settings.remove_remote(space, name, actor=access.actor_name(request.user))
    return {"removed": name}


# --- owners: the console's manage page --------------------------------------------------------------

CONSOLE_ACTIONS = ("a2a_serve", "a2a_members", "a2a_revoke", "a2a_add_remote", "a2a_remove_remote")


def console_action(space: Space, data, actor: str) -> str:
    """One form on the manage page, one verb (a2a_credential is the manage view's: its key is shown once)."""
    action = data.get("action", "")
    if action == "a2a_serve":
        on = data.get("enabled", "") == "on"
        a2a_settings.set_enabled(space, on, actor=actor)
        return "A2A serving is on" if on else "A2A serving is off"
    if action == "a2a_members":
        names = data.get("members", "").replace(",", " ").split()
        a2a_settings.set_members(space, names, actor=actor)
        return f"exposed members: {', '.join(names) or 'none (the leader only)'}"
    if action == "a2a_revoke":
        raw = data.get("credential_id", "")
        a2a_settings.revoke_credential(space, int(raw) if raw.isdigit() and len(raw) < 12 else -1, actor=actor)
        return "credential revoked"
    if action == "a2a_add_remote":
        timeout = data.get("timeout", "").strip() or "60"
        cfg = a2a_settings.check_remote({"name": data.get("name", "").strip(), "card_url": data.get("card_url", "").strip(),
                                         "token": data.get("token", ""),
                                         "timeout": int(timeout) if timeout.isdigit() and len(timeout) < 6 else timeout})
        remote = a2a_settings.add_remote(space, cfg, actor=actor)
        return f"added remote agent {remote.name}: members call it as a2a__{remote.name}"
    a2a_settings.remove_remote(space, data.get("name", ""), actor=actor)
    return f"removed remote agent {data.get('name')}"


def create_console_credential(space: Space, data, actor: str) -> str:
    _, key = a2a_settings.create_credential(space, data.get("name", "").strip(), data.get("role", ""), actor=actor)
    return key
