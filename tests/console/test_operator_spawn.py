"""Operators spawn clones from the console (POST .../spawn/); the spawn cap gates only the leader's tool."""
import pytest

from tests.console.helpers import call
from tests.fixes.test_fix_current_task import tool
from veronica.models import Member, Space

API = "/api/spaces/alpha/members"


@pytest.fixture
def capped(world):
    Space.objects.filter(pk=world.space.pk).update(spawn_cap=1)
    world.space.refresh_from_db()
    return world


def live_clones(space) -> list[str]:
    return sorted(Member.objects.filter(space=space, spawned_from__isnull=False, removed_at__isnull=True).values_list("name", flat=True))


def test_operator_spawns_past_the_cap_the_leader_is_held_to(capped):
    space, op = capped.space, capped.client(capped.operator)
    assert "spawned w1-1" in tool(space, "boss", "member_spawn", base="w1")
    assert "spawn cap reached" in tool(space, "boss", "member_spawn", base="w1")  # the leader's guardrail
    response = call(op, "POST", f"{API}/w1/spawn/", {"retire": "manual"})
    assert response.status_code == 200, response.content
    assert response.json()["result"] == {"spawned": "w1-2", "retire": "manual"}
    assert call(op, "POST", f"{API}/w2/spawn/").json()["result"]["spawned"] == "w2-1"  # no body: on_complete
    assert live_clones(space) == ["w1-1", "w1-2", "w2-1"]
    clone = Member.objects.get(space=space, name="w1-2")
    assert clone.spawned_from.name == "w1" and clone.retire_policy == "manual"


def test_spawn_is_refused_for_viewers_clones_the_leader_and_bad_retire(capped):
    space = capped.space
    assert call(capped.client(capped.viewer), "POST", f"{API}/w1/spawn/").status_code == 403
    op = capped.client(capped.operator)
    bad = call(op, "POST", f"{API}/w1/spawn/", {"retire": "never"})
    assert bad.status_code == 400 and bad.json()["field"] == "retire"
    assert call(op, "POST", f"{API}/boss/spawn/").status_code == 400
    call(op, "POST", f"{API}/w1/spawn/")
    assert call(op, "POST", f"{API}/w1-1/spawn/").status_code == 400  # a clone is not cloned
    assert live_clones(space) == ["w1-1"]


def test_the_member_page_offers_the_spawn_form_to_operators_only(capped):
    page = "/spaces/alpha/members/w1/"
    html = capped.client(capped.operator).get(page).content.decode()
    assert 'id="spawn-clone"' in html and 'data-url="/api/spaces/alpha/members/w1/spawn/"' in html
    assert 'id="spawn-clone"' not in capped.client(capped.viewer).get(page).content.decode()
    assert 'id="spawn-clone"' not in capped.client(capped.operator).get("/spaces/alpha/members/boss/").content.decode()
