"""The cockpit's API calls (issue 22.3, 22.4, 22.6), per role: viewers read, operators steer, owners
manage; bad input is a 400 naming the field; each call is the verb the console page calls."""
from __future__ import annotations

import pytest

from tests.console.helpers import call
from veronica.swarm import bus, chat
from veronica.engine import budget, supervisor
from veronica.models import Event, Member, Message, Space, UsageDay

API = "/api/spaces/alpha"


def kinds(space: Space, kind: str) -> list[dict]:
    return [e.payload for e in Event.objects.filter(space=space, kind=kind).order_by("seq")]


# --- 22.3 the member's chat ----------------------------------------------------------------------------

def test_the_chat_thread_holds_the_operators_mail_and_the_members_replies_only(world):
    w1 = supervisor.get_member(world.space, "w1")
    asked = bus.send(world.space, bus.OPERATOR, "w1", "status?")[0]
    bus.send(world.space, "boss", "w1", "not the operator's")
    bus.send(world.space, bus.OPERATOR, "w2", "not w1's")
    Message.objects.create(space=world.space, sender=w1, sender_name="w1", recipient_name="operator", body="all fine", reply_to=asked)
    body = world.client(world.viewer).get(f"{API}/members/w1/chat/").json()
    assert [(m["sender"], m["body"], m["reply_to"]) for m in body["messages"]] == [
        ("operator", "status?", None), ("w1", "all fine", asked.pk)]


@pytest.mark.parametrize("role,status", [("viewer", 403), ("operator", 201), ("owner", 201)])
def test_writing_to_a_member_from_its_chat_needs_the_operator_role(world, role, status):
    response = call(world.client(getattr(world, role)), "POST", f"{API}/members/w1/chat/", {"body": "hello"})
    assert response.status_code == status
    assert Message.objects.filter(recipient__name="w1", body="hello").count() == (status == 201)


def test_the_chat_refuses_bad_input_naming_the_field(world):
    op = world.client(world.operator)
    assert call(op, "POST", f"{API}/members/w1/chat/", {"body": ""}).json()["field"] == "body"
    assert call(op, "POST", f"{API}/members/w1/chat/", {"body": "x" * 20001}).json()["field"] == "body"
    assert call(op, "POST", f"{API}/members/nobody/chat/", {"body": "x"}).status_code == 404
    assert world.client(world.stranger).get(f"{API}/members/w1/chat/").status_code == 404
    assert not Message.objects.exists()


# --- 22.4 resume all, rename ------------------------------------------------------------------------------

@pytest.mark.parametrize("role,status", [("viewer", 403), ("operator", 200), ("owner", 200)])
def test_resume_all_undoes_halt_all_for_operators(world, role, status):
    supervisor.halt_all(world.space, actor="test")
    response = call(world.client(getattr(world, role)), "POST", f"{API}/resume/")
    assert response.status_code == status
    suspended = Member.objects.filter(space=world.space, run_status="suspended").count()
    if status == 200:
        assert response.json() == {"resumed": 3} and suspended == 0
        assert sorted(p["member_name"] for p in kinds(world.space, "member.resumed")) == ["boss", "w1", "w2"]
    else:
        assert suspended == 3


@pytest.mark.parametrize("role,status", [("viewer", 403), ("operator", 403), ("owner", 200)])
def test_renaming_a_space_is_for_owners_and_emits_an_event(world, role, status):
    response = call(world.client(getattr(world, role)), "PUT", f"{API}/name/", {"name": "  Alpha Team  "})
    assert response.status_code == status
    space = Space.objects.get(pk=world.space.pk)
    if status == 200:
        assert response.json()["name"] == "Alpha Team" and space.name == "Alpha Team" and space.slug == "alpha"
        assert kinds(world.space, "space.renamed") == [{"actor": "user:owner", "before": "Alpha", "name": "Alpha Team"}]
    else:
        assert space.name == "Alpha" and not kinds(world.space, "space.renamed")


@pytest.mark.parametrize("body,field", [({}, "name"), ({"name": " "}, "name"), ({"name": "x" * 121}, "name"), ({"name": 3}, "name")])
def test_a_bad_space_name_is_refused_naming_the_field(world, body, field):
    response = call(world.client(world.owner), "PUT", f"{API}/name/", body)
    assert (response.status_code, response.json()["field"]) == (400, field)
    assert Space.objects.get(pk=world.space.pk).name == "Alpha"


# --- 22.6 budgets reopen the day ----------------------------------------------------------------------------

def trip(member: Member, tokens: int = 500) -> None:
    budget.meter(member, input_tokens=tokens, output_tokens=0)
    assert budget.check_breaker(member) is not None and budget.is_tripped(member)


