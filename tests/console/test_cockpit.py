"""The cockpit's doors: tasks, members and skills from the console's forms and the JSON API call
the same verbs, so each door leaves the same rows and the same events; viewers get no controls
and a 403, and bad input is refused by name with nothing written."""
from __future__ import annotations

import pytest

from tests.console.helpers import call
from veronica.swarm import ledger, skills
from veronica.engine import supervisor
from veronica.models import Event, Member, Message, Skill, Space, Task

API = "/api/spaces/alpha"
PAGES = "/spaces/alpha"
DOORS = ("console", "api")


def seq(space: Space) -> int:
    return Space.objects.get(pk=space.pk).event_seq


def events_since(space: Space, after: int) -> list[tuple]:
    """The events a move wrote, with what tells them apart (not ids or times)."""
    out = []
    for e in Event.objects.filter(space=space, seq__gt=after).order_by("seq"):
        p = e.payload
        if e.kind == "task.status":
            out.append((e.kind, p["frm"], p["to"], p["actor"]))
        elif e.kind == "task.assigned":
            out.append((e.kind, p["assignee"], p["actor"]))
        elif e.kind == "message.sent":
            out.append((e.kind, p["sender"], p["to"]))
        elif e.kind.startswith(("member.", "skill.")):
            out.append((e.kind, p.get("member_name"), p.get("name"), tuple(p.get("fields", ())), p.get("actor")))
        else:
            out.append((e.kind,))
    return out


def _form(data: dict) -> dict:
    return {k: ", ".join(map(str, v)) if isinstance(v, list) else ("" if v is None else v) for k, v in data.items()}


def task_move(world, door: str, verb: str, task_id: int | None = None, user=None, **data):
    """One task verb through one door; returns the response."""
    client = world.client(user or world.operator)
    if door == "api":
        url = f"{API}/tasks/" if verb == "create" else f"{API}/tasks/{task_id}/{verb}/"
        return call(client, "POST", url, data)
    url = f"{PAGES}/tasks/new/" if verb == "create" else f"{PAGES}/tasks/{task_id}/act/"
    return client.post(url, _form(data) | ({} if verb == "create" else {"action": verb}))


def ok(door: str, response, created: bool = False) -> None:
    expected = 302 if door == "console" else 201 if created else 200
    assert response.status_code == expected, response.content[:500]


OP = "user:operator"


@pytest.fixture
def rung(monkeypatch):
    """Wakes the verbs enqueue, recorded instead of sent."""
    woken = []
    monkeypatch.setattr("veronica.engine.wakes.enqueue_wake", lambda pk, source: woken.append((pk, source)))
    return woken


# --- tasks -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("door", DOORS)
def test_create_an_assigned_task_starts_it_with_mail_and_a_dispatch(world, door, rung, django_capture_on_commit_callbacks):
    before = seq(world.space)
    with django_capture_on_commit_callbacks(execute=True):
        ok(door, task_move(world, door, "create", title="index the repo", spec="every file", assignee="w1", verify="leader"),
           created=True)
    task = Task.objects.get(title="index the repo")
    assert (task.status, task.assignee.name, task.spec, task.verify_policy, task.creator_name) == (
        "running", "w1", "every file", "leader", OP)
    mail = Message.objects.get(recipient_name="w1")
    assert mail.task_id == task.pk and mail.sender_name == OP and "When finished call task_done" in mail.body
    assert events_since(world.space, before) == [
        ("task.created",), ("task.status", "pending", "ready", OP), ("task.assigned", "w1", OP),
        ("task.status", "ready", "running", OP), ("message.sent", OP, "w1")]
    w1 = supervisor.get_member(world.space, "w1")
    assert (w1.pk, "task") in rung  # the assignee was woken, as the seed's task wake


@pytest.mark.parametrize("door", DOORS)
def test_create_for_a_role_picks_the_member_with_fewest_open_tasks_and_waits_on_dependencies(world, door):
    ledger.create_task(world.space, "boss", "busy", assignee=supervisor.get_member(world.space, "w1"))
    first = ledger.create_task(world.space, "boss", "first")
    ok(door, task_move(world, door, "create", title="after", assignee="worker", depends_on=[first.pk]), created=True)
    task = Task.objects.get(title="after")
    assert (task.status, task.assignee.name, task.engine_managed) == ("pending", "w2", True)
    assert list(task.depends_on.values_list("pk", flat=True)) == [first.pk]
    assert not Message.objects.filter(recipient_name="w2").exists()  # it starts when #first is done


