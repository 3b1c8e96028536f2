"""Single sign-on against a real OpenID Connect provider (node-oidc-provider, tests/oidc/provider.mjs)
started by the test: the authorization-code flow with PKCE, people created or matched, IdP groups
mapped to staff and to a space role, a tampered token, an expired one, a person removed at the IdP,
local passwords switched off, and logout."""
from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import SESSION_KEY, get_user_model
from django.test import Client

from tests.conftest import make_space
from tests.oidc.idp import CLIENT_ID, CLIENT_SECRET, Browser, Idp
from veronica.models import SpaceAccess, SsoIdentity

User = get_user_model()


@pytest.fixture(scope="module")
def idp():
    provider = Idp()
    yield provider
    provider.stop()


@pytest.fixture
def sso(idp, settings, db):
    idp.reset()
    settings.OIDC_ISSUER, settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = idp.issuer, CLIENT_ID, CLIENT_SECRET
    settings.OIDC_RP_SCOPES = "openid email profile groups"
    return idp


def browser(idp) -> Browser:
    return Browser(Client(), idp)


def logged_in_user(b: Browser):
    user_id = b.app.session.get(SESSION_KEY)
    return User.objects.filter(pk=user_id).first() if user_id else None


def test_the_code_flow_uses_pkce_and_creates_the_person_then_knows_them_again(sso):
    sso.add("alice", email="alice@example.org")
    b = browser(sso)
    start = b.app.get("/oidc/authenticate/")
    query = parse_qs(urlsplit(start.headers["location"]).query)
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) == 43
    landed = b.follow(start, login=("alice", "pw"))
    assert landed.status_code == 302 and landed.headers["location"] == "/"
    alice = logged_in_user(b)
    assert alice.username == "alice" and alice.email == "alice@example.org" and not alice.has_usable_password()
    assert SsoIdentity.objects.get(user=alice).issuer == sso.issuer
    assert b.app.get("/").status_code == 200

    again = browser(sso)
    again.log_in("alice")
    assert logged_in_user(again) == alice and User.objects.filter(username__startswith="alice").count() == 1


def test_an_existing_user_is_matched_by_verified_email(sso):
    bob = User.objects.create_user("robert", email="Bob@Example.org", password="local-pw-123")
    sso.add("bob", email="bob@example.org")
    b = browser(sso)
    b.log_in("bob")
    assert logged_in_user(b) == bob
    assert SsoIdentity.objects.get(subject="bob").user == bob


def test_idp_groups_map_to_staff_and_a_space_role_and_leaving_the_group_takes_them_away(sso, settings, tmp_path):
    space = make_space(tmp_path, "alpha")
    settings.OIDC_STAFF_GROUP = "veronica-admins"
    settings.OIDC_SPACE_ROLES = [("alpha-ops", "alpha", "operator")]
    sso.add("carol", groups=["veronica-admins", "alpha-ops"])
    b = browser(sso)
    b.log_in("carol")
    carol = logged_in_user(b)
    assert carol.is_staff
    assert SpaceAccess.objects.get(user=carol, space=space).role == "operator"

    sso.add("carol", groups=[])  # moved out of both groups at the IdP
    b2 = browser(sso)
    b2.log_in("carol")
    carol.refresh_from_db()
    assert not carol.is_staff and not SpaceAccess.objects.filter(user=carol, space=space).exists()


def test_a_tampered_id_token_is_refused(sso):
    sso.add("mallory")
    sso.tamper(True)
    b = browser(sso)
    landed = b.log_in("mallory")
    assert landed.headers["location"] == "/login/?sso=failed"
    assert logged_in_user(b) is None and not User.objects.filter(username="mallory").exists()
    assert "single sign-on did not log you in" in b.app.get("/login/?sso=failed").content.decode().lower()


def test_an_expired_id_token_is_refused(sso):
    sso.add("dave")
    sso.clock(-3600)  # the provider's clock an hour behind: its five-minute tokens are long expired here
    b = browser(sso)
    assert b.log_in("dave").headers["location"] == "/login/?sso=failed"
    assert logged_in_user(b) is None


def test_a_person_removed_at_the_idp_is_logged_out_at_the_next_refresh_and_cannot_log_in_again(sso):
    sso.add("erin")
    b = browser(sso)
    b.log_in("erin")
    assert logged_in_user(b) is not None
    sso.remove("erin")
    session = b.app.session
    session["oidc_id_token_expiration"] = 0  # the ID token's time is up (a frozen clock, not a wait)
    session.save()
    page = b.app.get("/")
    assert page.status_code == 302 and page.headers["location"].startswith(sso.issuer)
    assert "prompt=none" in page.headers["location"]
    b.follow(page)  # the IdP answers login_required; the callback logs the session out
    assert logged_in_user(b) is None
    assert b.app.get("/").headers["location"].startswith("/login/")

    again = browser(sso)
    again.log_in("erin")  # the IdP's own login form refuses
    assert logged_in_user(again) is None


def test_local_passwords_off_refuses_every_password_and_ends_password_sessions(sso, settings):
    User.objects.create_user("frank", password="a-local-password")
    before = Client()
    assert before.post("/login/", {"username": "frank", "password": "a-local-password"}).status_code == 302
    settings.LOCAL_PASSWORDS = False
    assert before.get("/").headers["location"].startswith("/login/")  # the password session is over
    page = Client().post("/login/", {"username": "frank", "password": "a-local-password"})
    assert page.status_code == 200 and "Passwords are switched off" in page.content.decode()
    assert 'name="password"' not in Client().get("/login/").content.decode()
    admin = Client().post("/admin/login/", {"username": "frank", "password": "a-local-password"})
    assert admin.status_code == 200 and "Passwords are switched off" in admin.content.decode()
    sso.add("frank", email="frank@example.org")
    b = browser(sso)
    b.log_in("frank")
    assert logged_in_user(b) is not None  # SSO still logs in


def test_logout_ends_the_session_here_and_at_the_idp(sso):
    sso.add("gina")
    b = browser(sso)
    b.log_in("gina")
    out = b.app.post("/logout/")
    assert out.status_code == 302 and out.headers["location"].startswith(f"{sso.issuer}/session/end")
    assert "id_token_hint=" in out.headers["location"]
    assert logged_in_user(b) is None


def test_sso_off_answers_404_and_the_login_page_has_no_button(db, settings):
    settings.OIDC_ISSUER = ""
    assert Client().get("/oidc/authenticate/").status_code == 404
    assert "sso-login" not in Client().get("/login/").content.decode()