def test_the_trip_notice_says_how_to_reopen_the_day(world):
    w1 = supervisor.get_member(world.space, "w1")
    Member.objects.filter(pk=w1.pk).update(budget_override=100)
    trip(Member.objects.get(pk=w1.pk))
    notice = Message.objects.get(recipient_name="operator", subject="Budget tripped: w1").body
    assert "raise its budget" in notice and "reset its day" in notice and "/api/spaces/alpha/members/w1/budget/reset/" in notice


@pytest.mark.parametrize("role,status", [("viewer", 403), ("operator", 403), ("owner", 200)])
def test_raising_a_members_budget_reopens_its_day_for_owners(world, role, status):
    Member.objects.filter(space=world.space, name="w1").update(budget_override=100)
    trip(supervisor.get_member(world.space, "w1"))
    response = call(world.client(getattr(world, role)), "PUT", f"{API}/members/w1/budget/", {"budget_override": 1000})
    assert response.status_code == status
    w1 = supervisor.get_member(world.space, "w1")
    if status == 200:
        assert response.json()["tripped"] is False and w1.budget_override == 1000 and not budget.is_tripped(w1)
        assert [p["actor"] for p in kinds(world.space, "budget.reopened")] == [f"user:{role}"]
    else:
        assert budget.is_tripped(w1) and w1.budget_override == 100


def test_a_budget_still_below_the_days_use_does_not_reopen(world):
    Member.objects.filter(space=world.space, name="w1").update(budget_override=100)
    trip(supervisor.get_member(world.space, "w1"))
    body = call(world.client(world.owner), "PUT", f"{API}/members/w1/budget/", {"budget_override": 200}).json()
    assert body["tripped"] is True and "its daily budget is 200" in body["blocked_by"]
    assert not kinds(world.space, "budget.reopened")


def test_an_owners_reset_reopens_the_day_and_the_budget_counts_from_there(world):
    Member.objects.filter(space=world.space, name="w1").update(budget_override=100)
    w1 = supervisor.get_member(world.space, "w1")
    trip(w1)
    body = call(world.client(world.owner), "POST", f"{API}/members/w1/budget/reset/").json()
    assert body["tripped"] is False and body["tokens_today"] == 500 and body["counted_since_reset"] == 0
    assert [e for e in kinds(world.space, "budget.reset")] == [{"member_name": "w1", "actor": "user:owner", "offset": 500}]
    budget.meter(w1, input_tokens=60, output_tokens=0)
    assert budget.check_breaker(w1) is None, "the reset day counts from the reset"
    budget.meter(w1, input_tokens=60, output_tokens=0)
    assert "used 120 tokens" in budget.check_breaker(w1)


def test_a_reset_cannot_lift_the_spaces_ceiling_and_says_so(world):
    Space.objects.filter(pk=world.space.pk).update(daily_token_ceiling=300)
    trip(supervisor.get_member(world.space, "w1"))
    response = call(world.client(world.owner), "POST", f"{API}/members/w1/budget/reset/")
    assert response.status_code == 409 and "raise the space's ceiling" in response.json()["error"]
    assert budget.is_tripped(supervisor.get_member(world.space, "w1"))
    assert UsageDay.objects.get(member__name="w1").budget_offset == 0, "a refused reset leaves nothing half-written"


def test_raising_the_space_ceiling_reopens_every_member_it_allows(world):
    Space.objects.filter(pk=world.space.pk).update(daily_token_ceiling=300)
    trip(supervisor.get_member(world.space, "w1"))
    trip(supervisor.get_member(world.space, "w2"), tokens=10)
    op, owner = world.client(world.operator), world.client(world.owner)
    assert call(op, "PUT", f"{API}/budget/", {"daily_token_ceiling": 0}).status_code == 403
    body = call(owner, "PUT", f"{API}/budget/", {"daily_token_ceiling": 2000}).json()
    assert sorted(body["reopened"]) == ["w1", "w2"] and body["daily_token_ceiling"] == "2000"
    assert len(kinds(world.space, "budget.reopened")) == 2 and len(kinds(world.space, "space.budget_set")) == 1


@pytest.mark.parametrize("url,body,field", [
    ("/members/w1/budget/", {}, "budget_override"),
    ("/members/w1/budget/", {"budget_override": "lots"}, "budget_override"),
    ("/members/w1/budget/", {"budget_override": 2**40}, "budget_override"),
    ("/budget/", {"daily_token_ceiling": -1}, "daily_token_ceiling"),
    ("/budget/", {"daily_usd_ceiling": "NaN"}, "daily_usd_ceiling"),
    ("/budget/", {"daily_usd_ceiling": 10**7}, "daily_usd_ceiling"),
    ("/budget/", {"ceiling": 1}, "ceiling"),
])
def test_bad_budget_input_is_refused_naming_the_field(world, url, body, field):
    response = call(world.client(world.owner), "PUT", API + url, body)
    assert (response.status_code, response.json()["field"]) == (400, field)
    assert not kinds(world.space, "space.budget_set") and not kinds(world.space, "member.budget_set")


