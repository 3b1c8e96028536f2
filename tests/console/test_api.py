"""The JSON API: what each endpoint returns and does, and bad input refused naming the field."""
import json

import pytest
from django.utils import timezone

from tests.console.helpers import call, open_question, pending_approval
from veronica.swarm import blackboard, bus, ledger, skills
from veronica.engine import budget, supervisor
from veronica.models import Member, MemoryFile, Message, Session, Space, SpaceAccess, Turn

API = "/api/spaces/alpha"


@pytest.fixture
def op(world):
    return world.client(world.operator)


def seq(space: Space) -> int:
    return Space.objects.get(pk=space.pk).event_seq


def test_space_detail_lists_the_roster_with_live_state_and_usage(world, op):
    w1 = supervisor.get_member(world.space, "w1")
    task = ledger.create_task(world.space, "boss", "index the repo")
    Member.objects.filter(pk=w1.pk).update(phase="executing", phase_tool="grep", phase_since=timezone.now(), current_task=task,
                                           run_status="busy", budget_override=5000)
    budget.meter(w1, input_tokens=120, output_tokens=30)
    body = op.get(f"{API}/").json()
    assert body["role"] == "operator" and body["slug"] == "alpha"
    row = {m["name"]: m for m in body["members"]}["w1"]
    assert row["display_phase"] == "executing:grep" and row["tool"] == "grep" and row["state"] == "executing"
    assert row["current_task"] == {"id": task.pk, "title": "index the repo", "status": task.status}
    assert row["tokens_today"] == 150 and row["budget"] == 5000 and row["run_status"] == "busy"
    assert row["phase_since"] and row["permission_mode"] == "bypass" and row["membership"] == "active"
    assert body["counts"]["tasks"]["ready"] == 1 and body["usage_today"]["tokens"] == 150


def test_operator_mail_reaches_a_member_a_role_and_all(world, op):
    assert call(op, "POST", f"{API}/messages/", {"to": "w1", "body": "hi w1"}).status_code == 201
    assert call(op, "POST", f"{API}/messages/", {"to": "leader", "body": "hi boss", "subject": "s"}).json()["messages"][0]["to"] == "boss"
    sent = call(op, "POST", f"{API}/messages/", {"to": "all", "body": "hi all"}).json()["messages"]
    assert sorted(m["to"] for m in sent) == ["boss", "w1", "w2"]
    assert set(Message.objects.values_list("sender_name", flat=True)) == {"operator"}


def test_messages_filter_by_member_and_page_by_id(world, op):
    for i in range(5):
        bus.send(world.space, "boss", "w1", f"m{i}")
    bus.send(world.space, "boss", "w2", "other")
    page = op.get(f"{API}/messages/?member=w1&limit=3").json()
    assert [m["body"] for m in page["messages"]] == ["m4", "m3", "m2"]
    rest = op.get(f"{API}/messages/?member=w1&limit=3&before={page['next_before']}").json()
    assert [m["body"] for m in rest["messages"]] == ["m1", "m0"] and rest["next_before"] is None
    assert op.get(f"{API}/messages/?member=ghost").json()["field"] == "member"