@pytest.mark.parametrize("door", DOORS)
def test_assigning_a_ready_task_starts_it(world, door):
    task = ledger.create_task(world.space, "boss", "ready one")
    before = seq(world.space)
    ok(door, task_move(world, door, "assign", task.pk, assignee="w2"))
    task.refresh_from_db()
    assert (task.status, task.assignee.name) == ("running", "w2")
    assert Message.objects.filter(recipient_name="w2", task=task).count() == 1
    assert events_since(world.space, before) == [
        ("task.assigned", "w2", OP), ("task.status", "ready", "running", OP), ("message.sent", OP, "w2")]


@pytest.mark.parametrize("door", DOORS)
def test_reassigning_a_running_task_requeues_it_tells_the_old_assignee_and_starts_the_new(world, door):
    task = ledger.create_task(world.space, "boss", "move me", assignee=supervisor.get_member(world.space, "w1"))
    before = seq(world.space)
    ok(door, task_move(world, door, "reassign", task.pk, assignee="w2"))
    task.refresh_from_db()
    assert (task.status, task.assignee.name) == ("running", "w2")
    assert "reassigned to w2" in Message.objects.filter(recipient_name="w1").latest("pk").body
    assert events_since(world.space, before) == [
        ("task.status", "running", "ready", OP), ("message.sent", OP, "w1"), ("task.assigned", "w2", OP),
        ("task.status", "ready", "running", OP), ("message.sent", OP, "w2")]
    assert supervisor.get_member(world.space, "w2").current_task_id == task.pk
    assert supervisor.get_member(world.space, "w1").current_task_id is None


@pytest.mark.parametrize("door", DOORS)
def test_cancelling_a_running_task_tells_its_assignee(world, door):
    task = ledger.create_task(world.space, "boss", "stop me", assignee=supervisor.get_member(world.space, "w1"))
    before = seq(world.space)
    ok(door, task_move(world, door, "cancel", task.pk, reason="not needed"))
    task.refresh_from_db()
    assert (task.status, task.status_reason) == ("cancelled", "not needed")
    assert "cancelled by user:operator: not needed" in Message.objects.filter(recipient_name="w1").latest("pk").body
    assert events_since(world.space, before) == [("task.status", "running", "cancelled", OP), ("message.sent", OP, "w1")]


@pytest.mark.parametrize("door", DOORS)
def test_retrying_a_failed_task_starts_it_again_with_its_assignee(world, door):
    task = ledger.create_task(world.space, "boss", "flaky", assignee=supervisor.get_member(world.space, "w1"))
    ledger.complete(task, actor="w1", result="broke", failed=True)
    before = seq(world.space)
    ok(door, task_move(world, door, "retry", task.pk))
    task.refresh_from_db()
    assert (task.status, task.assignee.name) == ("running", "w1")
    assert events_since(world.space, before) == [
        ("task.status", "failed", "ready", OP), ("task.assigned", "w1", OP), ("task.status", "ready", "running", OP),
        ("message.sent", OP, "w1")]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("verb, data, field, fragment, status", [
    ("create", {"title": ""}, "title", "empty", 400),
    ("create", {"title": "x", "assignee": "ghost"}, "assignee", "no member or role named 'ghost'", 400),
    ("create", {"title": "x", "depends_on": [999]}, "depends_on", "#999", 400),
    ("create", {"title": "x", "verify": "vibes"}, "verify", "one of", 400),
    ("create", {"title": "x", "verify": "checks"}, "verify", "configures none", 400),
    ("retry", {}, "task_id", "only a failed task", 409),
    ("assign", {}, "assignee", "required", 400),
    ("create", {"title": "x", "depends_on": "3, b"}, "depends_on", "task numbers", 400),
    ("frobnicate", {}, "action", "one of", 400),
])
def test_bad_task_input_is_refused_by_name_and_writes_nothing(world, door, verb, data, field, fragment, status):
    task = ledger.create_task(world.space, "boss", "existing")
    before, tasks = seq(world.space), Task.objects.count()
    response = task_move(world, door, verb, None if verb == "create" else task.pk, **data)
    assert response.status_code == status
    text = response.json()["error"] if door == "api" else response.content.decode()
    if door == "api":
        assert response.json()["field"] == field
    else:
        assert f"{field}: " in text
    assert fragment in text.replace("&#x27;", "'")
    assert seq(world.space) == before and Task.objects.count() == tasks


