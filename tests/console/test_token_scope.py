"""API tokens (issue 21.5): an optional expiry, a read-only scope, and an end when the user's
password changes or the user is disabled, for the JSON API and for sockets (the re-check)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.console.helpers import call
from tests.console.test_socket import bearer, closed_with, fast_recheck, run, socket, until_ready  # noqa: F401 (fixture)
from tests.console.test_socket import world as socket_world  # noqa: F401 (fixture)
from tests.console.test_stream_auth import token_cred
from veronica.swarm import access
from veronica.models import ApiToken, Message, Space
from veronica.web.stream_auth import CLOSE_CREDENTIALS_GONE, recheck

API = "/api/spaces/alpha"


def as_token(key: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def create_by_api(user, **body):
    client = Client()
    client.force_login(user)
    return client.post("/api/tokens/", body, content_type="application/json")


# --- creation: the API and the tokens page ------------------------------------------------------------

def test_the_api_creates_a_read_only_token_with_an_expiry(world):
    response = create_by_api(world.operator, name="ci", expires_in_days=30, read_only=True)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["read_only"] is True and body["key"].startswith("vrn_")
    token = ApiToken.objects.get(pk=body["id"])
    assert timedelta(days=29, hours=23) < token.expires_at - timezone.now() <= timedelta(days=30)
    assert body["expires_at"] == token.expires_at.isoformat()
    listed = Client(**as_token(body["key"])).get("/api/tokens/").json()["tokens"][0]
    assert listed["read_only"] is True and listed["expires_at"] == body["expires_at"]


def test_by_default_a_token_never_expires_and_may_write(world):
    body = create_by_api(world.operator, name="plain").json()
    assert body["expires_at"] is None and body["read_only"] is False


@pytest.mark.parametrize("field, value", [("expires_in_days", 0), ("expires_in_days", 3651), ("expires_in_days", "soon"),
                                          ("expires_in_days", True), ("expires_in_days", 1.5), ("read_only", "yes")])
def test_bad_expiry_or_scope_is_a_400_naming_the_field(world, field, value):
    response = create_by_api(world.operator, name="x", **{field: value})
    assert response.status_code == 400 and response.json()["field"] == field, response.content
    assert not ApiToken.objects.exists()


def test_the_tokens_page_creates_read_only_and_expiring_tokens_and_shows_them(world):
    client = world.client(world.operator)
    page = client.post("/tokens/", {"action": "create", "name": "report", "expires_in_days": "7", "read_only": "on"})
    assert page.status_code == 200 and 'id="new-key"' in page.content.decode()
    token = ApiToken.objects.get(name="report")
    assert token.read_only and timedelta(days=6) < token.expires_at - timezone.now() <= timedelta(days=7)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    listing = client.get("/tokens/").content.decode()
    assert "read-only" in listing and "expired" in listing
    for days in ("0", "9" * 5000, "-3", "1e3"):
        bad = client.post("/tokens/", {"action": "create", "name": "later", "expires_in_days": days})
        assert bad.status_code == 400 and "expires_in_days" in bad.content.decode(), days
    assert not ApiToken.objects.filter(name="later").exists()


# --- read-only: every non-GET API call is refused ----------------------------------------------------

def test_a_read_only_token_reads_but_every_change_is_403_and_nothing_changes(world):
    token, key = access.create_token(world.owner, "reader", read_only=True)
    client = Client(**as_token(key))
    assert client.get(f"{API}/").status_code == 200
    assert client.get(f"{API}/messages/").status_code == 200
    before = Space.objects.get(pk=world.space.pk).event_seq
    for method, url, body in [("POST", f"{API}/messages/", {"to": "boss", "body": "hi"}),
                              ("PUT", f"{API}/blackboard/", {"content": "x"}), ("POST", f"{API}/halt/", {}),
                              ("POST", f"{API}/members/w1/suspend/", {}), ("DELETE", f"{API}/members/w1/", None),
                              ("POST", f"{API}/access/", {"username": "viewer", "role": "owner"}),
                              ("DELETE", f"/api/tokens/{token.pk}/", None), ("POST", "/api/tokens/", {"name": "x"})]:
        response = call(client, method, url, body)
        assert response.status_code == 403, (method, url, response.status_code)
        assert "read-only" in response.json()["error"], response.json()
    assert Space.objects.get(pk=world.space.pk).event_seq == before
    assert not Message.objects.filter(body="hi").exists()
    ApiToken.objects.get(pk=token.pk, revoked_at__isnull=True)


def test_a_read_write_token_of_the_same_user_still_writes(world):
    _, key = access.create_token(world.owner, "writer")
    response = call(Client(**as_token(key)), "POST", f"{API}/messages/", {"to": "boss", "body": "hi"})
    assert response.status_code == 201


# --- the end of a token: expiry, password change, disabled user ---------------------------------------

def test_an_expired_token_is_401(world):
    token, key = access.create_token(world.viewer, "short", expires_in_days=1)
    assert Client(**as_token(key)).get(f"{API}/").status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = Client(**as_token(key)).get(f"{API}/")
    assert response.status_code == 401 and "expired" in response.json()["error"]


def test_a_password_change_ends_every_token_of_the_user(world):
    _, key = access.create_token(world.viewer, "script")
    _, other = access.create_token(world.operator, "script")
    assert Client(**as_token(key)).get(f"{API}/").status_code == 200
    world.viewer.set_password("a brand new password")
    world.viewer.save()
    assert Client(**as_token(key)).get(f"{API}/").status_code == 401
    assert Client(**as_token(other)).get(f"{API}/").status_code == 200  # someone else's token lives on
    _, fresh = access.create_token(world.viewer, "after the change")
    assert Client(**as_token(fresh)).get(f"{API}/").status_code == 200


def test_changing_the_password_on_the_console_ends_the_tokens(world):
    world.viewer.set_password("old password 123")
    world.viewer.save()
    _, key = access.create_token(world.viewer, "script")
    client = world.client(world.viewer)
    response = client.post("/password/", {"old_password": "old password 123", "new_password1": "quite a new one 456",
                                          "new_password2": "quite a new one 456"})
    assert response.status_code == 302
    assert Client(**as_token(key)).get(f"{API}/").status_code == 401


def test_a_disabled_user_s_token_is_401(world):
    _, key = access.create_token(world.viewer, "script")
    type(world.viewer).objects.filter(pk=world.viewer.pk).update(is_active=False)
    assert Client(**as_token(key)).get(f"{API}/").status_code == 401


def test_the_socket_recheck_ends_expired_and_password_changed_tokens(world):
    live, expired, moved = token_cred(world.operator), token_cred(world.viewer), token_cred(world.owner)
    ApiToken.objects.filter(pk=expired.token_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    world.owner.set_password("changed")
    world.owner.save()
    assert recheck(world.space.pk, [live, expired, moved]) == {expired: CLOSE_CREDENTIALS_GONE, moved: CLOSE_CREDENTIALS_GONE}


def test_a_token_socket_closes_with_4401_when_the_password_changes_and_a_read_only_token_may_watch(socket_world, fast_recheck):
    world = socket_world
    _, key = access.create_token(world.viewer, "script", read_only=True)

    def change_password(user):
        user.set_password("a new one entirely")
        user.save()

    async def scenario():
        comm = socket("alpha", headers=bearer(key))
        assert (await comm.connect())[0]
        await until_ready(comm)
        from asgiref.sync import sync_to_async

        await sync_to_async(change_password)(world.viewer)
        assert await closed_with(comm) == 4401

    run(scenario)