@pytest.mark.parametrize("body, field, fragment", [
    ("{not json", "json", "not valid JSON"),
    ("[1, 2]", "json", "JSON object"),
    ({"to": "w1"}, "body", "required"),
    ({"to": "w1", "body": "x" * 20001}, "body", "limit is 20000"),
    ({"to": "w1", "body": 5}, "body", "string"),
    ({"to": 7, "body": "x"}, "to", "string"),
    ({"to": "nobody", "body": "x"}, "to", "candidates"),
    ({"to": "operator", "body": "x"}, "to", "member"),
    ({"to": "w1", "body": "   "}, "body", "empty"),
    ({"to": "w1", "body": "x", "subject": "s" * 201}, "subject", "limit is 200"),
])
def test_bad_message_input_is_a_400_naming_the_field_and_writes_nothing(world, op, body, field, fragment):
    before = seq(world.space)
    data = body if isinstance(body, str) else json.dumps(body)
    response = op.generic("POST", f"{API}/messages/", data=data, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["field"] == field and fragment in response.json()["error"]
    assert Message.objects.count() == 0 and seq(world.space) == before


@pytest.mark.parametrize("method, path, body, field", [
    ("POST", "members/w1/permission/", {"mode": "yolo"}, "mode"),
    ("POST", "members/w1/permission/", {}, "mode"),
    ("POST", "members/w1/compact/", {"kind": "huge"}, "kind"),
    ("PUT", "members/w1/schedule/", {"cron": "every tuesday"}, "schedule"),
    ("PUT", "members/w1/schedule/", {"cron": ["*"]}, "cron"),
    ("POST", "members/w1/explode/", {}, "action"),
    ("PUT", "blackboard/", {"content": "x" * 8001}, "content"),
    ("PUT", "blackboard/", {"content": None}, "content"),
    ("POST", "approvals/999/approve/", {}, "approval_id"),
    ("POST", "questions/999/answer/", {"answer": "x"}, "question_id"),
])
def test_bad_control_input_names_the_field_and_changes_nothing(world, op, method, path, body, field):
    before = seq(world.space)
    response = call(op, method, f"{API}/{path}", body)
    assert response.status_code in (400, 404) and response.json()["field"] == field, response.json()
    assert seq(world.space) == before
    w1 = supervisor.get_member(world.space, "w1")
    assert w1.permission_mode == "bypass" and w1.schedule == ""


def test_oversize_blackboard_names_the_cap(world, op):
    error = call(op, "PUT", f"{API}/blackboard/", {"content": "x" * 8001}).json()["error"]
    assert "cap is 8000" in error and "1 over" in error


@pytest.mark.parametrize("query, field", [
    ("tasks/?status=sleeping", "status"), ("tasks/?limit=0", "limit"), ("tasks/?limit=abc", "limit"),
    ("tasks/?assignee=ghost", "assignee"), ("events/?after=-1", "after"), ("events/?after=x", "after"),
    ("events/?limit=5000", "limit"), ("messages/?limit=201", "limit"), ("approvals/?status=maybe", "status"),
    ("members/boss/transcript/?session=abc", "session"),
])
def test_bad_query_parameters_are_400_naming_the_parameter(world, op, query, field):
    response = op.get(f"{API}/{query}")
    assert response.status_code == 400 and response.json()["field"] == field


def test_tasks_filter_by_status_and_assignee(world, op):
    w1 = supervisor.get_member(world.space, "w1")
    ledger.create_task(world.space, "boss", "one", assignee=w1)
    ledger.create_task(world.space, "boss", "two", depends_on=[ledger.create_task(world.space, "boss", "three").pk])
    assert [t["title"] for t in op.get(f"{API}/tasks/?assignee=w1").json()["tasks"]] == ["one"]
    assert [t["title"] for t in op.get(f"{API}/tasks/?status=pending").json()["tasks"]] == ["two"]
    assert len(op.get(f"{API}/tasks/").json()["tasks"]) == 3


def test_events_after_a_seq_come_in_order(world, op):
    head = seq(world.space)
    blackboard.write(world.space, "boss", "a")
    blackboard.write(world.space, "boss", "b")
    body = op.get(f"{API}/events/?after={head}").json()
    assert [e["seq"] for e in body["events"]] == [head + 1, head + 2] and body["last_seq"] == head + 2
    assert body["events"][0]["kind"] == "blackboard.updated"
    limited = op.get(f"{API}/events/?after=0&limit=2").json()
    assert [e["seq"] for e in limited["events"]] == [1, 2] and limited["more"] is True


def test_blackboard_get_and_put(world, op):
    assert op.get(f"{API}/blackboard/").json()["content"] == ""
    body = call(op, "PUT", f"{API}/blackboard/", {"content": "# Plan\n\n**ship it**"}).json()
    assert body["updated_by"] == "user:operator" and "<strong>ship it</strong>" in body["html"]
    assert blackboard.read(world.space).content.startswith("# Plan")


def test_approvals_list_approve_and_deny_with_reason(world, op):
    a1, a2 = pending_approval(world.space), pending_approval(world.space, "w2", "run_command", cmd="rm -rf /")
    listed = op.get(f"{API}/approvals/").json()["approvals"]
    assert [a["id"] for a in listed] == [a1.pk, a2.pk] and listed[1]["args"] == {"cmd": "rm -rf /"}
    assert call(op, "POST", f"{API}/approvals/{a1.pk}/approve/", {}).json()["status"] == "approved"
    denied = call(op, "POST", f"{API}/approvals/{a2.pk}/deny/", {"reason": "never delete"}).json()
    assert denied["status"] == "denied" and denied["reason"] == "never delete" and denied["decided_by"] == "operator"
    again = call(op, "POST", f"{API}/approvals/{a2.pk}/approve/", {})
    assert again.status_code == 409 and again.json()["field"] == "approval_id"
    assert op.get(f"{API}/approvals/").json()["approvals"] == []
    assert len(op.get(f"{API}/approvals/?status=any").json()["approvals"]) == 2


def test_questions_are_answered_once(world, op):
    q = open_question(world.space)
    assert [x["id"] for x in op.get(f"{API}/questions/").json()["questions"]] == [q.pk]
    assert call(op, "POST", f"{API}/questions/{q.pk}/answer/", {"answer": "main"}).json()["answer"] == "main"
    assert call(op, "POST", f"{API}/questions/{q.pk}/answer/", {"answer": "dev"}).status_code == 409
    assert call(op, "POST", f"{API}/questions/{q.pk}/answer/", {}).json()["field"] == "answer"


def test_member_controls_call_the_verbs(world, op):
    m = f"{API}/members/w1"
    assert call(op, "POST", f"{m}/suspend/").json()["display_phase"] == "suspended"
    assert call(op, "POST", f"{m}/resume/").json()["run_status"] == "idle"
    assert call(op, "POST", f"{m}/freeze/").json()["display_phase"] == "frozen"
    assert call(op, "POST", f"{m}/unfreeze/").json()["membership"] == "active"
    assert call(op, "POST", f"{m}/permission/", {"mode": "default"}).json()["permission_mode"] == "default"
    schedule = call(op, "PUT", f"{m}/schedule/", {"cron": "*/5 * * * *"}).json()
    assert schedule["cron"] == "*/5 * * * *" and schedule["origin"] == "runtime" and schedule["next_at"]
    assert call(op, "DELETE", f"{m}/schedule/").json()["tombstone"] is True
    Session.objects.create(member=supervisor.get_member(world.space, "w1"))
    assert call(op, "POST", f"{m}/clear/").status_code == 200
    assert not Session.objects.filter(ended_at__isnull=True).exists()
    kinds = set(world.space.events.values_list("kind", flat=True))
    assert {"member.suspended", "member.resumed", "member.frozen", "member.permission_mode", "member.schedule_cleared"} <= kinds
    assert call(op, "POST", f"{API}/halt/").json()["suspended"] == 3


def test_busy_members_refuse_clear_and_compact_with_409(world, op):
    Member.objects.filter(space=world.space, name="w1").update(run_status="busy", lease_token="abc")
    for action, body in (("clear", {}), ("compact", {"kind": "micro"})):
        response = call(op, "POST", f"{API}/members/w1/{action}/", body)
        assert response.status_code == 409 and response.json()["field"] == "member"


def test_member_detail_transcript_skills_and_memory(world, op):
    w1 = supervisor.get_member(world.space, "w1")
    session = Session.objects.create(member=w1)
    for i, (role, text) in enumerate([("user", "wake brief"), ("assistant", "**on it**"), ("tool", "file list")]):
        Turn.objects.create(session=session, seq=i + 1, role=role, content=text)
    skills.add_skill(world.space, "review", "# Review\nbe kind", member=w1)
    skills.add_skill(world.space, "style", "shared style")
    MemoryFile.objects.create(member=w1, name="MEMORY.md", content="- learned *x*")
    detail = op.get(f"{API}/members/w1/").json()
    assert [s["name"] for s in detail["skills"]] == ["review", "style"] and detail["memory"][0]["name"] == "MEMORY.md"
    transcript = op.get(f"{API}/members/w1/transcript/").json()
    assert transcript["session"]["id"] == session.pk and [t["role"] for t in transcript["turns"]] == ["user", "assistant", "tool"]
    assert "<strong>on it</strong>" in transcript["turns"][1]["html"]
    assert [t["seq"] for t in op.get(f"{API}/members/w1/transcript/?after=2").json()["turns"]] == [3]
    assert op.get(f"{API}/members/w1/transcript/?session=9999").status_code == 404
    assert op.get(f"{API}/members/w1/skills/").json()["skills"][0]["scope"] == "member"
    assert "<em>x</em>" in op.get(f"{API}/members/w1/memory/").json()["memory"][0]["html"]
    assert op.get(f"{API}/members/w1/schedule/").json()["cron"] == ""


def test_owner_adds_and_removes_members_and_grants_access(world):
    owner = world.client(world.owner)
    created = call(owner, "POST", f"{API}/members/", {"name": "w3", "persona": "helps"})
    assert created.status_code == 201 and created.json()["name"] == "w3"
    assert call(owner, "POST", f"{API}/members/", {"name": "w3"}).status_code == 409
    assert call(owner, "POST", f"{API}/members/", {"name": "all"}).json()["field"] == "name"
    assert call(owner, "POST", f"{API}/members/", {"name": "w4", "role": "king"}).json()["field"] == "role"
    assert call(owner, "DELETE", f"{API}/members/w3/").json()["removed_at"]
    assert call(owner, "DELETE", f"{API}/members/boss/").status_code == 409
    assert call(owner, "POST", f"{API}/access/", {"username": "stranger", "role": "viewer"}).status_code == 201
    assert world.client(world.stranger).get(f"{API}/").status_code == 200
    assert call(owner, "POST", f"{API}/access/", {"username": "stranger", "role": "god"}).json()["field"] == "role"
    assert call(owner, "POST", f"{API}/access/", {"username": "nobody", "role": "viewer"}).json()["field"] == "username"
    assert call(owner, "DELETE", f"{API}/access/stranger/").status_code == 200
    assert world.client(world.stranger).get(f"{API}/").status_code == 404
    last = call(owner, "DELETE", f"{API}/access/owner/")
    assert last.status_code == 409 and "last owner" in last.json()["error"]
    assert SpaceAccess.objects.filter(space=world.space, user=world.owner).exists()


def test_owner_manage_page_forms(world):
    owner = world.client(world.owner)
    response = owner.post("/spaces/alpha/manage/", {"action": "grant", "username": "stranger", "role": "operator"}, follow=True)
    assert b"stranger is now operator" in response.content
    response = owner.post("/spaces/alpha/manage/", {"action": "add_member", "name": "helper", "role": "worker"}, follow=True)
    assert b"added member helper" in response.content
    response = owner.post("/spaces/alpha/manage/", {"action": "remove_member", "name": "boss"}, follow=True)
    assert b"leader cannot be removed" in response.content


def test_wrong_method_is_405(world, op):
    response = call(op, "DELETE", f"{API}/tasks/")
    assert response.status_code == 405 and "GET" in response["Allow"]


def test_usage_and_spaces(world, op):
    supervisor.get_member(world.space, "w1")
    usage = op.get(f"{API}/usage/").json()
    assert {m["name"] for m in usage["members"]} == {"boss", "w1", "w2"}
    spaces = op.get("/api/spaces/").json()["spaces"]
    assert spaces == [{"slug": "alpha", "name": "Alpha", "description": "", "role": "operator", "event_seq": seq(world.space),
                       "members": 3, "open_tasks": 0, "open_tasks_more": False, "pending_approvals": 0}]
    assert op.get("/api/me/").json() == {"username": "operator", "is_staff": False, "token": False}


def test_compaction_runs_through_the_api(world, op):
    w1 = supervisor.get_member(world.space, "w1")
    session = Session.objects.create(member=w1)
    for i in range(10):
        Turn.objects.create(session=session, seq=i + 1, role="tool", content=f"output {i}", tool_name="grep")
    body = call(op, "POST", f"{API}/members/w1/compact/", {"kind": "micro"}).json()
    assert body["result"]["mode"] == "micro" and body["result"]["elided"] == 4
    assert Turn.objects.filter(session=session, elided=True).count() == 4


def test_tool_calls_of_any_provider_shape_render_in_the_transcript(world, op):
    w1 = supervisor.get_member(world.space, "w1")
    session = Session.objects.create(member=w1)
    Turn.objects.create(session=session, seq=1, role="assistant", content="",
                        tool_calls=[{"id": "a", "name": "grep", "args": {"pattern": "TODO"}},
                                    {"id": "b", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "x"}'}}])
    turn = op.get(f"{API}/members/w1/transcript/").json()["turns"][0]
    assert turn["calls"] == [{"name": "grep", "args_text": '{"pattern": "TODO"}'}, {"name": "read_file", "args_text": '{"path": "x"}'}]
    page = op.get("/spaces/alpha/members/w1/panels/transcript/").content.decode()
    assert "grep" in page and "read_file" in page


def test_hot_reads_take_the_same_number_of_queries_for_3_or_12_members(world, op):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def counts() -> list[int]:
        out = []
        for url in (f"{API}/", "/spaces/alpha/panels/roster/", "/spaces/alpha/panels/tasks/", "/spaces/alpha/", "/api/spaces/"):
            with CaptureQueriesContext(connection) as ctx:
                assert op.get(url).status_code == 200
            out.append(len(ctx.captured_queries))
        return out

    w1 = supervisor.get_member(world.space, "w1")
    ledger.create_task(world.space, "boss", "t0", assignee=w1)
    few = counts()
    for i in range(9):
        member = supervisor.add_member(world.space, f"extra{i}", actor="t")
        budget.meter(member, input_tokens=10, output_tokens=1)
        ledger.create_task(world.space, "boss", f"t{i + 1}", assignee=member)
    assert counts() == few
    # auth/session + access + the reads themselves; pinned as ceilings so a new N+1 shows up
    assert all(n <= limit for n, limit in zip(few, [12, 7, 7, 18, 5])), few


def test_the_api_index_lists_the_endpoints(world, op):
    assert any("/events/?after=" in e for e in op.get("/api/").json()["endpoints"])
    assert world.client(None).get("/api/").status_code == 401