@pytest.mark.parametrize("door", DOORS)
def test_a_viewer_cannot_steer_tasks(world, door):
    task = ledger.create_task(world.space, "boss", "keep")
    before = seq(world.space)
    assert task_move(world, door, "create", user=world.viewer, title="sneaky").status_code == 403
    assert task_move(world, door, "cancel", task.pk, user=world.viewer).status_code == 403
    assert seq(world.space) == before and not Task.objects.filter(title="sneaky").exists()


def test_viewers_see_no_task_or_member_controls_and_operators_do(world):
    task = ledger.create_task(world.space, "boss", "look")
    viewer, operator, owner = (world.client(u) for u in (world.viewer, world.operator, world.owner))
    for client, steer, manage in ((viewer, False, False), (operator, True, False), (owner, True, True)):
        board = client.get(f"{PAGES}/").content.decode()
        page = client.get(f"{PAGES}/tasks/{task.pk}/").content.decode()
        member = client.get(f"{PAGES}/members/w1/").content.decode()
        assert ('id="new-task-form"' in board) is steer and ('id="task-controls"' in page) is steer
        assert ('id="new-member"' in board) is manage and ('id="edit-member"' in member) is manage
    assert viewer.get(f"{PAGES}/members/w1/edit/").status_code == 403
    assert operator.get(f"{PAGES}/new-member/").status_code == 403


# --- members -----------------------------------------------------------------------------------------------

def member_move(world, door: str, target: str | None, user=None, **data):
    """Create (target None) or edit one member through one door."""
    client = world.client(user or world.owner)
    if door == "api":
        if target is None:
            return call(client, "POST", f"{API}/members/", data)
        return call(client, "PATCH", f"{API}/members/{target}/", data)
    url = f"{PAGES}/new-member/" if target is None else f"{PAGES}/members/{target}/edit/"
    return client.post(url, _form(data))


def config(member: Member) -> tuple:
    member.refresh_from_db()
    return (member.persona, member.when_to_use, member.model, member.budget_override, member.max_iterations, member.rule_domains,
            member.tools, member.deferred_tools, member.schedule, member.permission_mode)


FULL = {"persona": "You index repositories.", "when_to_use": "indexing", "model": "openai:gpt-4.1-mini", "budget_override": 5000,
        "max_iterations": 7, "rule_domains": ["conduct"], "tools": ["read_file", "send_message"],
        "deferred_tools": ["grep"], "schedule": "*/10 * * * *", "permission_mode": "default"}
FULL_ROW = ("You index repositories.", "indexing", "openai:gpt-4.1-mini", 5000, 7, ["conduct"], ["read_file", "send_message"],
            ["grep"], "*/10 * * * *", "default")


@pytest.mark.parametrize("door", DOORS)
def test_create_a_member_with_its_whole_configuration(world, door):
    before = seq(world.space)
    ok(door, member_move(world, door, None, name="indexer", role="worker", **FULL), created=True)
    member = supervisor.get_member(world.space, "indexer")
    assert config(member) == FULL_ROW and member.origin == "runtime"
    assert events_since(world.space, before) == [("member.added", "indexer", None, (), "user:owner")]


@pytest.mark.parametrize("door", DOORS)
def test_edit_a_member_writes_one_event_and_the_schedule_and_mode_through_their_verbs(world, door):
    w1 = supervisor.get_member(world.space, "w1")
    before = seq(world.space)
    ok(door, member_move(world, door, "w1", **FULL))
    assert config(w1) == FULL_ROW
    shown = world.client(world.viewer).get(f"{API}/members/w1/").json()  # the API shows the set as stored
    assert (shown["tools"], shown["deferred_tools"], shown["max_iterations"], shown["persona"]) == (
        FULL["tools"], FULL["deferred_tools"], 7, FULL["persona"])
    fields = ("budget_override", "deferred_tools", "max_iterations", "model", "persona", "rule_domains", "tools", "when_to_use")
    assert sorted(w1.runtime_fields) == list(fields) and w1.schedule_origin == w1.permission_origin == "runtime"
    assert events_since(world.space, before) == [
        ("member.updated", "w1", None, fields, "user:owner"), ("member.schedule_set", "w1", None, (), "user:owner"),
        ("member.permission_mode", "w1", None, (), "user:owner")]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("data, field, fragment", [
    ({"persona": "p" * 50001}, "persona", "50000"),
    ({"model": "gpt"}, "model", "must be 'offline'"),
    ({"max_iterations": 0}, "max_iterations", "from 1 to 200"),
    ({"budget_override": "lots"}, "budget_override", "integer"),
    ({"tools": ["teleport"]}, "tools", "unknown tool"),
    ({"schedule": "whenever"}, "schedule", ""),
    ({"permission_mode": "yolo"}, "permission_mode", "one of"),
])
def test_a_bad_member_edit_is_refused_by_name_and_changes_nothing(world, door, data, field, fragment):
    w1 = supervisor.get_member(world.space, "w1")
    before, row = seq(world.space), config(w1)
    response = member_move(world, door, "w1", **({**_initial_form(w1), **data} if door == "console" else data))
    assert response.status_code == 400
    if door == "api":
        assert response.json()["field"] == field and fragment in response.json()["error"]
    else:
        assert f"{field}: " in response.content.decode()
    assert config(w1) == row and seq(world.space) == before


