"""A hostile person against single sign-on, with the real provider of tests/oidc/test_sso.py: a login
by an address the provider has not verified, a second person given an address the provider recycled,
a link that logs people out, and the next= of the login button."""
from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from django.contrib.auth import get_user_model
from django.test import Client

from tests.oidc.test_sso import browser, idp, logged_in_user, sso  # noqa: F401 (fixtures)
from veronica.models import SsoIdentity

User = get_user_model()


def test_an_unverified_email_never_logs_in_as_the_local_account_with_that_address(sso):
    admin = User.objects.create_user("root-admin", email="admin@example.org", is_staff=True, is_superuser=True)
    sso.add("mallory", email="admin@example.org", verified=False)
    b = browser(sso)
    b.log_in("mallory")
    mallory = logged_in_user(b)
    assert mallory != admin and mallory.username == "mallory" and not SsoIdentity.objects.filter(user=admin).exists()
    # nor does the new account keep that address: with it, the real owner's verified address matched
    # two accounts and their own first SSO login was refused ("multiple users")
    assert mallory.email == ""
    sso.add("the-admin", email="admin@example.org")
    real = browser(sso)
    real.log_in("the-admin")
    assert logged_in_user(real) == admin


def test_a_recycled_address_does_not_hand_over_the_person_it_was_linked_to(sso):
    """A leaver's account is linked to their subject; the provider gives their (verified) address to
    a new subject. Matching by e-mail linked the newcomer to the leaver's account, roles and all."""
    sso.add("leaver", email="pat@example.org")
    first = browser(sso)
    first.log_in("leaver")
    leaver = logged_in_user(first)
    sso.remove("leaver")
    sso.add("newcomer", email="pat@example.org")
    second = browser(sso)
    second.log_in("newcomer")
    newcomer = logged_in_user(second)
    assert newcomer is not None and newcomer != leaver
    assert list(SsoIdentity.objects.filter(user=leaver).values_list("subject", flat=True)) == ["leaver"]


def test_a_link_to_the_callback_with_an_error_logs_nobody_out(sso):
    """mozilla-django-oidc logs the session out on any /oidc/callback/?error=...: a link (or a
    redirect) an attacker sends logged the person out. Only an answer to this session's own request does."""
    sso.add("victim")
    b = browser(sso)
    b.log_in("victim")
    victim = logged_in_user(b)
    forged = b.app.get("/oidc/callback/?error=login_required&state=not-yours")
    assert forged.status_code == 302 and logged_in_user(b) == victim


def test_next_after_sso_stays_on_this_site(sso):
    sso.add("nina")
    for target, landing in (("https://evil.example/steal", "/"), ("//evil.example/", "/"), ("/spaces/", "/spaces/")):
        b = browser(sso)
        start = b.app.get(f"/oidc/authenticate/?next={target}")
        assert parse_qs(urlsplit(start.headers["location"]).query)["redirect_uri"] == ["http://testserver/oidc/callback/"]
        landed = b.follow(start, login=("nina", "pw"))
        assert landed.headers["location"] == landing, target


def test_the_session_key_changes_at_sso_login(sso):
    sso.add("fixed")
    b = browser(sso)
    start = b.app.get("/oidc/authenticate/")  # a session exists now (its state): the key an attacker could plant
    planted = b.app.cookies["sessionid"].value
    b.follow(start, login=("fixed", "pw"))
    assert logged_in_user(b) is not None and b.app.cookies["sessionid"].value != planted


def test_a_role_the_providers_groups_grant_is_an_audit_row(sso, settings, tmp_path):
    """The group mapping's grants ran while nobody was logged in yet, so the audit trail had no row
    for them: an owner made at the IdP appeared in the space with no trace in its audit."""
    from tests.conftest import make_space
    from veronica.models import AuditRow

    make_space(tmp_path, "alpha")
    settings.OIDC_SPACE_ROLES = [("alpha-owners", "alpha", "owner")]
    settings.OIDC_STAFF_GROUP = "admins"
    sso.add("ivan", groups=["alpha-owners", "admins"])
    browser(sso).log_in("ivan")
    row = AuditRow.objects.get(action="access.grant", space_slug="alpha")
    assert row.actor == f"sso:{sso.issuer}" and row.after == {"user": "ivan", "role": "owner"}
    staff = AuditRow.objects.get(action="sso.staff")
    assert staff.target == "ivan" and staff.after == {"is_staff": True} and staff.actor == f"sso:{sso.issuer}"
