"""The one wrapper every JSON endpoint goes through: authentication, CSRF, errors as JSON.

* A request with `Authorization: Bearer <key>` is authenticated by that token only (a bad one is
  401, never a fall-back to the session) and is exempt from CSRF: no browser sends it by itself.
  A read-only token gets 403 on every method but GET/HEAD/OPTIONS, before the view runs.
* Otherwise the session decides; an anonymous caller gets 401. Session writes must pass Django's
  CSRF check (the endpoints are csrf_exempt so token calls can pass; the check is re-run here).
* VeronicaError -> its status with {"error", "field"}; Http404 -> 404; PermissionDenied -> 403.
* Bad input is never a 500: json_body refuses a body that is not one JSON object, too large, too
  deeply nested, or holding a string no database column can store (NUL, lone surrogates); the
  wrapper refuses such query parameters and URL parts before the view runs. Errors name the field
  (its path, e.g. `rule_domains[1]`; `json` for the body as a whole) and the limit.
"""
from __future__ import annotations

import json
from functools import wraps
from typing import Any, Callable

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from veronica.swarm import access
from veronica.swarm.access import OPERATOR, VIEWER
from veronica.plumbing.errors import VeronicaError, check_tree, text_problem

SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


class Unauthorized(Exception):
    pass


def error(status: int, message: str, field: str = "") -> JsonResponse:
    body = {"error": message}
    if field:
        body["field"] = field
    response = JsonResponse(body, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="veronica"'
    return response


def bearer_key(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    if not header:
        return None
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("Authorization must be 'Bearer <token>'")
    return key.strip()


def authenticate(request: HttpRequest) -> None:
    key = bearer_key(request)
    if key is not None:
        token = access.token_for_key(key)
        if token is None:
            raise Unauthorized("the token is unknown, revoked or expired, or its user's password changed since it was made")
        request.user = token.user
        request.audit_token_id = token.pk  # the audit trail's "how": via token, which one
        request.auth_by_token = True
        request.token_read_only = token.read_only
        return
    request.auth_by_token = False
    request.token_read_only = False
    if not request.user.is_authenticated:
        raise Unauthorized("log in or send an API token")


def _csrf_failure_reason(request: HttpRequest) -> str | None:
    check = CsrfViewMiddleware(lambda req: HttpResponse())
    check.process_request(request)
    response = check.process_view(request, None, (), {})
    return None if response is None else "CSRF check failed: send the csrftoken cookie's value as X-CSRFToken"


MAX_DEPTH = 32  # the deepest a request body may nest; no endpoint needs more than 3


class TooLarge(VeronicaError):
    status = 413


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _check_tree(data: object) -> None:
    check_tree(data, max_depth=MAX_DEPTH)


def json_body(request: HttpRequest) -> dict:
    """The request body as a JSON object of storable values; anything else is a 4xx naming the
    field (`json` for the body as a whole) and the limit."""
    try:
        raw = request.body
    except RequestDataTooBig:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raise TooLarge(f"the request body is larger than the limit of {limit} bytes", field="json") from None
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:  # the C parser's own depth guard (about 1,000 levels): far past ours
        raise VeronicaError(f"the request body nests deeper than {MAX_DEPTH} levels", field="json") from None
    except (ValueError, UnicodeDecodeError):
        raise VeronicaError("the request body is not valid JSON", field="json") from None
    if not isinstance(data, dict):
        raise VeronicaError("the request body must be a JSON object", field="json")
    _check_tree(data)
    return data


def _check_params(request: HttpRequest, kwargs: dict) -> None:
    """Query parameters and URL parts reach database lookups: refuse what no column can hold."""
    pairs = [(name, value) for name, values in request.GET.lists() for value in values] + list(kwargs.items())
    for name, value in pairs:
        if text_problem(name):
            raise VeronicaError(f"a query parameter's name {text_problem(name)}", field="query")
        if isinstance(value, str) and text_problem(value):
            raise VeronicaError(f"{name} {text_problem(value)}", field=name)


def text_field(data: dict, name: str, *, required: bool = True, default: str = "") -> str:
    """A string field's raw value; type and presence only (the verbs check length and content)."""
    if name not in data or data[name] is None:
        if required:
            raise VeronicaError(f"{name} is required", field=name)
        return default
    value = data[name]
    if not isinstance(value, str):
        raise VeronicaError(f"{name} must be a string", field=name)
    return value


def endpoint(*methods: str) -> Callable:
    """Wrap a view that returns a dict (200), a (dict, status) pair or an HttpResponse."""
    allowed = set(methods) | ({"HEAD"} if "GET" in methods else set())

    def decorator(view: Callable[..., Any]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in allowed:
                response = error(405, f"{request.method} is not allowed here; use {', '.join(sorted(methods))}")
                response["Allow"] = ", ".join(sorted(allowed))
                return response
            try:
                authenticate(request)
                if request.method not in SAFE_METHODS and request.token_read_only:
                    return error(403, f"this token is read-only: it may only read (GET), not {request.method}; "
                                      "use a read-write token for changes")
                if request.method not in SAFE_METHODS and not request.auth_by_token:
                    reason = _csrf_failure_reason(request)
                    if reason:
                        return error(403, reason)
                _check_params(request, kwargs)
                result = view(request, *args, **kwargs)
            except Unauthorized as exc:
                return error(401, str(exc))
            except VeronicaError as exc:
                return JsonResponse(exc.as_dict(), status=exc.status)
            except Http404:
                return error(404, "not found")
            except PermissionDenied as exc:
                return error(403, str(exc) or "your role does not allow this")
            if isinstance(result, HttpResponse):
                return result
            body, status = result if isinstance(result, tuple) else (result, 200)
            return JsonResponse(body, status=status, safe=isinstance(body, dict))

        return wrapped

    return decorator


# who is asking, and for which space (moved here from api.views so api.steer need not import it)
WRITE_NEED = {"GET": VIEWER, "HEAD": VIEWER}


def _space(request: HttpRequest, slug: str, need: str | None = None):
    """The space for this request; reads need viewer, writes operator unless `need` says otherwise."""
    return access.space_for(request.user, slug, need or WRITE_NEED.get(request.method, OPERATOR))


def _actor(request: HttpRequest) -> str:
    return access.actor_name(request.user)