def _initial_form(member: Member) -> dict:
    """What the console's edit form posts when nothing is changed."""
    from veronica.web.views_cockpit import _initial

    return _initial(member, member.space)


def test_saving_the_console_form_unchanged_writes_nothing(world):
    w1 = supervisor.get_member(world.space, "w1")
    before = seq(world.space)
    assert world.client(world.owner).post(f"{PAGES}/members/w1/edit/", _initial_form(w1)).status_code == 302
    w1.refresh_from_db()
    assert seq(world.space) == before and w1.runtime_fields == []


@pytest.mark.parametrize("door", DOORS)
def test_operators_and_viewers_cannot_create_or_edit_members(world, door):
    before = seq(world.space)
    for user in (world.operator, world.viewer):
        assert member_move(world, door, None, user=user, name="w9").status_code == 403
        assert member_move(world, door, "w1", user=user, persona="x").status_code == 403
    assert seq(world.space) == before and supervisor.get_member(world.space, "w1").persona == ""


# --- skills ------------------------------------------------------------------------------------------------

def skill_move(world, door: str, verb: str, member: str | None, user=None, **data):
    client = world.client(user or world.owner)
    base_api = f"{API}/members/{member}/skills/" if member else f"{API}/skills/"
    base_page = f"{PAGES}/members/{member}/edit/" if member else f"{PAGES}/skills/"
    if door == "api":
        if verb == "add":
            return call(client, "POST", base_api, data)
        return call(client, "DELETE", f"{base_api}{data['name']}/")
    form = {"action": "add_skill", **data} if verb == "add" else {"action": "remove_skill", "skill": data["name"]}
    return client.post(base_page, form)


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("member", [None, "w1"])
def test_owners_author_and_remove_shared_and_member_skills(world, door, member):
    before = seq(world.space)
    ok(door, skill_move(world, door, "add", member, name="triage", body="# Triage\nSort first.", description="how to sort"),
       created=True)
    skill = Skill.objects.get(space=world.space, name="triage")
    assert (skill.member.name if skill.member else None, skill.body, skill.description) == (member, "# Triage\nSort first.", "how to sort")
    assert skills.skills_for(supervisor.get_member(world.space, "w1"))[0].name == "triage"
    ok(door, skill_move(world, door, "remove", member, name="triage"))
    assert not Skill.objects.filter(name="triage").exists()
    assert [e[0] for e in events_since(world.space, before)] == ["skill.added", "skill.removed"]


@pytest.mark.parametrize("door", DOORS)
def test_operators_cannot_author_skills_and_a_duplicate_is_a_conflict(world, door):
    assert skill_move(world, door, "add", None, user=world.operator, name="x", body="y").status_code == 403
    skills.add_skill(world.space, "dup", "body")
    response = skill_move(world, door, "add", None, name="dup", body="other")
    assert response.status_code == 409 and Skill.objects.get(name="dup").body == "body"


# --- register keeps the console's and the API's edits; --fresh discards them ---------------------------------

@pytest.mark.parametrize("door", DOORS)
def test_runtime_edits_survive_register_and_fresh_discards_them(door, world, tmp_path, demo_manifest, settings):
    import shutil

    from veronica.swarm import access
    from veronica.portable.manifest import register

    folder = tmp_path / "team"
    shutil.copytree(demo_manifest, folder)
    space = register(folder, slug="alpha2")
    access.grant(space, "owner", "owner", actor="test")
    client = world.client(world.owner)
    edit = {"persona": "Edited persona.", "tools": ["read_file"], "max_iterations": 5}
    if door == "api":
        ok(door, call(client, "PATCH", "/api/spaces/alpha2/members/scout/", edit))
    else:
        scout = supervisor.get_member(space, "scout")
        ok(door, client.post("/spaces/alpha2/members/scout/edit/", {**_initial(scout), **_form(edit)}))
    register(folder, slug="alpha2")
    scout = supervisor.get_member(space, "scout")
    assert (scout.persona, scout.tools, scout.max_iterations) == ("Edited persona.", ["read_file"], 5)
    register(folder, fresh=True, slug="alpha2")
    scout = supervisor.get_member(space, "scout")
    assert scout.persona != "Edited persona." and scout.tools is None and scout.max_iterations == 24 and scout.runtime_fields == []


