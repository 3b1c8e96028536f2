"""current_task follows the ledger (running sets it, leaving running clears it); the roster, the
member view and list_members show it, with the open session's usage and last-turn input tokens."""
import pytest
from django.contrib.auth.models import User

from veronica.swarm import access, bus
from veronica.agent.tools import ToolContext, tools_for
from veronica.engine import supervisor
from veronica.engine.drive import run_until_quiet
from veronica.models import Member, Task

API = "/api/spaces/alpha"


def tool(space, member_name, name, **args) -> str:
    """The tool as a run calls it (run_tool turns errors into text the model reads)."""
    from veronica.agent.loop import run_tool

    member = supervisor.get_member(space, member_name)
    return run_tool(tools_for(member.role)[name], ToolContext(member=member, space=space), args)


@pytest.fixture
def op(client, space):
    user = User.objects.create_user("op")
    access.grant(space, "op", "operator", actor="test")
    client.force_login(user)
    return client


def test_a_dispatched_task_is_the_members_current_task_until_it_is_done(space, op):
    out = tool(space, "boss", "task_create", title="index the repo", assignee="w1")
    task = Task.objects.get(space=space, title="index the repo")
    assert task.status == "running", out
    assert Member.objects.get(pk=task.assignee_id).current_task_id == task.pk
    row = {m["name"]: m for m in op.get(f"{API}/").json()["members"]}["w1"]
    assert row["current_task"] == {"id": task.pk, "title": "index the repo", "status": "running"}
    assert f"#{task.pk} index the repo" in op.get("/spaces/alpha/panels/roster/").content.decode()
    assert f"w1 (worker, active, ready) on task #{task.pk} (index the repo)" in tool(space, "boss", "list_members")
    tool(space, "w1", "task_done", task_id=task.pk, result="indexed")
    assert Member.objects.get(pk=task.assignee_id).current_task_id is None
    assert {m["name"]: m for m in op.get(f"{API}/").json()["members"]}["w1"]["current_task"] is None


def test_member_view_shows_session_usage_and_last_turn_input(space, op):
    bus.send(space, bus.OPERATOR, "w1", "Please list the workspace.")
    run_until_quiet(space, timeout=60)
    body = op.get(f"{API}/members/w1/").json()
    assert body["session_tokens"] > 0 and 0 < body["last_turn_input"] <= body["session_tokens"]
    roster = {m["name"]: m for m in op.get(f"{API}/").json()["members"]}["w1"]
    assert (roster["session_tokens"], roster["last_turn_input"]) == (body["session_tokens"], body["last_turn_input"])
    html = op.get("/spaces/alpha/members/w1/panels/header/").content.decode()
    assert f"{body['session_tokens']} tokens · last turn input {body['last_turn_input']}" in html
    assert f"session {body['session_tokens']} (last turn input {body['last_turn_input']})" in tool(space, "boss", "list_members")
    supervisor.clear_session(supervisor.get_member(space, "w1"), actor="test")
    assert op.get(f"{API}/members/w1/").json()["session_tokens"] == 0
