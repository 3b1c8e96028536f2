"""The audit trail: one append-only row for every change a person or a token makes.

Who, how and where come from a context the door sets, never from the verb's arguments:
* the web (AuditMiddleware): the session's user, via "session", or "admin" under /admin/; the API
  wrapper marks a bearer call with its token (via "token", token id) when it authenticates it;
* management commands (`as_command`): the OS user, via "command", the host as "where".
Engine duties and agent runs set no context, so the verbs they call write no row: the trail is of
people, the event log is of everything.

A verb records itself with `@verb(...)` (before -> after of the object it changes) or calls
`record(...)`; an audited verb called by another one writes no row of its own (one change, one
row). Values under keys that name a secret (secret, token, key, password, env, ...) are masked.
Rows are never updated or deleted by the app (AuditRow refuses); `purge` is the retention duty's.
"""
from __future__ import annotations

import contextvars
import getpass
import inspect
import json
import re
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import wraps
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone

from veronica.models import AuditRow, Space


class Via:
    SESSION, TOKEN, ADMIN, COMMAND = "session", "token", "admin", "command"


@dataclass(frozen=True)
class Actor:
    name: str  # user:<name>, or os:<name> for a command
    via: str
    user_id: int | None = None
    token_id: int | None = None
    where: str = ""  # the client's address, or the host a command ran on


_context: contextvars.ContextVar[Any] = contextvars.ContextVar("veronica_audit_actor", default=None)
_inside_verb: contextvars.ContextVar[bool] = contextvars.ContextVar("veronica_audit_inside_verb", default=False)


# --- who: the context a door sets ---------------------------------------------------------------------

@contextmanager
def acting(actor: Any) -> Iterator[None]:
    """Changes made inside are `actor`'s: an Actor, a request (resolved when a row is written,
    so a token the API authenticates later counts), or None (an engine duty, an agent run)."""
    reset = _context.set(actor)
    try:
        yield
    finally:
        _context.reset(reset)


def as_engine(fn: Callable) -> Callable:
    """A wake or an engine duty is nobody's change, even when a request ran it inline (a
    synchronous queue in tests, the demo): the verbs it calls write no row."""
    @wraps(fn)
    def wrapped(*args, **kwargs):
        with acting(None):
            return fn(*args, **kwargs)
    return wrapped


def _admin_prefix() -> str:
    from django.urls import reverse

    try:
        return reverse("admin:index")
    except Exception:  # noqa: BLE001 - no admin mounted
        return "/admin/"


def from_request(request: Any) -> Actor | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    from veronica.plumbing.web_headers import client_ip

    token_id = getattr(request, "audit_token_id", None)
    via = Via.TOKEN if token_id else Via.ADMIN if request.path.startswith(_admin_prefix()) else Via.SESSION
    return Actor(name=f"user:{user.get_username()}", via=via, user_id=user.pk, token_id=token_id,
                 where=client_ip(request) or "")


def current() -> Actor | None:
    held = _context.get()
    return held if held is None or isinstance(held, Actor) else from_request(held)


