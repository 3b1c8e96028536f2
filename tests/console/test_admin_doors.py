"""The admin is a door to the same verbs as the API and the tools: one parametrised test per verb,
the same rows and the same events whichever door was used (only the actor differs)."""
from __future__ import annotations

import shutil

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tests.admin_forms import form_data
from tests.console.helpers import call
from veronica.swarm import access, ledger, skills
from veronica.agent.prompt import system_prompt
from veronica.engine import supervisor
from veronica.plumbing.errors import VeronicaError
from veronica.portable.manifest import register
from veronica.models import Alarm, Event, Member, Message, Skill, Space, SpaceAccess, Task

API = "/api/spaces/alpha"
ACTOR_KEYS = {"actor", "by"}


@pytest.fixture
def admin(world) -> Client:
    return world.client(User.objects.create_superuser("root", "root@example.com", "pw"))


@pytest.fixture
def owner(world) -> Client:
    return world.client(world.owner)


def trail(space: Space, after: int) -> list[tuple]:
    """The events since seq `after`: kind, member and payload, without who did it."""
    rows = Event.objects.filter(space=space, seq__gt=after).order_by("seq")
    return [(e.kind, e.member.name if e.member else None, {k: v for k, v in e.payload.items() if k not in ACTOR_KEYS})
            for e in rows.select_related("member")]


def seq_of(space: Space) -> int:
    return Space.objects.get(pk=space.pk).event_seq


def admin_save(client: Client, obj, **changes):
    """Open the object's admin change page and save it with `changes`, as a browser would."""
    url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    data = form_data(client.get(url).content.decode(), f"{obj._meta.model_name}_form")
    data.update({k: [str(v)] for k, v in changes.items()})
    return client.post(url, {**data, "_save": "Save"})


def form_errors(response) -> dict:
    return response.context["adminform"].form.errors


# --- members ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("door", ["admin", "api"])
def test_a_permission_mode_set_at_either_door_is_runtime_and_survives_register(db, tmp_path, demo_manifest, door):
    team = tmp_path / "team"
    shutil.copytree(demo_manifest, team, ignore=shutil.ignore_patterns("workspace"))
    (team / "workspace").mkdir()
    space = register(team)
    User.objects.create_user("ann")
    access.grant(space, "ann", "owner", actor="test")
    scout, after = supervisor.get_member(space, "scout"), seq_of(space)
    if door == "admin":
        client = Client()
        client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
        assert admin_save(client, scout, permission_mode="default").status_code == 302
    else:
        client = Client()
        client.force_login(User.objects.get(username="ann"))
        assert call(client, "POST", "/api/spaces/demo/members/scout/permission/", {"mode": "default"}).status_code == 200
    scout.refresh_from_db()
    assert (scout.permission_mode, scout.permission_origin) == ("default", "runtime")
    assert trail(space, after) == [("member.permission_mode", "scout", {"member_name": "scout", "mode": "default"})]
    register(team)
    scout.refresh_from_db()
    assert scout.permission_mode == "default", "a restart register keeps a runtime permission mode"


@pytest.mark.parametrize("door", ["admin", "verb"])
def test_a_member_edit_at_either_door_writes_the_same_row_and_event(world, admin, door):
    w1, after = supervisor.get_member(world.space, "w1"), seq_of(world.space)
    edits = {"persona": "You review code.", "max_iterations": 12, "budget_override": 5000}
    if door == "admin":
        assert admin_save(admin, w1, **edits).status_code == 302
    else:
        supervisor.edit_member(w1, edits, actor="owner")
    w1.refresh_from_db()
    assert (w1.persona, w1.max_iterations, w1.budget_override) == ("You review code.", 12, 5000)
    assert system_prompt(w1).startswith("You review code."), "the next run's prompt is built from the row"
    assert trail(world.space, after) == [
        ("member.updated", "w1", {"member_name": "w1", "fields": ["budget_override", "max_iterations", "persona"]})]


def test_a_second_leader_made_in_the_admin_is_a_form_error(world, admin):
    w1, before = supervisor.get_member(world.space, "w1"), seq_of(world.space)
    response = admin_save(admin, w1, role="leader")
    assert response.status_code == 200 and "at most one" in str(form_errors(response)["role"])
    assert Member.objects.get(pk=w1.pk).role == "worker" and seq_of(world.space) == before


def test_a_duplicate_member_name_in_the_admin_is_a_form_error(world, admin):
    response = admin.post(reverse("admin:veronica_member_add"), {
        "space": world.space.pk, "name": "w1", "role": "worker", "model": "offline", "permission_mode": "bypass",
        "rule_domains": "[]"})
    assert response.status_code == 200 and "already exists" in str(form_errors(response)["name"])
    assert Member.objects.filter(space=world.space, name="w1").count() == 1