def _initial(member: Member) -> dict:
    return _initial_form(member)


# --- bad input through the new doors: never a 500, the field named, nothing written ---------------------------

NUL = "\x00"
BAD_BODIES = [
    ("POST", f"{API}/tasks/", {"title": f"x{NUL}"}, "title"),
    ("POST", f"{API}/tasks/", {"title": 5}, "title"),
    ("POST", f"{API}/tasks/", {"title": "x" * 201}, "title"),
    ("POST", f"{API}/tasks/", {"title": "x", "spec": ["a"]}, "spec"),
    ("POST", f"{API}/tasks/", {"title": "x", "spec": "s" * 20001}, "spec"),
    ("POST", f"{API}/tasks/", {"title": "x", "assignee": 7}, "assignee"),
    ("POST", f"{API}/tasks/", {"title": "x", "assignee": "n" * 61}, "assignee"),
    ("POST", f"{API}/tasks/", {"title": "x", "depends_on": [True]}, "depends_on"),
    ("POST", f"{API}/tasks/", {"title": "x", "depends_on": [2 ** 63]}, "depends_on"),
    ("POST", f"{API}/tasks/", {"title": "x", "depends_on": {"a": 1}}, "depends_on"),
    ("POST", f"{API}/tasks/", {"title": "x", "verify": ["auto"]}, "verify"),
    ("POST", f"{API}/tasks/{{task}}/cancel/", {"reason": "r" * 2001}, "reason"),
    ("POST", f"{API}/tasks/{{task}}/cancel/", {"reason": ["x"]}, "reason"),
    ("POST", f"{API}/tasks/{{task}}/assign/", {"assignee": ["w1"]}, "assignee"),
    ("POST", f"{API}/tasks/999999/assign/", {"assignee": "w1"}, "task_id"),
    ("PATCH", f"{API}/members/w1/", {"persona": 5}, "persona"),
    ("PATCH", f"{API}/members/w1/", {"role": "leader"}, "role"),
    ("PATCH", f"{API}/members/w1/", {"max_iterations": True}, "max_iterations"),
    ("PATCH", f"{API}/members/w1/", {"budget_override": 2 ** 40}, "budget_override"),
    ("PATCH", f"{API}/members/w1/", {"rule_domains": "conduct"}, "rule_domains"),
    ("PATCH", f"{API}/members/w1/", {"tools": ["read_file"] * 201}, "tools"),
    ("PATCH", f"{API}/members/w1/", {"tools": [f"read{NUL}"]}, "tools[0]"),
    ("PATCH", f"{API}/members/w1/", {"schedule": 5}, "schedule"),
    ("PATCH", f"{API}/members/ghost/", {"persona": "x"}, "member"),
    ("POST", f"{API}/members/", {"name": "w9", "tools": "read_file"}, "tools"),
    ("POST", f"{API}/members/", {"name": "w9", "max_iterations": 500}, "max_iterations"),
    ("POST", f"{API}/members/", {"name": "w9", "colour": "blue"}, "colour"),
    ("POST", f"{API}/skills/", {"name": "Bad Name", "body": "x"}, "name"),
    ("POST", f"{API}/skills/", {"name": "ok", "body": ""}, "body"),
    ("POST", f"{API}/skills/", {"name": "ok", "body": 5}, "body"),
    ("POST", f"{API}/members/w1/skills/", {"name": "ok", "body": "x", "description": "d" * 301}, "description"),
    ("DELETE", f"{API}/skills/ghost/", None, "name"),
    ("DELETE", f"{API}/members/w1/skills/ghost/", None, "name"),
]


@pytest.mark.parametrize("method, url, body, field", BAD_BODIES)
def test_bad_input_to_the_cockpit_api_is_a_4xx_naming_the_field_and_writes_nothing(world, method, url, body, field):
    from tests.bad_input import changed_tables, db_state

    url = url.format(task=ledger.create_task(world.space, "boss", "existing").pk)
    before = db_state()
    response = call(world.client(world.owner), method, url, body)
    assert 400 <= response.status_code < 500, response.content[:300]
    assert response.json().get("field") == field, response.json()
    assert not changed_tables(before, db_state())
