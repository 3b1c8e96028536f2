"""Single sign-on with the organisation's OpenID Connect provider, through mozilla-django-oidc.

Why mozilla-django-oidc and not django-allauth: it does one thing (an OIDC relying party, the
authorization-code flow with PKCE, a session-refresh middleware that re-asks the IdP with
prompt=none) and adds no models, templates or account flows of its own; allauth brings a whole
account system (e-mail addresses, sign-up, social apps in the database) we would then have to
switch off piece by piece. What the library leaves open is filled here:

* the provider's endpoints come from its discovery document (VERONICA_OIDC_ISSUER), fetched on
  first use and kept per process, so a deployment configures an issuer, a client id and a secret;
* ID tokens are checked for audience and issuer too (the library checks the signature, expiry and
  nonce only), and any bad token (tampered, expired, another client's) is a failed login, not a 500;
* people are matched by (issuer, subject) once linked; on first login by verified e-mail (or by
  username, VERONICA_OIDC_MATCH) or created; an IdP group claim can make them staff and give them
  a role in a space (veronica.swarm.access.grant, the same verb the console uses);
* VERONICA_LOCAL_PASSWORDS=0 switches password logins off (the console and the admin), and ends
  sessions that were opened with a password;
* logout ends the session at the IdP as well when it began there, and closes the person's open
  event sockets at once (veronica.web.consumers re-checks on a ring with seq 0).
"""
from __future__ import annotations

import logging
import threading

import jwt
import requests
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.signals import user_logged_out
from django.contrib.auth.views import LogoutView
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.db import transaction
from django.dispatch import receiver
from django.http import Http404, HttpResponseRedirect
from django.utils.deprecation import MiddlewareMixin
from mozilla_django_oidc import auth as oidc_auth
from mozilla_django_oidc import middleware as oidc_middleware
from mozilla_django_oidc import views as oidc_views
from mozilla_django_oidc.utils import import_from_settings

from veronica.swarm import access, audit
from veronica.plumbing.errors import VeronicaError
from veronica.models import SsoIdentity

log = logging.getLogger(__name__)

# the settings mozilla-django-oidc reads that we take from the provider's discovery document
_DISCOVERED = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
_discovery: dict[str, dict] = {}
_discovery_lock = threading.Lock()
BACKEND_PATH = "veronica.web.sso.OidcBackend"


def enabled() -> bool:
    return bool(settings.OIDC_ISSUER and settings.OIDC_RP_CLIENT_ID)


def discovery() -> dict:
    """The issuer's /.well-known/openid-configuration, fetched once per process."""
    issuer = settings.OIDC_ISSUER.rstrip("/")
    with _discovery_lock:
        if issuer not in _discovery:
            response = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=settings.OIDC_TIMEOUT)
            response.raise_for_status()
            document = response.json()
            if document.get("issuer", "").rstrip("/") != issuer:
                raise ImproperlyConfigured(f"VERONICA_OIDC_ISSUER {issuer} names a provider whose issuer is {document.get('issuer')!r}")
            _discovery[issuer] = document
        return _discovery[issuer]


def setting(attr: str, *default):
    """What mozilla-django-oidc asks for: an endpoint from discovery, anything else from settings."""
    if attr in _DISCOVERED and enabled():
        return discovery()[_DISCOVERED[attr]]
    return import_from_settings(attr, *default)


def _require_enabled() -> None:
    if not enabled():
        raise Http404("single sign-on is not configured")


# --- the backend: tokens, matching, claims ------------------------------------------------------------

