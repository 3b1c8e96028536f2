"""Every page, API call and panel: 404 without access, 403 for a role too low, 401/login when anonymous."""
import pytest
from django.utils import timezone

from tests.console.helpers import call, open_question, owner_targets, pending_approval, read_targets, steer_targets
from veronica.swarm import ledger
from veronica.engine import supervisor
from veronica.models import Approval, Run, Space


@pytest.fixture
def targets(world):
    approval, question = pending_approval(world.space), open_question(world.space)
    slug = world.space.slug
    task = ledger.create_task(world.space, "boss", "a job")
    run = Run.objects.create(member=supervisor.get_member(world.space, "w1"), source="message", lease_token="t",
                             started_at=timezone.now(), ended_at=timezone.now(), outcome="done")
    return {
        "read": read_targets(slug, task_id=task.pk, run_id=run.pk),
        "steer": steer_targets(slug, approval.pk, question.pk),
        "own": owner_targets(slug),
    }


def test_a_user_without_access_gets_404_on_every_page_and_endpoint(world, targets):
    client = world.client(world.stranger)
    before = Space.objects.get(pk=world.space.pk).event_seq
    everything = [(m, u, None) for m, u in targets["read"]] + targets["steer"] + targets["own"]
    for method, url, body in everything:
        assert call(client, method, url, body).status_code == 404, (method, url)
    assert Space.objects.get(pk=world.space.pk).event_seq == before


def test_the_space_does_not_leak_into_lists(world):
    client = world.client(world.stranger)
    assert [s["slug"] for s in client.get("/api/spaces/").json()["spaces"]] == ["beta"]
    assert b"/spaces/alpha/" not in client.get("/").content


def test_an_unknown_space_and_an_unknown_member_are_404_for_everyone(world):
    client = world.client(world.staff)
    assert client.get("/spaces/nope/").status_code == 404
    assert client.get("/api/spaces/nope/").status_code == 404
    assert client.get("/spaces/alpha/members/ghost/").status_code == 404
    response = client.get("/api/spaces/alpha/members/ghost/")
    assert response.status_code == 404 and response.json()["field"] == "member"
    assert client.get("/api/no/such/endpoint/").json()["error"].startswith("no API endpoint")


def test_a_viewer_reads_everything(world, targets):
    client = world.client(world.viewer)
    for method, url in targets["read"]:
        assert call(client, method, url).status_code == 200, url


def test_a_viewer_is_refused_every_steering_move_and_nothing_changes(world, targets):
    client = world.client(world.viewer)
    before = Space.objects.get(pk=world.space.pk).event_seq
    for method, url, body in targets["steer"] + targets["own"]:
        response = call(client, method, url, body)
        assert response.status_code == 403, (method, url, response.status_code)
    assert Space.objects.get(pk=world.space.pk).event_seq == before
    assert Approval.objects.get(space=world.space).status == "pending"


def test_a_viewer_sees_no_controls_on_the_pages(world):
    client = world.client(world.viewer)
    member_page = client.get("/spaces/alpha/members/w1/").content.decode()
    assert 'id="controls"' not in member_page and "Read-only" in member_page
    space_page = client.get("/spaces/alpha/").content.decode()
    assert 'id="chat"' not in space_page and "Halt all" not in space_page
    pending_approval(world.space)
    assert "Approve" not in client.get("/spaces/alpha/panels/approvals/").content.decode()


def test_an_operator_steers_but_cannot_manage(world, targets):
    client = world.client(world.operator)
    for method, url, body in targets["own"]:
        assert call(client, method, url, body).status_code == 403, (method, url)
    response = call(client, "POST", "/api/spaces/alpha/messages/", {"to": "boss", "body": "hi"})
    assert response.status_code == 201
    page = client.get("/spaces/alpha/members/w1/").content.decode()
    assert 'id="controls"' in page and "Manage" not in client.get("/spaces/alpha/").content.decode()


def test_owner_and_staff_manage(world):
    for user in (world.owner, world.staff):
        client = world.client(user)
        assert client.get("/spaces/alpha/manage/").status_code == 200
        assert call(client, "GET", "/api/spaces/alpha/access/").status_code == 200
    assert world.client(world.staff).get("/api/spaces/beta/").json()["role"] == "owner"


def test_anonymous_pages_redirect_to_login_and_the_api_answers_401(world, targets):
    client = world.client(None)
    for method, url in targets["read"]:
        response = call(client, method, url)
        if url.startswith("/api/"):
            assert response.status_code == 401, url
            assert response["WWW-Authenticate"].startswith("Bearer")
        else:
            assert response.status_code == 302 and response["Location"].startswith("/login/?next="), url
    assert client.get("/").status_code == 302
    assert call(client, "POST", "/api/spaces/alpha/messages/", {"to": "boss", "body": "x"}).status_code == 401


def test_login_and_logout_pages(world):
    from tests.console.conftest import PASSWORD

    world.viewer.set_password(PASSWORD)
    world.viewer.save()
    client = world.client(None)
    assert client.get("/login/").status_code == 200
    response = client.post("/login/", {"username": "viewer", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302
    assert b"didn" in client.post("/login/", {"username": "viewer", "password": "wrong"}).content


def test_an_inactive_user_loses_access(world):
    client = world.client(world.operator)
    world.operator.is_active = False
    world.operator.save()
    assert client.get("/api/spaces/alpha/").status_code == 401
