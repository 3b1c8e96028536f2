"""Hosted hardening (issue 9 item 5): login throttling on both login pages, a CSP the console
passes (no inline script, handler or style attribute on any page), private caching of everything
that carries space data, Permissions-Policy."""
from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.conf import settings

from tests.console.conftest import PASSWORD
from tests.console.helpers import MEMBER_PANELS, SPACE_PANELS, open_question, pending_approval, read_targets
from veronica.swarm import bus, ledger

LOGIN_PAGES = ("/login/", "/admin/login/")


@pytest.fixture(autouse=True)
def fast_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # a login here is a test, not a secret


# --- no inline script anywhere: what CSP would block is caught here, page by page -------------------

class InlineFinder(HTMLParser):
    """Collects every construct a `script-src 'self'; style-src 'self'` policy blocks."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self.in_inline_script = False

    def handle_starttag(self, tag, attrs):
        names = dict(attrs)
        if tag == "script" and not names.get("src"):
            self.found.append(f"<script> without src: {self.getpos()}")
        if tag == "style":
            self.found.append(f"<style> element: {self.getpos()}")
        for name, value in attrs:
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}=...> handler")
            elif name == "style":
                self.found.append(f"<{tag} style={value!r}>")
            elif name in ("href", "src", "action", "formaction") and (value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}=javascript:...>")

    handle_startendtag = handle_starttag


def inline_code(html: str) -> list[str]:
    finder = InlineFinder()
    finder.feed(html)
    return finder.found


def console_pages(slug: str) -> list[str]:
    pages = [url for method, url in read_targets(slug) if not url.startswith("/api/")]
    pages += [f"/spaces/{slug}/{p}/" for p in ("manage", "rules", "waggles", "inbox")]
    pages += [f"/spaces/{slug}/members/w1/", "/", "/tokens/", "/password/", "/no-such-page/"]
    return pages


def test_the_finder_finds_what_csp_blocks():
    assert len(inline_code('<script>x()</script><a href="javascript:x()">a</a><b onclick="x()" style="color:red"></b>')) == 4
    assert inline_code('<script src="/static/console/console.js" defer></script><button data-action="post">go</button>') == []


def test_no_page_has_inline_script_handlers_or_style_attributes(world):
    # something in every panel: a pending approval and question, mail, a task, usage bars
    pending_approval(world.space)
    open_question(world.space)
    bus.send(world.space, "operator", "boss", "hello **there**")
    ledger.create_task(world.space, "boss", "a task")
    from django.contrib.auth.models import User

    client = world.client(User.objects.create_superuser("root"))  # staff in every space, and the whole admin
    offenders = {}
    for url in console_pages("alpha") + ["/admin/", "/admin/veronica/space/", f"/admin/veronica/space/{world.space.pk}/change/"]:
        response = client.get(url)
        assert response.status_code in (200, 404), url
        found = inline_code(response.content.decode())
        if found:
            offenders[url] = found
    anonymous = world.client(None)
    for url in LOGIN_PAGES:
        found = inline_code(anonymous.get(url).content.decode())
        if found:
            offenders[url] = found
    assert offenders == {}


def test_every_page_carries_a_csp_that_allows_only_our_own_scripts(world):
    client = world.client(world.viewer)
    for url in ["/spaces/alpha/", "/spaces/alpha/panels/usage/", "/api/spaces/alpha/"]:
        policy = dict(part.strip().split(" ", 1) for part in client.get(url)["Content-Security-Policy"].split(";") if part.strip())
        assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'", url
        assert policy["connect-src"] == "'self'" and policy["frame-ancestors"] == "'none'", url  # the socket is same-origin
        assert "unsafe" not in " ".join(policy.values()), url
    assert "Content-Security-Policy" in world.client(None).get("/login/")


# --- caching and permissions ------------------------------------------------------------------------

def test_pages_and_api_answers_are_private_and_never_stored(world):
    client = world.client(world.viewer)
    targets = [url for _, url in read_targets("alpha")] + ["/", "/tokens/", "/api/", "/api/spaces/"]
    for url in targets:
        response = client.get(url)
        assert response.status_code == 200, url
        directives = {d.strip() for d in response["Cache-Control"].split(",")}
        assert {"private", "no-store"} <= directives and "public" not in directives, url
    static = client.get("/static/console/console.js")
    assert "no-store" not in static.get("Cache-Control", "")  # assets carry no space data and may be cached


def test_every_answer_turns_off_powerful_features(world):
    client = world.client(world.viewer)
    for url in ["/spaces/alpha/", "/api/spaces/alpha/", "/login/", "/spaces/nope/"]:
        policy = client.get(url)["Permissions-Policy"]
        for feature in ("camera", "microphone", "geolocation", "payment", "usb"):
            assert f"{feature}=()" in policy, (url, feature)


# --- login throttling -------------------------------------------------------------------------------

def login_form(url: str, username: str, password: str) -> dict:
    return {"username": username, "password": password, "next": "/admin/" if url.startswith("/admin/") else "/"}


@pytest.mark.parametrize("url", LOGIN_PAGES)
def test_bad_passwords_lock_the_username_out_of_both_login_pages(world, url):
    for user in (world.staff, world.operator):
        user.set_password(PASSWORD)
        user.save()
    limit = settings.AXES_FAILURE_LIMIT
    client = world.client(None)
    for attempt in range(limit - 1):
        assert client.post(url, login_form(url, "staff", f"guess {attempt}")).status_code == 200  # the form again
    locked = client.post(url, login_form(url, "staff", "one guess too many"))
    assert locked.status_code == 429 and b"Too many failed logins" in locked.content
    # now even the right password is refused, on either page, for this username from this address
    for page in LOGIN_PAGES:
        assert client.post(page, login_form(page, "staff", PASSWORD)).status_code == 429
    assert "_auth_user_id" not in client.session
    # another username from the same address still logs in
    other = world.client(None)
    assert other.post("/login/", login_form("/login/", "operator", PASSWORD)).status_code == 302


def test_a_good_login_clears_earlier_failures(world):
    world.viewer.set_password(PASSWORD)
    world.viewer.save()
    client = world.client(None)
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        client.post("/login/", login_form("/login/", "viewer", "wrong"))
    assert client.post("/login/", login_form("/login/", "viewer", PASSWORD)).status_code == 302
    client.post("/logout/")
    assert client.post("/login/", login_form("/login/", "viewer", "wrong again")).status_code == 200  # counting from zero


def test_behind_a_trusted_proxy_lockouts_follow_the_client_not_the_proxy(world, settings):
    """All requests come from the proxy's address; the client is the proxy's X-Forwarded-For entry."""
    settings.TRUSTED_PROXY_COUNT = 1
    world.staff.set_password(PASSWORD)
    world.staff.save()
    proxy = {"REMOTE_ADDR": "10.0.0.2"}
    attacker = world.client(None)
    for attempt in range(settings.AXES_FAILURE_LIMIT):
        # the attacker forges the left part of the header; the proxy appends what it saw
        attacker.post("/login/", login_form("/login/", "staff", f"guess {attempt}"),
                      HTTP_X_FORWARDED_FOR=f"198.51.100.{attempt}, 203.0.113.9", **proxy)
    assert attacker.post("/login/", login_form("/login/", "staff", PASSWORD), HTTP_X_FORWARDED_FOR="203.0.113.9",
                         **proxy).status_code == 429  # forged entries did not spread the guesses over addresses
    # the real user, behind the same proxy, is not locked out by the attacker's guesses
    user = world.client(None)
    assert user.post("/login/", login_form("/login/", "staff", PASSWORD), HTTP_X_FORWARDED_FOR="192.0.2.44",
                     **proxy).status_code == 302


def test_without_a_trusted_proxy_the_forwarded_header_is_ignored(world, settings):
    settings.TRUSTED_PROXY_COUNT = 0
    world.staff.set_password(PASSWORD)
    world.staff.save()
    client = world.client(None)
    for attempt in range(settings.AXES_FAILURE_LIMIT):  # a fresh forged address per guess does not help
        client.post("/login/", login_form("/login/", "staff", f"guess {attempt}"), HTTP_X_FORWARDED_FOR=f"198.51.100.{attempt}")
    assert client.post("/login/", login_form("/login/", "staff", PASSWORD), HTTP_X_FORWARDED_FOR="192.0.2.1").status_code == 429