class OidcBackend(oidc_auth.OIDCAuthenticationBackend):
    get_settings = staticmethod(setting)

    def __init__(self, *args, **kwargs):  # the library reads endpoints here; off, it has none to read
        if enabled():
            super().__init__(*args, **kwargs)

    def authenticate(self, request, **kwargs):
        if not enabled() or request is None or not request.GET.get("code"):
            return None
        try:
            return super().authenticate(request, **kwargs)
        except (SuspiciousOperation, requests.RequestException, VeronicaError) as exc:
            # a tampered, expired or foreign token, an IdP that refused the code: a failed login
            log.warning("single sign-on refused: %s", exc)
            return None

    def _verify_jws(self, payload, key):
        """The library's check (alg, signature, exp) plus audience and issuer, every failure alike."""
        header = jwt.get_unverified_header(payload)
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            raise SuspiciousOperation(f"ID token alg {header.get('alg')!r} is not {self.OIDC_RP_SIGN_ALGO}")
        try:
            return jwt.decode(payload, key, algorithms=[self.OIDC_RP_SIGN_ALGO], audience=self.OIDC_RP_CLIENT_ID,
                              issuer=discovery()["issuer"], options={"require": ["exp", "iat", "sub"]})
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"ID token rejected: {exc}") from None

    def verify_claims(self, claims):
        return bool(claims.get("sub"))

    def filter_users_by_claims(self, claims):
        User = get_user_model()
        issuer = discovery()["issuer"]
        link = SsoIdentity.objects.filter(issuer=issuer, subject=claims["sub"]).select_related("user").first()
        if link is not None:
            return User.objects.filter(pk=link.user_id)
        # a first login matches only people no subject of this provider has claimed yet: an address
        # (or username) the provider gave a second person (a leaver's mail recycled for a new hire)
        # does not make them the first one
        unlinked = User.objects.exclude(sso_identities__issuer=issuer)
        match = settings.OIDC_MATCH
        if match == "email" and claims.get("email") and claims.get("email_verified") is True:
            return unlinked.filter(email__iexact=claims["email"])
        if match == "username" and claims.get(settings.OIDC_USERNAME_CLAIM):
            return unlinked.filter(username=claims[settings.OIDC_USERNAME_CLAIM])
        return User.objects.none()

    def create_user(self, claims):
        User = get_user_model()
        base = str(claims.get(settings.OIDC_USERNAME_CLAIM) or claims.get("email") or claims["sub"])[:140]
        username, n = base, 1
        while User.objects.filter(username=username).exists():
            n += 1
            username = f"{base}-{n}"
        # no password (unusable); an address the provider has not verified is not theirs to keep
        user = User.objects.create_user(username, email=(claims.get("email") or "") if claims.get("email_verified") is True else "")
        audit.record("sso.user_created", target=username, after={"issuer": discovery()["issuer"], "email": user.email},
                     actor=provider_actor())
        return self.update_user(user, claims)

    def update_user(self, user, claims):
        # the roles the provider's groups grant or take away are its changes: audit rows by it (at a
        # first login nobody is logged in yet, so the request's context would write none)
        with transaction.atomic(), audit.acting(provider_actor()):
            SsoIdentity.objects.update_or_create(issuer=discovery()["issuer"], subject=claims["sub"], defaults={"user": user})
            apply_groups(user, claims)
        return user


def provider_actor() -> audit.Actor:
    return audit.Actor(name=f"sso:{discovery()['issuer']}"[:160], via=audit.Via.SESSION)


def groups_of(claims: dict) -> set[str]:
    raw = claims.get(settings.OIDC_GROUPS_CLAIM) or []
    if isinstance(raw, str):
        raw = [raw]
    return {str(g) for g in raw if isinstance(g, (str, int))}


def apply_groups(user, claims: dict) -> None:
    """The IdP's groups, at every login: staff when in VERONICA_OIDC_STAFF_GROUP (and no longer when
    not), and each VERONICA_OIDC_SPACE_ROLES entry's role in its space while in its group (taken
    away when they leave the group, unless that would remove the space's last owner)."""
    from veronica.models import Space, SpaceAccess

    groups = groups_of(claims)
    if settings.OIDC_STAFF_GROUP:
        staff = settings.OIDC_STAFF_GROUP in groups
        if user.is_staff != staff:
            user.is_staff = staff
            user.save(update_fields=["is_staff"])
            audit.record("sso.staff", target=user.username, before={"is_staff": not staff}, after={"is_staff": staff})
    actor = "sso:" + discovery()["issuer"]
    for group, slug, role in settings.OIDC_SPACE_ROLES:
        space = Space.objects.filter(slug=slug).first()
        if space is None:
            log.warning("VERONICA_OIDC_SPACE_ROLES names a space %r that does not exist", slug)
            continue
        current = SpaceAccess.objects.filter(space=space, user=user).values_list("role", flat=True).first()
        if group in groups and current != role:
            access.grant(space, user.username, role, actor=actor)
        elif group not in groups and current == role:
            try:
                access.revoke(space, user.username, actor=actor)
            except VeronicaError as exc:  # the last owner stays; someone must hand the space over first
                log.warning("kept %s's %s role in %s: %s", user.username, role, slug, exc)