def test_chat_thread_selector_pages_backwards(world):
    for i in range(5):
        bus.send(world.space, bus.OPERATOR, "w1", f"m{i}")
    page = chat.conversation(supervisor.get_member(world.space, "w1"), limit=2)
    assert [m["body"] for m in page["messages"]] == ["m3", "m4"] and page["next_before"]


# --- 22.5 the prompt inspector ------------------------------------------------------------------------------

@pytest.mark.parametrize("role", ["viewer", "operator", "owner"])
def test_every_role_may_inspect_the_prompt_and_a_stranger_may_not(world, role):
    Member.objects.filter(space=world.space, name="w1").update(persona="Inspect me.")
    body = world.client(getattr(world, role)).get(f"{API}/members/w1/prompt/").json()
    assert body["system_parts"][0] == {"part": "persona", "text": "Inspect me."} and body["call"] == "next"
    assert world.client(world.stranger).get(f"{API}/members/w1/prompt/").status_code == 404
    page = world.client(getattr(world, role)).get("/spaces/alpha/members/w1/prompt/")
    assert page.status_code == 200 and "Inspect me." in page.content.decode()


@pytest.mark.parametrize("query,status,field", [("?call=x", 400, "call"), ("?call=0", 400, "call"), ("?call=99999", 404, "call"),
                                                ("?call=99999999999999999999", 400, "call")])
def test_a_bad_call_is_refused_naming_the_field(world, query, status, field):
    response = world.client(world.viewer).get(f"{API}/members/w1/prompt/{query}")
    assert (response.status_code, response.json()["field"]) == (status, field)
    assert world.client(world.viewer).get(f"/spaces/alpha/members/w1/prompt/{query}").status_code in (400, 404)


# --- 22.7 approvals: always for this tool on this member ---------------------------------------------------

@pytest.mark.parametrize("role,status", [("viewer", 403), ("operator", 200), ("owner", 200)])
def test_approve_always_adds_a_rule_for_operators(world, role, status):
    from tests.console.helpers import pending_approval
    from veronica.models import ApprovalRule

    held = pending_approval(world.space, tool="write_file")
    response = call(world.client(getattr(world, role)), "POST", f"{API}/approvals/{held.pk}/approve/", {"always": True})
    assert response.status_code == status
    assert ApprovalRule.objects.filter(member__name="w1", tool_name="write_file").count() == (status == 200)
    rules = world.client(world.viewer).get(f"{API}/approval-rules/").json()["rules"]
    assert [(r["member"], r["tool"]) for r in rules] == ([("w1", "write_file")] if status == 200 else [])


@pytest.mark.parametrize("role,status", [("viewer", 403), ("operator", 200), ("owner", 200)])
def test_revoking_a_rule_is_for_operators_and_owners_and_it_stays_listed_as_revoked(world, role, status):
    from veronica.engine import approvals

    rule = approvals.allow_always(supervisor.get_member(world.space, "w1"), "write_file", user=world.operator)
    response = call(world.client(getattr(world, role)), "DELETE", f"{API}/approval-rules/{rule.pk}/")
    assert response.status_code == status
    live = world.client(world.viewer).get(f"{API}/approval-rules/").json()["rules"]
    every = world.client(world.viewer).get(f"{API}/approval-rules/?all=1").json()["rules"]
    assert len(live) == (status != 200) and len(every) == 1
    if status == 200:
        assert every[0]["revoked_by"] == role
        assert call(world.client(world.owner), "DELETE", f"{API}/approval-rules/{rule.pk}/").status_code == 409
    assert world.client(world.stranger).get(f"{API}/approval-rules/").status_code == 404


@pytest.mark.parametrize("body,field", [({"always": "yes"}, "always"), ({"member": "w1"}, "tool"), ({"tool": "x"}, "member"),
                                        ({"member": "nobody", "tool": "x"}, "member")])
def test_bad_approval_rule_input_is_refused_naming_the_field(world, body, field):
    from tests.console.helpers import pending_approval

    op = world.client(world.operator)
    if "always" in body:
        response = call(op, "POST", f"{API}/approvals/{pending_approval(world.space).pk}/approve/", body)
    else:
        response = call(op, "POST", f"{API}/approval-rules/", body)
    assert response.status_code in (400, 404) and response.json()["field"] == field


def test_the_space_and_member_pages_show_the_rules_with_revoke_for_operators_only(world):
    from veronica.engine import approvals

    approvals.allow_always(supervisor.get_member(world.space, "w1"), "write_file", user=world.operator)
    for url in ("/spaces/alpha/", "/spaces/alpha/members/w1/"):
        op_page = world.client(world.operator).get(url).content.decode()
        viewer_page = world.client(world.viewer).get(url).content.decode()
        assert "data-approval-rule=" in op_page and "Revoke" in op_page
        assert "data-approval-rule=" in viewer_page and "/approval-rules/" not in viewer_page