def os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (a container's uid without a passwd entry)
        return "unknown"


def command_actor() -> Actor:
    return Actor(name=f"os:{os_user()}", via=Via.COMMAND, where=socket.gethostname())


def as_command(handle: Callable) -> Callable:
    """Decorate a management command's handle(): what it changes is the OS user's, via "command"."""
    @wraps(handle)
    def wrapped(self, *args, **kwargs):
        with acting(command_actor()):
            return handle(self, *args, **kwargs)
    return wrapped


class AuditMiddleware:
    """Every request runs inside its own audit context; the user is read when a row is written."""

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response

    def __call__(self, request):
        with acting(request):
            return self.get_response(request)


# --- what: masking and snapshots ----------------------------------------------------------------------

# "value": a secrets verb's set(name, value) must never write the value, whoever decorates it
SECRET_WORDS = {"secret", "secrets", "password", "passwd", "token", "key", "apikey", "credential", "credentials", "env",
                "authorization", "auth", "headers", "cookie", "hash", "stamp", "value"}
NOT_SECRET_ENDS = {"limit", "limits", "ceiling", "budget", "tokens", "id", "prefix", "name", "at", "days", "count"}
MASK = "•••"
MAX_TEXT = 2000  # a persona or a skill body is kept whole up to this; past it, its start and its length


def is_secret(key: object) -> bool:
    parts = [p for p in re.split(r"[^a-z0-9]+", str(key).lower()) if p]
    return bool(parts) and parts[-1] not in NOT_SECRET_ENDS and any(p in SECRET_WORDS for p in parts)


def _url_host(url: str) -> str:
    """Where a URL points, without what may carry a credential (user:password@, a path like a
    Slack hook's, the query)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/{MASK}" if parts.netloc else MASK


def _masked(key: object, value: Any) -> Any:
    if is_secret(key):
        return MASK if value not in (None, "", [], {}) else value
    if isinstance(value, str) and value and re.split(r"[^a-z0-9]+", str(key).lower())[-1] == "url":
        return _url_host(value)
    return mask(value)


def mask(value: Any) -> Any:
    """A JSON-safe copy with every secret-named key's value masked (an empty value stays empty:
    the row still shows that a secret was set or cleared), and URLs cut to their host."""
    if isinstance(value, dict):
        return {str(k): _masked(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask(v) for v in value]
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return f"{value[:MAX_TEXT]}… ({len(value)} characters)"
    return value


MASKERS: list[Callable[[Any], Any]] = []  # more masking (e.g. an SSO or secrets module's own), applied after ours


def add_masker(masker: Callable[[Any], Any]) -> None:
    if masker not in MASKERS:
        MASKERS.append(masker)


def masked(value: Any) -> Any:
    value = mask(value)
    for masker in MASKERS:
        value = masker(value)
    return value


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder, default=str))


IGNORED_FIELDS = {"event_seq", "updated_at"}  # counters and stamps every write moves


def snapshot(obj: models.Model | None) -> dict | None:
    """The stored row of a model instance (fresh from the database), as JSON."""
    if obj is None or obj.pk is None:
        return None
    row = type(obj)._base_manager.filter(pk=obj.pk).values().first()
    return None if row is None else jsonable({k: v for k, v in row.items() if k not in IGNORED_FIELDS})


def changes(before: dict | None, after: dict | None) -> tuple[dict | None, dict | None]:
    """Only what differs, when both sides are dicts."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return before, after
    keys = [k for k in {*before, *after} if before.get(k) != after.get(k)]
    return {k: before.get(k) for k in sorted(keys) if k in before}, {k: after.get(k) for k in sorted(keys) if k in after}


# --- writing a row -----------------------------------------------------------------------------------

def _space_of(space: Any) -> Space | None:
    if isinstance(space, Space) or space is None:
        return space
    return Space.objects.filter(pk=space).first()


def record(action: str, *, space: Space | int | None = None, target: str = "", before: Any = None, after: Any = None,
           actor: Actor | None = None) -> AuditRow | None:
    """One row for a change the current person (or `actor`) made; None when nobody is acting
    (an engine duty, an agent run). before/after are masked and made JSON-safe."""
    actor = actor or current()
    if actor is None:
        return None
    before, after = changes(masked(jsonable(before)), masked(jsonable(after)))
    space = _space_of(space)
    return AuditRow.objects.create(
        space=space, space_slug=space.slug if space else "", actor=actor.name[:160], user_id=actor.user_id, via=actor.via,
        token_id=actor.token_id, ip=actor.where[:45], action=action[:60], target=str(target)[:200], before=before, after=after)


# --- @verb: a verb that records itself ----------------------------------------------------------------

OBJECT_ARGS = ("member", "task", "base", "rule", "approval", "question", "space")
QUIET_ARGS = {"actor", "user", "self"}


def _label(obj: models.Model) -> str:
    name = getattr(obj, "name", None)
    if isinstance(name, str) and name:
        return name
    detail = getattr(obj, "title", "") or getattr(obj, "tool_name", "") or ""
    return f"{obj._meta.model_name} #{obj.pk} {detail}".strip()


def _target(bound: dict, result: Any) -> str:
    for name in ("member", "base", "task", "rule", "approval", "question"):
        if isinstance(bound.get(name), models.Model):
            return _label(bound[name])
    for name in ("name", "username", "tool_name", "slug", "to"):
        if isinstance(bound.get(name), str):
            return bound[name]
    return _label(result) if isinstance(result, models.Model) else ""


def _space(bound: dict, result: Any) -> Any:
    if isinstance(bound.get("space"), Space):
        return bound["space"]
    for name in OBJECT_ARGS:
        space_id = getattr(bound.get(name), "space_id", None)
        if space_id:
            return space_id
    if isinstance(result, Space):
        return result
    return getattr(result, "space_id", None)


def _arguments(bound: dict) -> dict:
    """The plain arguments (text, numbers, lists, dicts) of a call: what it was asked to do."""
    return {k: v for k, v in bound.items() if k not in QUIET_ARGS and k not in OBJECT_ARGS and not isinstance(v, models.Model)
            and isinstance(v, (str, int, float, bool, list, dict, type(None)))}


