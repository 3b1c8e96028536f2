"""A member may not take a name the engine sends mail or acts as (webhook, system, checks,
operator, all) nor a role name: its mail would pass for the engine's. Refused, in any letter case,
with the same error through the manifest, the API, the console form and the admin; the admin also
cannot rename a member into one."""
from __future__ import annotations

import shutil

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from tests.console.helpers import call
from veronica.swarm import bus
from veronica.ops import webhooks
from veronica.engine import checks
from veronica.models import Member, Space

ENGINE_SENDERS = ["webhook", "system", "checks", "operator", "Webhook", "SYSTEM"]


def test_the_reserved_names_cover_every_name_the_engine_sends_or_acts_as():
    from veronica.engine.supervisor import RESERVED_NAMES

    assert {webhooks.SENDER, bus.SYSTEM, bus.OPERATOR, bus.BROADCAST, checks.ACTOR} <= RESERVED_NAMES


@pytest.mark.parametrize("name", ENGINE_SENDERS)
def test_the_api_refuses_a_reserved_member_name(world, name):
    response = call(world.client(world.owner), "POST", "/api/spaces/alpha/members/", {"name": name})
    assert response.status_code == 400 and response.json()["field"] == "name"
    assert f"name '{name}' is reserved" in response.json()["error"] and "webhook" in response.json()["error"]
    assert not Member.objects.filter(space=world.space, name__iexact=name).exists(), "nothing half-written"


def test_the_console_form_refuses_a_reserved_member_name(world):
    client = world.client(world.owner, csrf=True)
    url = reverse("console:manage", args=["alpha"])
    client.get(url)
    response = client.post(url, {"action": "add_member", "name": "webhook", "role": "worker", "model": "offline",
                                 "csrfmiddlewaretoken": client.cookies["csrftoken"].value})
    assert response.status_code == 400 and "name: name &#x27;webhook&#x27; is reserved" in response.content.decode()
    assert not Member.objects.filter(name="webhook").exists()


def test_the_admin_refuses_a_reserved_name_and_cannot_rename_into_one(world):
    client = world.client(User.objects.create_superuser("root", "root@example.com", "pw"))
    response = client.post(reverse("admin:veronica_member_add"), {
        "space": world.space.pk, "name": "system", "role": "worker", "model": "offline", "permission_mode": "bypass",
        "membership": "active", "persona": "", "when_to_use": "", "rule_domains": "[]"})
    assert response.status_code == 200 and "is reserved" in str(response.context["adminform"].form.errors)
    assert not Member.objects.filter(name="system").exists()
    w1 = Member.objects.get(space=world.space, name="w1")
    form = client.get(reverse("admin:veronica_member_change", args=[w1.pk])).context["adminform"].form
    assert "name" not in form.fields, "the name is read-only once the member exists"


def test_the_manifest_refuses_a_member_folder_with_a_reserved_name(db, tmp_path, demo_manifest):
    team = tmp_path / "team"
    shutil.copytree(demo_manifest, team)
    shutil.move(team / "members" / "scout", team / "members" / "webhook")
    with pytest.raises(CommandError, match="webhook.*is reserved"):
        call_command("register", str(team))
    assert not Space.objects.exists(), "nothing half-written"
