"""Who may see and steer which space, and per-user API tokens.

Roles rank viewer < operator < owner (SpaceAccess.allows). Staff have what their Django
permissions grant everywhere (superuser: owner; change_space: operator; view_space: viewer).
A space a user cannot see does not exist for them: every page, API call and socket answers 404,
never 403. 403 is only for a user who can see the space but whose role is too low for the move.
"""
from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.http import Http404
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from veronica.swarm import audit, events
from veronica.plumbing.errors import Conflict, NotFound, VeronicaError, column_limit, require_text
from veronica.models import ROLE_RANK, AccessRole, ApiToken, Space, SpaceAccess

VIEWER, OPERATOR, OWNER = AccessRole.VIEWER.value, AccessRole.OPERATOR.value, AccessRole.OWNER.value
TOKEN_PREFIX = "vrn_"
TOKEN_NAME_MAX = column_limit(ApiToken, "name")
# last_used_at is a hint for the tokens page, not an audit log: write it at most once a minute so a
# busy script does not take the SQLite write lock on every call.
TOKEN_TOUCH_EVERY = timedelta(minutes=1)


# --- reading access --------------------------------------------------------------------------------
# Staff status alone grants nothing in a space: it only opens the admin. What staff may do in every
# space comes from their Django permissions, as in the admin: a superuser owns every space,
# `veronica.change_space` operates every space, `veronica.view_space` views every space. A grant in
# the space itself (SpaceAccess) counts too; the higher of the two wins.

STAFF_PERMISSION_ROLES = (("veronica.change_space", OPERATOR), ("veronica.view_space", VIEWER))
SPACE_PERMISSION_CODENAMES = ("change_space", "view_space")


def _active(user) -> bool:
    return user is not None and user.is_authenticated and user.is_active


def staff_role(user) -> str | None:
    """The role the user's Django permissions give in every space, or None (most users)."""
    if not _active(user):
        return None
    if user.is_superuser:
        return OWNER
    if not user.is_staff:
        return None
    return next((role for perm, role in STAFF_PERMISSION_ROLES if user.has_perm(perm)), None)


def higher(a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return a or b
    return a if ROLE_RANK[a] >= ROLE_RANK[b] else b


def role_in(user, space: Space) -> str | None:
    """The user's effective role in the space, or None when the space is invisible to them."""
    if not _active(user):
        return None
    granted = SpaceAccess.objects.filter(user=user, space=space).values_list("role", flat=True).first()
    return higher(granted, staff_role(user))


def allows(role: str | None, need: str) -> bool:
    return role is not None and ROLE_RANK[role] >= ROLE_RANK[need]


def visible_spaces(user) -> QuerySet[Space]:
    if not _active(user):
        return Space.objects.none()
    if staff_role(user) is not None:
        return Space.objects.all()
    return Space.objects.filter(access__user=user)


def roles_by_space(user) -> dict[int, str]:
    granted = dict(SpaceAccess.objects.filter(user=user).values_list("space_id", "role"))
    everywhere = staff_role(user)
    if everywhere is None:
        return granted
    return {pk: higher(granted.get(pk), everywhere) for pk in Space.objects.values_list("pk", flat=True)}


def space_permission_query(user_ref) -> QuerySet:
    """Permissions (the user's own or a group's) that let staff see every space: for an Exists()
    annotation, so a check over many users stays one query (the socket re-check)."""
    return Permission.objects.filter(content_type__app_label="veronica", codename__in=SPACE_PERMISSION_CODENAMES).filter(
        Q(user=user_ref) | Q(group__user=user_ref))


def space_for(user, slug: str, need: str = VIEWER) -> tuple[Space, str]:
    """The space and the user's role; Http404 if they cannot see it, PermissionDenied if too low."""
    space = None
    if _active(user):  # the space and the user's grant in one statement (every page of a space starts here)
        granted = SpaceAccess.objects.filter(user=user, space=OuterRef("pk")).values("role")[:1]  # unique per (user, space)
        space = Space.objects.filter(slug=slug).annotate(granted_role=Subquery(granted)).first()
    role = higher(space.granted_role, staff_role(user)) if space is not None else None  # as role_in reads it
    if role is None:
        raise Http404("no such space")
    if not allows(role, need):
        raise PermissionDenied(f"this needs the {need} role in space {slug}; you are {role}")
    return space, role


def space_id_for(user, slug: str) -> int | None:
    """For the socket: the space id if the user may watch it, else None (the socket answers 4404)."""
    space = Space.objects.filter(slug=slug).first()
    return space.pk if space is not None and role_in(user, space) is not None else None


# --- granting access (owners) --------------------------------------------------------------------

@audit.verb("access.grant", after=lambda a, row: {"user": a["username"], "role": a["role"]})
def grant(space: Space, username: str, role: str, *, actor: str) -> SpaceAccess:
    """Give a user a role in the space, or change the role they have."""
    username = require_text(username, "username", max_len=150)
    if role not in AccessRole.values:
        raise VeronicaError(f"role must be one of {', '.join(AccessRole.values)}", field="role")
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"no user named '{username}'", field="username")
    with transaction.atomic():
        access, created = SpaceAccess.objects.update_or_create(user=user, space=space, defaults={"role": role})
        events.emit(space.pk, "access.granted", user=username, role=role, actor=actor, created=created)
    return access