class LocalPasswordBackend(ModelBackend):
    """Passwords, unless VERONICA_LOCAL_PASSWORDS=0: then no password logs in, and a session that a
    password opened no longer finds its user (it ends at the next request or socket re-check)."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if not settings.LOCAL_PASSWORDS:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)

    def get_user(self, user_id):
        return super().get_user(user_id) if settings.LOCAL_PASSWORDS else None


# --- the doors: views and the refresh middleware --------------------------------------------------

class LoginStart(oidc_views.OIDCAuthenticationRequestView):
    get_settings = staticmethod(setting)

    def __init__(self, *args, **kwargs):
        super(oidc_views.OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request):
        _require_enabled()
        self.OIDC_OP_AUTH_ENDPOINT = setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
        self.OIDC_RP_CLIENT_ID = setting("OIDC_RP_CLIENT_ID")
        return super().get(request)


class Callback(oidc_views.OIDCAuthenticationCallbackView):
    get_settings = staticmethod(setting)

    def get(self, request):
        _require_enabled()
        if "error" in request.GET and request.GET.get("state") not in request.session.get("oidc_states", {}):
            # the library logs the session out on any ?error=: only an answer to this session's own
            # request (a refresh the IdP refused) may; a link to /oidc/callback/?error=x logs nobody out
            return self.login_failure()
        return super().get(request)


class SessionRefresh(oidc_middleware.SessionRefresh):
    """Re-asks the IdP (prompt=none) when the ID token's time is up: a person removed or disabled
    there is logged out here at their next page load. Nothing happens while SSO is off."""

    get_settings = staticmethod(setting)

    def __init__(self, get_response):
        MiddlewareMixin.__init__(self, get_response)  # the library's own reads endpoints: only once SSO is used

    def process_request(self, request):
        if not enabled() or request.session.get(BACKEND_SESSION_KEY) != BACKEND_PATH:
            return None
        for name, *default in (("OIDC_EXEMPT_URLS", []), ("OIDC_OP_AUTHORIZATION_ENDPOINT",), ("OIDC_RP_CLIENT_ID",),
                           ("OIDC_STATE_SIZE", 32), ("OIDC_RP_SCOPES", "openid email"), ("OIDC_USE_NONCE", True),
                           ("OIDC_NONCE_SIZE", 32)):
            setattr(self, name, setting(name, *default))
        self.OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
        return super().process_request(request)


def provider_logout_url(request) -> str | None:
    """The IdP's end-session URL for a session that began there (RP-initiated logout), else None."""
    if not enabled() or request.session.get(BACKEND_SESSION_KEY) != BACKEND_PATH:
        return None
    end = discovery().get("end_session_endpoint")
    if not end:
        return None
    from urllib.parse import urlencode

    params = {"client_id": settings.OIDC_RP_CLIENT_ID,
              "post_logout_redirect_uri": request.build_absolute_uri(settings.LOGOUT_REDIRECT_URL)}
    if request.session.get("oidc_id_token"):
        params["id_token_hint"] = request.session["oidc_id_token"]
    return f"{end}?{urlencode(params)}"


class Logout(LogoutView):
    """Django's logout (POST, the session flushed), then the IdP's own when the session began there."""

    def post(self, request, *args, **kwargs):
        at_idp = provider_logout_url(request)
        response = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(at_idp) if at_idp else response


@receiver(user_logged_out)
def close_sockets_on_logout(sender, request, user, **kwargs) -> None:
    """The session is gone: every space's feed re-checks its sockets now (a ring with seq 0) rather
    than at its next periodic re-check, so this person's sockets close within a poll.

    Django sends this signal *before* it flushes the session, so a ring sent from here could be heard,
    and the re-check run, while the session row still exists: the socket would stay open until the
    next periodic re-check. The ring therefore goes out once the session's own flush has run."""
    if user is None:
        return
    from veronica.swarm import events

    space_ids = list(access.roles_by_space(user))

    def ring_all() -> None:
        for space_id in space_ids:
            transaction.on_commit(lambda sid=space_id: events.ring(sid, events.RECHECK_RING))

    session = getattr(request, "session", None)
    flush = getattr(session, "flush", None)
    if flush is None:
        ring_all()
        return

    def flush_then_ring() -> None:
        flush()
        ring_all()

    session.flush = flush_then_ring
