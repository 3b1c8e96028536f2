"""Staff status alone makes nobody owner of every space (issue 21.5): staff get what their Django
permissions grant. superuser -> owner; veronica.change_space -> operator; veronica.view_space ->
viewer; neither -> only the spaces granted to them, like anyone else."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission, User

from tests.console.helpers import call, owner_targets, pending_approval, read_targets
from tests.console.test_stream_auth import session_cred
from veronica.swarm import access, ledger
from veronica.models import Space
from veronica.web.stream_auth import CLOSE_ACCESS_GONE, recheck


def staff_user(name: str, *perms: str, superuser: bool = False, via_group: bool = False) -> User:
    user = User.objects.create_user(name, is_staff=True, is_superuser=superuser)
    found = [Permission.objects.get(content_type__app_label="veronica", codename=p) for p in perms]
    if via_group:
        group = Group.objects.create(name=f"{name}-group")
        group.permissions.set(found)
        user.groups.add(group)
    else:
        user.user_permissions.set(found)
    return User.objects.get(pk=user.pk)  # a fresh copy: no stale permission cache


def api_role(client, slug: str = "alpha"):
    response = client.get(f"/api/spaces/{slug}/")
    return response.json()["role"] if response.status_code == 200 else response.status_code


def test_staff_without_permissions_see_no_space(world):
    bare = staff_user("bare")
    client = world.client(bare)
    assert client.get("/api/spaces/").json()["spaces"] == []
    assert api_role(client) == 404 and client.get("/spaces/alpha/").status_code == 404
    assert call(client, "POST", "/api/spaces/alpha/halt/", {}).status_code == 404
    assert b"/spaces/alpha/" not in client.get("/").content
    assert access.role_in(bare, world.space) is None


@pytest.mark.parametrize("via_group", [False, True])
def test_staff_with_view_space_read_every_space_and_steer_nothing(world, via_group):
    viewer = staff_user("auditor", "view_space", via_group=via_group)
    client = world.client(viewer)
    assert {s["slug"]: s["role"] for s in client.get("/api/spaces/").json()["spaces"]} == {"alpha": "viewer", "beta": "viewer"}
    task = ledger.create_task(world.space, "boss", "a job")
    for method, url in read_targets("alpha", task_id=task.pk):
        assert call(client, method, url).status_code == 200, url
    before = Space.objects.get(pk=world.space.pk).event_seq
    response = call(client, "POST", "/api/spaces/alpha/messages/", {"to": "boss", "body": "hi"})
    assert response.status_code == 403 and "viewer" in response.json()["error"]
    assert Space.objects.get(pk=world.space.pk).event_seq == before


def test_staff_with_change_space_operate_every_space_but_do_not_manage(world):
    operator = staff_user("ops", "change_space", "view_space")
    client = world.client(operator)
    assert api_role(client, "alpha") == "operator" and api_role(client, "beta") == "operator"
    assert call(client, "POST", "/api/spaces/beta/messages/", {"to": "x1", "body": "hi"}).status_code == 201
    approval = pending_approval(world.space)
    assert call(client, "POST", f"/api/spaces/alpha/approvals/{approval.pk}/approve/", {}).status_code == 200
    for method, url, body in owner_targets("alpha"):
        assert call(client, method, url, body).status_code == 403, (method, url)


def test_a_superuser_owns_every_space(world):
    root = User.objects.create_user("root", is_staff=True, is_superuser=True)
    client = world.client(root)
    assert api_role(client, "alpha") == "owner" and api_role(client, "beta") == "owner"
    assert client.get("/spaces/beta/manage/").status_code == 200


def test_a_grant_in_the_space_still_counts_for_staff_and_the_higher_role_wins(world):
    auditor = staff_user("auditor", "view_space")
    access.grant(world.space, "auditor", "owner", actor="test")
    client = world.client(auditor)
    assert api_role(client, "alpha") == "owner" and api_role(client, "beta") == "viewer"
    bare = staff_user("bare")
    access.grant(world.other, "bare", "operator", actor="test")
    assert {s["slug"]: s["role"] for s in world.client(bare).get("/api/spaces/").json()["spaces"]} == {"beta": "operator"}


def test_the_socket_recheck_follows_staff_permissions(world):
    bare, auditor, root = staff_user("bare"), staff_user("auditor", "view_space", via_group=True), staff_user("root", superuser=True)
    creds = {name: session_cred(user) for name, user in (("bare", bare), ("auditor", auditor), ("root", root))}
    assert recheck(world.space.pk, list(creds.values())) == {creds["bare"]: CLOSE_ACCESS_GONE}
    auditor.groups.clear()
    assert recheck(world.space.pk, list(creds.values())) == {creds["bare"]: CLOSE_ACCESS_GONE, creds["auditor"]: CLOSE_ACCESS_GONE}


def test_metrics_cover_the_spaces_staff_may_see(world):
    bare, auditor = staff_user("bare"), staff_user("auditor", "view_space")
    assert 'space="alpha"' not in world.client(bare).get("/metrics").content.decode()
    assert 'space="alpha"' in world.client(auditor).get("/metrics").content.decode()


def test_staff_status_alone_does_not_create_spaces_add_space_does(world):
    bare, maker = staff_user("bare"), staff_user("maker", "add_space")
    assert world.client(bare).get("/new-space/").status_code == 403
    assert b'id="new-space"' not in world.client(bare).get("/").content
    assert world.client(maker).get("/new-space/").status_code == 200
    assert b'id="new-space"' in world.client(maker).get("/").content