def verb(action: str, *, watch: str | None = None, created: bool = False, target: Callable[[dict, Any], str] | None = None,
         space: Callable[[dict, Any], Any] | None = None, after: Callable[[dict, Any], Any] | None = None,
         unless: Callable[[dict], bool] | None = None) -> Callable:
    """Make a verb write its audit row when a person calls it and it succeeds.

    watch: the argument holding the object it changes (its stored row before and after; only the
    changed fields are kept). created: the result is new (before is None, after its row). Otherwise
    after is the call's plain arguments, or `after(arguments, result)`. unless(arguments): no row
    for this call (a dry run changes nothing)."""
    def decorate(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @wraps(fn)
        def wrapped(*args, **kwargs):
            if current() is None or _inside_verb.get():
                return fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            given = bound.arguments
            if unless is not None and unless(given):
                return fn(*args, **kwargs)
            before = snapshot(given.get(watch)) if watch else None
            inside = _inside_verb.set(True)
            try:
                result = fn(*args, **kwargs)
            finally:
                _inside_verb.reset(inside)
            if watch:
                state = snapshot(given.get(watch)) or {}
                changed_after = state
            elif created:
                before, changed_after = None, snapshot(result) if isinstance(result, models.Model) else jsonable(result)
            else:
                changed_after = _arguments(given)
            if after is not None:
                changed_after = after(given, result)
            record(action, space=(space or _space)(given, result), target=(target or _target)(given, result),
                   before=before, after=changed_after)
            return result

        wrapped.audit_action = action
        return wrapped

    return decorate


# --- logins ---------------------------------------------------------------------------------------------

def _login_actor(request: Any, username: str, user_id: int | None) -> Actor:
    from veronica.plumbing.web_headers import client_ip

    path = getattr(request, "path", "") or ""
    via = Via.ADMIN if path.startswith(_admin_prefix()) else Via.SESSION
    return Actor(name=f"user:{username}"[:160], via=via, user_id=user_id, where=(client_ip(request) or "") if request else "")


def on_login(sender, request, user, **kwargs) -> None:
    record("login", target=user.get_username(), actor=_login_actor(request, user.get_username(), user.pk))


def on_login_failed(sender, credentials: dict, request=None, **kwargs) -> None:
    from django.contrib.auth import get_user_model

    field = get_user_model().USERNAME_FIELD
    username = str((credentials or {}).get(field) or (credentials or {}).get("username") or "")[:150]
    record("login.failed", target=username, actor=_login_actor(request, username, None))


def on_logout(sender, request, user, **kwargs) -> None:
    if user is not None:
        record("logout", target=user.get_username(), actor=_login_actor(request, user.get_username(), user.pk))


ADMIN_FLAGS = {1: "add", 2: "change", 3: "delete"}  # django.contrib.admin.models ADDITION, CHANGE, DELETION


def on_admin_log(sender, instance, created: bool, **kwargs) -> None:
    """The admin's own log of a change to what no verb of ours owns (users, groups, learning's
    global domains, the login throttle): one audit row each. Veronica's models change through the
    verbs, which write their own rows."""
    content_type = instance.content_type
    if not created or content_type is None or content_type.app_label == "veronica":
        return
    record(f"admin.{ADMIN_FLAGS.get(instance.action_flag, 'change')}.{content_type.app_label}.{content_type.model}",
           target=instance.object_repr, after={"change": instance.get_change_message()})


def connect_signals() -> None:
    from django.contrib.admin.models import LogEntry
    from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
    from django.db.models.signals import post_save

    user_logged_in.connect(on_login, dispatch_uid="veronica.swarm.audit.login")
    user_login_failed.connect(on_login_failed, dispatch_uid="veronica.swarm.audit.login_failed")
    user_logged_out.connect(on_logout, dispatch_uid="veronica.swarm.audit.logout")
    post_save.connect(on_admin_log, sender=LogEntry, dispatch_uid="veronica.swarm.audit.admin_log")


# --- reading and retention --------------------------------------------------------------------------------

def purge(now=None) -> int:
    """The retention duty: rows older than VERONICA_AUDIT_RETENTION_DAYS (0 keeps them all), but a
    space's rows never before its events (a space keeping events longer keeps its audit as long).
    The only deletion of audit rows; on PostgreSQL the table's trigger lets this one transaction delete."""
    days = settings.AUDIT_RETENTION_DAYS
    if days <= 0:
        return 0
    now = now or timezone.now()
    longer = dict(Space.objects.filter(retention_days__gt=days).values_list("pk", "retention_days"))
    due = Q(created_at__lt=now - timedelta(days=days)) & ~Q(space_id__in=list(longer))
    for space_id, space_days in longer.items():
        due |= Q(space_id=space_id, created_at__lt=now - timedelta(days=space_days))
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL veronica.audit_purge = 'on'")
        return AuditRow.objects.filter(due)._purge()
