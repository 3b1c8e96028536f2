"""Who an event-stream socket speaks for, and whether that still holds while it stays open.

A socket opens with one of two credentials, never both:

* `Authorization: Bearer <token>` (scripts). The header alone decides: a bad token is 4401, never
  a fall-back to a cookie the same client also sent (as in the JSON API). No browser can put this
  header on a WebSocket, so nothing can be forged cross-site and no Origin is asked for.
* the session cookie (the console). A browser sends the cookie on a WebSocket opened from any
  site, so the Origin must name one of ALLOWED_HOSTS: the socket's CSRF check. No Origin, no socket.

Credentials end while a socket is open: a token is revoked or expires, the user logs out (the
session is flushed) or changes their password (the session's auth hash, or the token's password
stamp, no longer matches), a user is disabled, access is revoked (a grant, or the staff
permission that showed every space). `recheck()` tells, for all the sockets of a space in this
process at once, which of them must close: CLOSE_CREDENTIALS_GONE (4401) or CLOSE_ACCESS_GONE
(4404, as at connect: a space one may not see does not exist). At most three queries, whatever
the number of sockets: users with their access, live tokens, live sessions.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

from channels.security.websocket import AllowedHostsOriginValidator
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore as DbSessionStore
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from veronica.swarm import access
from veronica.models import ApiToken, Space, SpaceAccess

CLOSE_CREDENTIALS_GONE, CLOSE_ACCESS_GONE = 4401, 4404
PASSWORD_BACKEND = "veronica.web.sso.LocalPasswordBackend"


@dataclass(frozen=True)
class Credential:
    """What a socket was opened with: a token id, or a session key (exactly one of them)."""

    user_id: int
    token_id: int | None = None
    session_key: str | None = None


def authorization(scope: dict) -> str | None:
    """The raw Authorization header of a socket's handshake, or None when there is none."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            return value.decode("latin1")
    return None


def token_user(header: str):
    """(user, Credential) for an `Authorization: Bearer <key>` header, or None (the socket gets 4401)."""
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = access.token_for_key(key.strip())
    if token is None:
        return None
    return token.user, Credential(user_id=token.user.pk, token_id=token.pk)


def session_user(scope: dict):
    """(user, Credential) for the session the cookie named, or None when it is not a logged-in one."""
    user, session = scope.get("user"), scope.get("session")
    if user is None or not user.is_authenticated or not user.is_active or session is None or not session.session_key:
        return None
    return user, Credential(user_id=user.pk, session_key=session.session_key)


class OriginCheckedUnlessBearer:
    """The handshake's CSRF check: cookie sockets need an allowed Origin; bearer sockets do not
    (the header is not something a browser attaches by itself). Any Authorization header takes
    the token path in the consumer, so skipping the check never lets a cookie through."""

    def __init__(self, app) -> None:
        self.app = app
        self.origin_checked = AllowedHostsOriginValidator(app)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and authorization(scope) is not None:
            return await self.app(scope, receive, send)
        return await self.origin_checked(scope, receive, send)


# --- the re-check ----------------------------------------------------------------------------------

def recheck(space_id: int, credentials: list[Credential]) -> dict[Credential, int]:
    """The credentials that no longer hold, each with the close code its socket gets."""
    if not credentials:
        return {}
    users = _users(space_id, {c.user_id for c in credentials})
    live_tokens = _live_tokens({c.token_id for c in credentials if c.token_id is not None})
    sessions = _session_data({c.session_key for c in credentials if c.session_key})
    hashes: dict[int, list[str]] = {}  # per user, not per socket: many tabs share one session
    verdicts: dict[Credential, int] = {}
    for cred in credentials:
        user = users.get(cred.user_id)
        if user is None or not user.is_active:
            verdicts[cred] = CLOSE_CREDENTIALS_GONE
        elif cred.token_id is not None and not _token_holds(live_tokens.get(cred.token_id), user):
            verdicts[cred] = CLOSE_CREDENTIALS_GONE
        elif cred.session_key is not None and not _session_holds(sessions.get(cred.session_key), user, hashes):
            verdicts[cred] = CLOSE_CREDENTIALS_GONE
        elif not (user.space_exists and (user.has_access or _staff_sees(user))):
            verdicts[cred] = CLOSE_ACCESS_GONE
    return verdicts


def _users(space_id: int, user_ids: set[int]) -> dict[int, object]:
    has_access = SpaceAccess.objects.filter(user=OuterRef("pk"), space_id=space_id)
    rows = (get_user_model().objects.filter(pk__in=user_ids).only("pk", "password", "is_active", "is_staff", "is_superuser")
            .annotate(has_access=Exists(has_access), space_exists=Exists(Space.objects.filter(pk=space_id)),
                      space_permission=Exists(access.space_permission_query(OuterRef("pk")))))
    return {u.pk: u for u in rows}


def _staff_sees(user) -> bool:
    """access.staff_role(user) is not None, from the annotated row (no query per user)."""
    return user.is_superuser or (user.is_staff and user.space_permission)


def _live_tokens(token_ids: set[int]) -> dict[int, ApiToken]:
    if not token_ids:
        return {}
    rows = ApiToken.objects.filter(pk__in=token_ids, revoked_at__isnull=True).only("pk", "user_id", "revoked_at", "expires_at",
                                                                                 "password_stamp")
    return {t.pk: t for t in rows}


def _token_holds(token: ApiToken | None, user) -> bool:
    """Not revoked, same user, not expired, the password unchanged (access.token_holds)."""
    return token is not None and token.user_id == user.pk and access.token_holds(token, user)


def _session_data(keys: set[str]) -> dict[str, dict]:
    """Each live session's data. The database session engines in one query; any other engine
    (cache, files) one load per session."""
    if not keys:
        return {}
    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    if issubclass(store_class, DbSessionStore):
        rows = store_class.get_model_class().objects.filter(session_key__in=keys, expire_date__gt=timezone.now())
        decoder = store_class()
        return {row.session_key: decoder.decode(row.session_data) for row in rows}
    found = {}
    for key in keys:
        store = store_class(key)
        data = store.load()
        if store.session_key == key and data:  # load() of a missing session starts a new, empty one
            found[key] = data
    return found


def _session_holds(data: dict | None, user, hashes: dict[int, list[str]]) -> bool:
    """The session still logs this user in: not flushed, same user, auth hash still valid (a
    password change elsewhere invalidates it, as Django does on every request)."""
    if not data or str(data.get(SESSION_KEY)) != str(user.pk):
        return False
    if data.get(BACKEND_SESSION_KEY) not in settings.AUTHENTICATION_BACKENDS or (
            data.get(BACKEND_SESSION_KEY) == PASSWORD_BACKEND and not settings.LOCAL_PASSWORDS):
        return False  # as Django's get_user: a password session ends when passwords are switched off
    if user.pk not in hashes:
        hashes[user.pk] = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    stored = data.get(HASH_SESSION_KEY) or ""
    return any(constant_time_compare(stored, h) for h in hashes[user.pk])