@audit.verb("access.revoke", after=lambda a, _: {"user": a["username"]})
def revoke(space: Space, username: str, *, actor: str) -> None:
    """Take a user's access away. The last owner cannot be removed (a superuser can always re-grant)."""
    username = require_text(username, "username", max_len=150)
    with transaction.atomic():
        access = SpaceAccess.objects.select_for_update().filter(space=space, user__username=username).first()
        if access is None:
            raise NotFound(f"'{username}' has no access to this space", field="username")
        if access.role == OWNER and not SpaceAccess.objects.filter(space=space, role=OWNER).exclude(pk=access.pk).exists():
            raise Conflict(f"'{username}' is the last owner of this space; make someone else owner first", field="username")
        access.delete()
        events.emit(space.pk, "access.revoked", user=username, actor=actor)


def access_list(space: Space) -> list[dict]:
    rows = SpaceAccess.objects.filter(space=space).select_related("user").order_by("user__username")
    return [{"username": a.user.username, "role": a.role} for a in rows]


# --- API tokens --------------------------------------------------------------------------------------

def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


TOKEN_MAX_DAYS = 3650


def password_stamp(user) -> str:
    """A digest of the user's password hash: it changes when the password does, which ends tokens."""
    return hashlib.sha256(user.password.encode()).hexdigest()


def _expiry_days(raw: object) -> int | None:
    """expires_in_days as the API (an integer) or the console form (digits) sends it; empty = never."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, str) and raw.strip().isdigit() and len(raw.strip()) <= 5:  # int() of 5,000 digits raises
        raw = int(raw.strip())
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= TOKEN_MAX_DAYS:
        raise VeronicaError(f"expires_in_days must be a whole number of days from 1 to {TOKEN_MAX_DAYS}, or empty for "
                            "a token that does not expire", field="expires_in_days")
    return raw


def _token_row(args: dict, result: tuple) -> dict:
    """A token as the audit trail shows it: never its key or hash."""
    token = result[0]
    return {"id": token.pk, "name": token.name, "prefix": token.prefix, "read_only": token.read_only,
            "expires_at": token.expires_at, "revoked_at": token.revoked_at}


@audit.verb("token.create", space=lambda a, r: None, target=lambda a, r: r[0].name, after=_token_row)
def create_token(user, name: str, *, expires_in_days: object = None, read_only: object = False) -> tuple[ApiToken, str]:
    """A new token for the user. The key is returned once; only its SHA-256 is stored."""
    name = require_text(name, "name", max_len=TOKEN_NAME_MAX)
    days = _expiry_days(expires_in_days)
    if not isinstance(read_only, bool):
        raise VeronicaError("read_only must be true or false", field="read_only")
    key = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name, key_hash=hash_key(key), prefix=key[:8], read_only=read_only, password_stamp=password_stamp(user),
        expires_at=timezone.now() + timedelta(days=days) if days else None)
    return token, key


def token_holds(token: ApiToken, user, now=None) -> bool:
    """The token still speaks for the user: not revoked or expired, the user active, and the
    password the same as when the token was made."""
    now = now or timezone.now()
    return (token.revoked_at is None and user.is_active and (token.expires_at is None or token.expires_at > now)
            and constant_time_compare(token.password_stamp, password_stamp(user)))


@audit.verb("token.revoke", space=lambda a, r: None, target=lambda a, r: r.name, after=lambda a, r: _token_row(a, (r,)))
def revoke_token(user, token_id: int) -> ApiToken:
    token = ApiToken.objects.filter(user=user, pk=token_id).first()
    if token is None:
        raise NotFound(f"you have no token #{token_id}", field="token_id")
    if token.revoked_at is None:
        ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        token.refresh_from_db()
    return token


def token_for_key(key: str) -> ApiToken | None:
    """The live token a bearer key names (its user loaded), or None for an unknown, revoked or
    expired one, a disabled user's or one made before the password changed. Sockets keep the
    token's id to re-check it while they stay open."""
    if not key or not key.startswith(TOKEN_PREFIX) or len(key) > 200:
        return None
    token = ApiToken.objects.filter(key_hash=hash_key(key), revoked_at__isnull=True).select_related("user").first()
    now = timezone.now()
    if token is None or not token_holds(token, token.user, now):
        return None
    if token.last_used_at is None or now - token.last_used_at > TOKEN_TOUCH_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def tokens_of(user) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).order_by("-created_at")


def actor_name(user) -> str:
    """How a person shows up in events and the audit trail."""
    return f"user:{user.get_username()}"
