"""The owners' doors to the A2A settings: the manage page's forms and the API, thin callers of the
same verbs; a credential's key is shown once and never again, by either."""
import pytest
from django.contrib.auth.models import User
from django.test import Client

from veronica.swarm import access
from veronica.models import A2AConfig, A2ACredential, A2ARemote


@pytest.fixture
def people(space):
    owner, operator = User.objects.create_user("owner"), User.objects.create_user("op")
    access.grant(space, "owner", "owner", actor="test")
    access.grant(space, "op", "operator", actor="test")
    return owner, operator


def bearer(user):
    return {"HTTP_AUTHORIZATION": f"Bearer {access.create_token(user, 't')[1]}"}


def test_the_manage_page_turns_serving_on_and_shows_a_new_credential_once(space, people):
    owner, _ = people
    client = Client()
    client.force_login(owner)
    assert client.post("/spaces/alpha/manage/", {"action": "a2a_serve", "enabled": "on"}).status_code == 302
    assert A2AConfig.objects.get(space=space).enabled
    page = client.post("/spaces/alpha/manage/", {"action": "a2a_credential", "name": "partner", "role": "viewer"})
    key = page.content.decode().split('id="new-a2a-key-value">')[1].split("<")[0]
    assert key.startswith("a2a_") and A2ACredential.objects.get().role == "viewer"
    again = client.get("/spaces/alpha/manage/").content.decode()
    assert key not in again and "partner" in again and A2ACredential.objects.get().prefix in again
    refused = client.post("/spaces/alpha/manage/", {"action": "a2a_members", "members": "ghost"})
    assert refused.status_code == 400 and A2AConfig.objects.get(space=space).members == []
    bad = client.post("/spaces/alpha/manage/", {"action": "a2a_add_remote", "name": "x", "card_url": "ftp://nope/"})
    assert bad.status_code == 400 and not A2ARemote.objects.exists()


def test_the_api_reads_and_sets_the_settings_and_only_owners_change_them(space, people):
    owner, operator = people
    client = Client()
    assert client.post("/api/spaces/alpha/a2a/", {"enabled": True, "members": ["w1"]}, content_type="application/json",
                       **bearer(owner)).json()["enabled"] is True
    made = client.post("/api/spaces/alpha/a2a/credentials/", {"name": "partner", "role": "operator"},
                       content_type="application/json", **bearer(owner))
    assert made.status_code == 201 and made.json()["key"].startswith("a2a_")
    shown = client.get("/api/spaces/alpha/a2a/", **bearer(operator)).json()
    assert shown["members"] == ["w1"] and made.json()["key"] not in str(shown)
    assert "key_hash" not in str(shown) and shown["credentials"][0]["name"] == "partner"
    assert client.post("/api/spaces/alpha/a2a/", {"enabled": False}, content_type="application/json",
                       **bearer(operator)).status_code == 403
    bad = client.post("/api/spaces/alpha/a2a/remotes/", {"name": "x", "card_url": "http://h/", "timeout": 0},
                      content_type="application/json", **bearer(owner))
    assert bad.status_code == 400 and bad.json()["field"] == "a2a.remotes.x.timeout"
    revoked = client.delete(f"/api/spaces/alpha/a2a/credentials/{A2ACredential.objects.get().pk}/", **bearer(owner))
    assert revoked.json()["revoked"] is True and A2ACredential.objects.get().revoked_at is not None