def test_internal_member_fields_are_read_only_in_the_admin(world, admin):
    w1 = supervisor.get_member(world.space, "w1")
    fields = admin.get(reverse("admin:veronica_member_change", args=[w1.pk])).context["adminform"].form.fields
    internal = {"wake_queued_at", "current_task", "lease_token", "lease_expires_at", "run_status", "phase",
                "membership", "cancel_requested", "permission_origin", "schedule_origin", "failures", "removed_at"}
    assert not internal & set(fields), internal & set(fields)
    assert {"persona", "model", "permission_mode", "schedule", "budget_override", "max_iterations"} <= set(fields)


# --- tasks -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("door", ["admin", "verb"])
def test_assigning_a_ready_task_at_either_door_starts_it(world, admin, door):
    task = ledger.create_task(world.space, "boss", "index the repo")
    w1, after = supervisor.get_member(world.space, "w1"), seq_of(world.space)
    assert task.status == "ready"
    if door == "admin":
        assert admin_save(admin, task, assignee=w1.pk).status_code == 302
    else:
        ledger.assign(Task.objects.get(pk=task.pk), w1, actor="owner")
    task.refresh_from_db()
    assert (task.status, task.assignee_id) == ("running", w1.pk)
    mail = Message.objects.get(task=task, recipient=w1)
    assert mail.subject == f"Task #{task.pk}: index the repo"
    kinds = [(kind, member) for kind, member, _ in trail(world.space, after)]
    assert kinds == [("task.assigned", None), ("task.status", None), ("message.sent", None)], kinds


@pytest.mark.parametrize("door", ["admin", "verb"])
@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_cancelling_or_retrying_a_task_at_either_door_writes_the_same_trail(world, admin, door, action):
    w1 = supervisor.get_member(world.space, "w1")
    task = ledger.create_task(world.space, "boss", "index the repo", assignee=w1)
    if action == "retry":
        ledger.complete(Task.objects.get(pk=task.pk), actor="w1", result="broke", failed=True)
    after = seq_of(world.space)
    if door == "admin":
        response = admin.post(reverse("admin:veronica_task_changelist"),
                              {"action": f"{action}_tasks", "_selected_action": [task.pk]})
        assert response.status_code == 302
    else:
        getattr(ledger, action)(Task.objects.get(pk=task.pk), actor="owner")
    task.refresh_from_db()
    assert task.status == {"cancel": "cancelled", "retry": "running"}[action]
    kinds = [kind for kind, _, _ in trail(world.space, after)]
    assert kinds == {"cancel": ["task.status", "message.sent"],
                     "retry": ["task.status", "task.assigned", "task.status", "message.sent"]}[action], kinds


def test_the_admin_refuses_to_assign_a_member_of_another_space(world, admin):
    task = ledger.create_task(world.space, "boss", "index the repo")
    stranger, before = supervisor.get_member(world.other, "x1"), seq_of(world.space)
    response = admin_save(admin, task, assignee=stranger.pk)
    assert response.status_code == 200 and "not a member of this space" in str(form_errors(response)["assignee"])
    assert Task.objects.get(pk=task.pk).assignee_id is None and seq_of(world.space) == before


# --- skills ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("door", ["admin_bulk", "admin_page", "verb"])
def test_removing_a_skill_at_any_door_emits_skill_removed(world, admin, door):
    skill = skills.add_skill(world.space, "notes", "# Notes")
    after = seq_of(world.space)
    if door == "admin_bulk":
        response = admin.post(reverse("admin:veronica_skill_changelist"),
                              {"action": "delete_selected", "_selected_action": [skill.pk], "post": "yes"})
        assert response.status_code == 302
    elif door == "admin_page":
        assert admin.post(reverse("admin:veronica_skill_delete", args=[skill.pk]), {"post": "yes"}).status_code == 302
    else:
        skills.remove_skill(world.space, "notes", actor="owner")
    assert not Skill.objects.filter(pk=skill.pk).exists()
    assert not any("## notes" in system_prompt(m) for m in Member.objects.filter(space=world.space)), "gone at the next run"
    assert trail(world.space, after) == [("skill.removed", None, {"name": "notes", "scope": "shared"})]


def test_a_duplicate_skill_name_in_the_admin_is_a_form_error(world, admin):
    skills.add_skill(world.space, "notes", "# Notes")
    after = seq_of(world.space)
    response = admin.post(reverse("admin:veronica_skill_add"), {"space": world.space.pk, "name": "notes", "body": "other"})
    assert response.status_code == 200 and "already exists" in str(form_errors(response)["name"])
    assert Skill.objects.get(space=world.space, name="notes").body == "# Notes" and seq_of(world.space) == after


# --- space settings --------------------------------------------------------------------------------------

