"""API tokens (create, use, revoke; only the hash stored) and CSRF on session-authenticated writes."""
import hashlib

from django.test import Client

from tests.console.helpers import call
from veronica.swarm import access
from veronica.models import ApiToken, Message


def bearer(key: str) -> Client:
    return Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {key}")


def test_a_token_is_created_once_stored_hashed_used_and_revoked(world):
    session = world.client(world.operator)
    created = call(session, "POST", "/api/tokens/", {"name": "nightly"})
    assert created.status_code == 201
    key = created.json()["key"]
    token = ApiToken.objects.get(user=world.operator)
    assert token.key_hash == hashlib.sha256(key.encode()).hexdigest() and key not in (token.prefix, token.name)
    assert token.prefix == key[:8] and "key" not in session.get("/api/tokens/").json()["tokens"][0]

    script = bearer(key)
    assert script.get("/api/me/").json() == {"username": "operator", "is_staff": False, "token": True}
    # token writes need no CSRF token even with enforce_csrf_checks
    assert call(script, "POST", "/api/spaces/alpha/messages/", {"to": "boss", "body": "from a script"}).status_code == 201
    assert Message.objects.filter(body="from a script").exists()
    token.refresh_from_db()
    assert token.last_used_at is not None

    assert call(session, "DELETE", f"/api/tokens/{token.pk}/").json()["revoked_at"]
    refused = script.get("/api/spaces/alpha/")
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]


def test_a_token_carries_its_users_roles_only(world):
    _, key = access.create_token(world.viewer, "reader")
    script = bearer(key)
    assert script.get("/api/spaces/alpha/").status_code == 200
    assert call(script, "POST", "/api/spaces/alpha/messages/", {"to": "boss", "body": "x"}).status_code == 403
    assert script.get("/api/spaces/beta/").status_code == 404


def test_bad_bearer_headers_are_401_never_a_fallback_to_the_session(world):
    session = world.client(world.operator)
    for header in ("Bearer vrn_nope", "Bearer ", "Basic abc", "Token x"):
        assert session.get("/api/spaces/alpha/", HTTP_AUTHORIZATION=header).status_code == 401, header


def test_a_token_cannot_mint_tokens_and_users_cannot_revoke_others_tokens(world):
    token, key = access.create_token(world.operator, "ci")
    assert call(bearer(key), "POST", "/api/tokens/", {"name": "child"}).status_code == 403
    assert call(world.client(world.viewer), "DELETE", f"/api/tokens/{token.pk}/").status_code == 404
    assert call(world.client(world.operator), "POST", "/api/tokens/", {"name": ""}).json()["field"] == "name"
    assert call(world.client(world.operator), "POST", "/api/tokens/", {"name": "n" * 81}).json()["field"] == "name"


def test_an_inactive_users_token_is_refused(world):
    _, key = access.create_token(world.operator, "ci")
    world.operator.is_active = False
    world.operator.save()
    assert bearer(key).get("/api/me/").status_code == 401


def test_the_tokens_page_shows_a_key_once_and_revokes(world):
    client = world.client(world.viewer)
    page = client.post("/tokens/", {"action": "create", "name": "laptop"})
    assert page.status_code == 200 and "no-store" in {d.strip() for d in page["Cache-Control"].split(",")}
    token = ApiToken.objects.get(user=world.viewer)
    key = page.content.decode().split('id="new-key">')[1].split("<")[0]
    assert access.hash_key(key) == token.key_hash
    assert key not in client.get("/tokens/").content.decode()
    client.post("/tokens/", {"action": "revoke", "token_id": token.pk})
    token.refresh_from_db()
    assert token.revoked_at is not None and bearer(key).get("/api/me/").status_code == 401


def test_session_writes_without_a_csrf_token_are_refused(world):
    client = world.client(world.operator, csrf=True)
    assert client.get("/api/spaces/alpha/").status_code == 200  # reads need none
    for method, url, body in [("POST", "/api/spaces/alpha/messages/", {"to": "boss", "body": "x"}),
                              ("PUT", "/api/spaces/alpha/blackboard/", {"content": "x"}),
                              ("POST", "/api/tokens/", {"name": "t"}),
                              ("POST", "/api/spaces/alpha/members/w1/suspend/", {})]:
        response = call(client, method, url, body)
        assert response.status_code == 403 and "CSRF" in response.json()["error"], url
    assert not Message.objects.exists() and not ApiToken.objects.exists()
    assert client.post("/tokens/", {"name": "t"}).status_code == 403
    assert client.post("/spaces/alpha/manage/", {"action": "grant"}).status_code == 403


def test_session_writes_with_the_csrf_token_pass(world):
    client = world.client(world.operator, csrf=True)
    client.get("/spaces/alpha/")  # sets the csrftoken cookie, as the console page does
    token = client.cookies["csrftoken"].value
    response = client.generic("POST", "/api/spaces/alpha/messages/", data='{"to": "boss", "body": "x"}',
                              content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 201