@pytest.mark.parametrize("door", ["admin", "api"])
def test_retention_set_at_either_door_emits_its_event(world, admin, owner, door):
    after = seq_of(world.space)
    if door == "admin":
        assert admin_save(admin, world.space, retention_days=30).status_code == 302
    else:
        assert call(owner, "PUT", f"{API}/retention/", {"retention_days": 30}).status_code == 200
    assert Space.objects.get(pk=world.space.pk).retention_days == 30
    assert trail(world.space, after) == [("space.retention_set", None, {"days": 30})]


@pytest.mark.parametrize("door", ["admin", "api"])
def test_watchdog_thresholds_set_at_either_door_emit_their_event(world, admin, owner, door):
    after = seq_of(world.space)
    if door == "admin":
        assert admin_save(admin, world.space, stuck_run_minutes=45, mailbox_backlog_minutes=0).status_code == 302
    else:
        assert call(owner, "PUT", f"{API}/watchdogs/", {"stuck_run_minutes": 45, "mailbox_backlog_minutes": 0}).status_code == 200
    space = Space.objects.get(pk=world.space.pk)
    assert (space.stuck_run_minutes, space.mailbox_backlog_minutes, space.stale_task_minutes) == (45, 0, 120)
    assert trail(world.space, after) == [("space.watchdogs_configured", None, {"stuck_run_minutes": 45, "mailbox_backlog_minutes": 0})]


def test_a_watchdog_threshold_out_of_range_in_the_admin_is_a_form_error(world, admin):
    response = admin_save(admin, world.space, stuck_run_minutes=10**6)
    assert response.status_code == 200 and "whole number of minutes" in str(form_errors(response)["stuck_run_minutes"])
    assert Space.objects.get(pk=world.space.pk).stuck_run_minutes == 30


@pytest.mark.parametrize("door", ["admin", "api"])
def test_the_notifier_set_at_either_door_emits_its_event(world, admin, owner, door):
    after = seq_of(world.space)
    if door == "admin":
        assert admin_save(admin, world.space, notify_emails="ops@example.com").status_code == 302
    else:
        assert call(owner, "PUT", f"{API}/notify/", {"emails": ["ops@example.com"]}).status_code == 200
    assert Space.objects.get(pk=world.space.pk).notify_emails == "ops@example.com"
    assert trail(world.space, after) == [("space.notify_configured", None, {"channels": ["email"]})]


@pytest.mark.parametrize("door", ["admin_inline", "admin_page", "api"])
def test_access_granted_at_any_door_emits_its_event(world, admin, owner, door):
    ann, after = User.objects.create_user("ann"), seq_of(world.space)
    if door == "admin_inline":
        url = reverse("admin:veronica_space_change", args=[world.space.pk])
        data = form_data(admin.get(url).content.decode(), "space_form")
        n = int(data["access-TOTAL_FORMS"][0])
        data.update({"access-TOTAL_FORMS": [str(n + 1)], f"access-{n}-user": [str(ann.pk)],
                     f"access-{n}-role": ["viewer"], f"access-{n}-space": [str(world.space.pk)]})
        assert admin.post(url, {**data, "_save": "Save"}).status_code == 302
    elif door == "admin_page":
        response = admin.post(reverse("admin:veronica_spaceaccess_add"), {"user": ann.pk, "space": world.space.pk, "role": "viewer"})
        assert response.status_code == 302
    else:
        assert call(owner, "POST", f"{API}/access/", {"username": "ann", "role": "viewer"}).status_code == 201
    assert SpaceAccess.objects.get(space=world.space, user=ann).role == "viewer"
    assert trail(world.space, after) == [("access.granted", None, {"user": "ann", "role": "viewer", "created": True})]


def test_a_verb_refusing_at_save_time_is_a_message_not_a_500(world, admin):
    """The alarm form leaves the 366-day limit to alarms.set_alarm: the save rolls back and says why."""
    w1 = supervisor.get_member(world.space, "w1")
    response = admin.post(reverse("admin:veronica_alarm_add"), {"member": w1.pk, "fire_at_0": "2099-01-01", "fire_at_1": "09:00:00",
                                                                "note": "far"}, follow=True)
    assert response.status_code == 200
    assert "at most 366 days ahead" in " ".join(str(m) for m in response.context["messages"])
    assert not Alarm.objects.exists()


def test_edit_member_checks_everything_first_and_a_no_op_emits_nothing(world):
    w1, after = supervisor.get_member(world.space, "w1"), seq_of(world.space)
    for bad, field in [({"max_iterations": 0}, "max_iterations"), ({"role": "leader"}, "role"), ({"name": "x"}, "name"),
                       ({"persona": "ok", "model": "nope:x"}, "model")]:
        with pytest.raises(VeronicaError) as refused:
            supervisor.edit_member(w1, bad, actor="owner")
        assert refused.value.field == field
    supervisor.edit_member(w1, {"persona": w1.persona, "max_iterations": w1.max_iterations}, actor="owner")
    assert seq_of(world.space) == after and Member.objects.get(pk=w1.pk).persona == ""
