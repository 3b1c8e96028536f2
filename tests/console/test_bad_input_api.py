"""Bad input over HTTP is never a 500: every case is a 4xx naming the field and writes nothing.

API endpoints (JSON bodies, query parameters, URL parts), the console's forms (posted with a real
CSRF token) and the admin's add forms. The same battery runs on SQLite and PostgreSQL.
"""
from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from tests.bad_input import NUL, SURROGATE, changed_tables, db_state
from tests.console.helpers import open_question, pending_approval

API = "/api/spaces/alpha"
M = f"{API}/members/w1"
LONG_MODEL = "openai:" + "m" * 200


def _deep(levels: int) -> str:
    return '{"to": "boss", "body": "x", "extra": ' + "[" * levels + "]" * levels + "}"


# (method, url, body, field): body is an object (sent as JSON), a str or bytes (sent raw)
BODY_CASES = [
    # the body as a whole
    ("POST", f"{API}/messages/", "[]", "json"),
    ("POST", f"{API}/messages/", "1", "json"),
    ("POST", f"{API}/messages/", '"hello"', "json"),
    ("POST", f"{API}/messages/", "null", "json"),
    ("POST", f"{API}/messages/", "{", "json"),
    ("POST", f"{API}/messages/", "[" * 100_000, "json"),
    ("POST", f"{API}/messages/", '{"a": ' * 100_000 + "1" + "}" * 100_000, "json"),
    ("POST", f"{API}/messages/", _deep(40), "json"),
    ("POST", f"{API}/messages/", _deep(3000), "json"),
    ("PUT", f"{API}/blackboard/", "[" * 100_000 + "]" * 100_000, "json"),
    ("POST", f"{API}/messages/", '{"to": "boss", "body": NaN}', "json"),
    ("POST", f"{API}/messages/", '{"to": "boss", "body": Infinity}', "json"),
    ("POST", f"{API}/messages/", b'{"to": "boss", "body": "\xff\xfe"}', "json"),
    ("POST", f"{API}/messages/", '{"to": "boss", "body": ' + "9" * 5000 + "}", "json"),
    ("POST", f"{API}/messages/", '{"to": "boss", "bo\\u0000dy": "x"}', "json"),
    # messages
    ("POST", f"{API}/messages/", {"to": "boss", "body": f"hi{NUL}there"}, "body"),
    ("POST", f"{API}/messages/", {"to": "boss", "body": f"hi{SURROGATE}"}, "body"),
    ("POST", f"{API}/messages/", {"to": f"bo{NUL}ss", "body": "hi"}, "to"),
    ("POST", f"{API}/messages/", {"to": f"{SURROGATE}", "body": "hi"}, "to"),
    ("POST", f"{API}/messages/", {"to": "boss", "body": "hi", "subject": NUL}, "subject"),
    ("POST", f"{API}/messages/", {"to": "boss", "body": "x" * 20001}, "body"),
    ("POST", f"{API}/messages/", {"to": "boss", "body": "hi", "subject": "s" * 201}, "subject"),
    ("POST", f"{API}/messages/", {"to": ["boss"], "body": "hi"}, "to"),
    ("POST", f"{API}/messages/", {"to": "boss", "body": {"x": NUL}}, "body.x"),
    # members (owner)
    ("POST", f"{API}/members/", {"name": f"w{NUL}9"}, "name"),
    ("POST", f"{API}/members/", {"name": f"w9{SURROGATE}"}, "name"),
    ("POST", f"{API}/members/", {"name": "operator"}, "name"),
    ("POST", f"{API}/members/", {"name": "all"}, "name"),
    ("POST", f"{API}/members/", {"name": "System"}, "name"),
    ("POST", f"{API}/members/", {"name": "<b>x</b>"}, "name"),
    ("POST", f"{API}/members/", {"name": "-lead"}, "name"),
    ("POST", f"{API}/members/", {"name": "n" * 61}, "name"),
    ("POST", f"{API}/members/", {"name": ""}, "name"),
    ("POST", f"{API}/members/", {"name": 7}, "name"),
    ("POST", f"{API}/members/", {"name": "w9", "persona": f"be{NUL}good"}, "persona"),
    ("POST", f"{API}/members/", {"name": "w9", "persona": "p" * 50001}, "persona"),
    ("POST", f"{API}/members/", {"name": "w9", "when_to_use": NUL}, "when_to_use"),
    ("POST", f"{API}/members/", {"name": "w9", "when_to_use": "u" * 2001}, "when_to_use"),
    ("POST", f"{API}/members/", {"name": "w9", "model": f"offline{NUL}"}, "model"),
    ("POST", f"{API}/members/", {"name": "w9", "model": LONG_MODEL}, "model"),
    ("POST", f"{API}/members/", {"name": "w9", "model": "gpt"}, "model"),
    ("POST", f"{API}/members/", {"name": "w9", "schedule": "0 0 30 2 *"}, "schedule"),
    ("POST", f"{API}/members/", {"name": "w9", "schedule": "* * * * * *"}, "schedule"),
    ("POST", f"{API}/members/", {"name": "w9", "schedule": "0 0 1 1 * 2030"}, "schedule"),
    ("POST", f"{API}/members/", {"name": "w9", "schedule": f"* * * * *{NUL}"}, "schedule"),
    ("POST", f"{API}/members/", {"name": "w9", "schedule": "* " * 100}, "schedule"),
    ("POST", f"{API}/members/", {"name": "w9", "rule_domains": [f"a{NUL}"]}, "rule_domains[0]"),
    ("POST", f"{API}/members/", {"name": "w9", "rule_domains": ["d" * 65]}, "rule_domains"),
    ("POST", f"{API}/members/", {"name": "w9", "rule_domains": [1]}, "rule_domains"),
    ("POST", f"{API}/members/", {"name": "w9", "rule_domains": "conduct"}, "rule_domains"),
    ("POST", f"{API}/members/", {"name": "w9", "role": f"worker{NUL}"}, "role"),
    ("POST", f"{API}/members/", {"name": "w9", "role": "king"}, "role"),
    ("POST", f"{API}/members/", {"name": "w9", "permission_mode": NUL}, "permission_mode"),
    ("POST", f"{API}/members/", {"name": "w9", "permission_mode": "yolo"}, "permission_mode"),
    # schedule
    ("PUT", f"{M}/schedule/", {"cron": "0 0 30 2 *"}, "schedule"),
    ("PUT", f"{M}/schedule/", {"cron": "0 0 31 4 *"}, "schedule"),
    ("PUT", f"{M}/schedule/", {"cron": "*/5 * * * * *"}, "schedule"),
    ("PUT", f"{M}/schedule/", {"cron": "0 0 1 1 * 2099 5"}, "schedule"),
    ("PUT", f"{M}/schedule/", {"cron": "@hourly"}, "schedule"),
    ("PUT", f"{M}/schedule/", {"cron": f"*/5 * * * *{NUL}"}, "cron"),
    ("PUT", f"{M}/schedule/", {"cron": f"*/5 * * * {SURROGATE}"}, "cron"),
    ("PUT", f"{M}/schedule/", {"cron": "1," * 100 + " * * * *"}, "schedule"),
    ("PUT", f"{M}/schedule/", {"cron": ""}, "schedule"),
    ("PUT", f"{M}/schedule/", {"cron": 5}, "cron"),
    ("PUT", f"{M}/schedule/", {"cron": "60 * * * *"}, "schedule"),
    ("PUT", f"{M}/schedule/", {"cron": "*/0 * * * *"}, "schedule"),
    ("PUT", f"{M}/schedule/", {"cron": "a b c d e"}, "schedule"),
    # blackboard, member controls
    ("PUT", f"{API}/blackboard/", {"content": f"# plan{NUL}"}, "content"),
    ("PUT", f"{API}/blackboard/", {"content": f"# plan{SURROGATE}"}, "content"),
    ("PUT", f"{API}/blackboard/", {"content": ["x"]}, "content"),
    ("POST", f"{M}/permission/", {"mode": NUL}, "mode"),
    ("POST", f"{M}/permission/", {"mode": ["default"]}, "mode"),
    ("POST", f"{M}/compact/", {"kind": f"micro{NUL}"}, "kind"),
    # approvals and questions
    ("POST", f"{API}/approvals/{{approval}}/deny/", {"reason": f"no{NUL}"}, "reason"),
    ("POST", f"{API}/approvals/{{approval}}/deny/", {"reason": "r" * 2001}, "reason"),
    ("POST", f"{API}/approvals/{{approval}}/approve/", {"reason": SURROGATE}, "reason"),
    ("POST", f"{API}/questions/{{question}}/answer/", {"answer": f"main{NUL}"}, "answer"),
    ("POST", f"{API}/questions/{{question}}/answer/", {"answer": "a" * 10001}, "answer"),
    ("POST", f"{API}/questions/{{question}}/answer/", {"answer": " "}, "answer"),
    # access and tokens
    ("POST", f"{API}/access/", {"username": f"stranger{NUL}", "role": "viewer"}, "username"),
    ("POST", f"{API}/access/", {"username": "stranger", "role": f"viewer{NUL}"}, "role"),
    ("POST", f"{API}/access/", {"username": "u" * 151, "role": "viewer"}, "username"),
    ("POST", "/api/tokens/", {"name": f"laptop{NUL}"}, "name"),
    ("POST", "/api/tokens/", {"name": "t" * 81}, "name"),
]

# GET / DELETE with a bad query parameter or URL part (percent-encoded as a client would send it)
URL_CASES = [
    ("GET", f"{API}/tasks/?assignee=%00", "assignee"),
    ("GET", f"{API}/tasks/?status=%00", "status"),
    ("GET", f"{API}/tasks/?assignee=%ED%A0%80", "assignee"),
    ("GET", f"{API}/messages/?member=w1%00", "member"),
    ("GET", f"{API}/messages/?before=%00", "before"),
    ("GET", f"{API}/events/?after=%00", "after"),
    ("GET", f"{API}/events/?limit=99999999999999999999", "limit"),
    ("GET", f"{API}/approvals/?status=%00", "status"),
    ("GET", f"{API}/tasks/?%00=1", "query"),
    ("GET", f"{API}/members/w1/transcript/?session=%00", "session"),
    ("GET", f"{API}/members/w1%00/", "name"),
    ("GET", f"{API}/members/w1%00/schedule/", "name"),
    ("POST", f"{API}/members/w1%00/suspend/", "name"),
    ("POST", f"{API}/members/w1/suspend%00/", "action"),
    ("DELETE", f"{API}/members/w2%00/", "name"),
    ("DELETE", f"{API}/access/viewer%00/", "username"),
]


def _send(client: Client, method: str, url: str, body) -> object:
    if isinstance(body, (dict, list)):
        data = json.dumps(body)
    else:
        data = body
    return client.generic(method, url, data=data, content_type="application/json")


@pytest.fixture
def owner(world):
    return world.client(world.owner)


@pytest.fixture
def ids(world):
    return {"approval": pending_approval(world.space).pk, "question": open_question(world.space).pk}


def _assert_refused(response, field, before, after):
    assert response.status_code < 500, f"got {response.status_code}: a server error"
    assert 400 <= response.status_code < 500, response.status_code
    assert response.json().get("field") == field, response.json()
    assert not changed_tables(before, after), f"partial write: {changed_tables(before, after)}"


@pytest.mark.parametrize("method, url, body, field", BODY_CASES)
def test_a_bad_body_is_a_4xx_naming_the_field_and_writes_nothing(world, owner, ids, method, url, body, field):
    url = url.format(**ids)
    before = db_state()
    response = _send(owner, method, url, body)
    _assert_refused(response, field, before, db_state())


@pytest.mark.parametrize("method, url, field", URL_CASES)
def test_a_bad_query_or_url_part_is_a_4xx_naming_it(world, owner, method, url, field):
    before = db_state()
    response = owner.generic(method, url)
    _assert_refused(response, field, before, db_state())


def test_an_oversize_body_is_413_naming_the_limit(world, owner, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    before = db_state()
    response = _send(owner, "PUT", f"{API}/blackboard/", {"content": "x" * 2000})
    assert response.status_code == 413 and "1000 bytes" in response.json()["error"]
    assert response.json()["field"] == "json" and not changed_tables(before, db_state())


def test_deep_nesting_names_the_limit(world, owner):
    error = _send(owner, "POST", f"{API}/messages/", "[" * 100_000).json()["error"]
    assert "deeper than 32 levels" in error


def test_a_nul_in_a_nested_field_names_its_path(world, owner):
    body = {"name": "w9", "rule_domains": ["conduct", f"x{NUL}"]}
    answer = _send(owner, "POST", f"{API}/members/", body).json()
    assert answer["field"] == "rule_domains[1]" and "NUL" in answer["error"]


def test_six_and_seven_field_cron_is_refused_with_the_rule_it_breaks(world, owner):
    for cron in ("*/5 * * * * *", "0 0 1 1 * 2030 x"):
        error = _send(owner, "PUT", f"{M}/schedule/", {"cron": cron}).json()["error"]
        assert "exactly five" in error and "minute hour day month weekday" in error


def test_a_cron_that_never_fires_says_so(world, owner):
    error = _send(owner, "PUT", f"{M}/schedule/", {"cron": "0 0 30 2 *"}).json()["error"]
    assert "never fires" in error


def test_good_input_still_works_next_to_the_battery(world, owner):
    """The checks refuse only what they should: the ordinary moves still succeed."""
    assert _send(owner, "PUT", f"{M}/schedule/", {"cron": " 0  9 * * 1-5 "}).json()["cron"] == "0 9 * * 1-5"
    created = _send(owner, "POST", f"{API}/members/", {"name": "w9", "rule_domains": ["conduct"], "model": "openai:gpt-4o"})
    assert created.status_code == 201
    assert _send(owner, "POST", f"{API}/messages/", {"to": "boss", "body": "tab\tand newline\nand ünïcödé 🎉"}).status_code == 201


# --- console forms, posted with the page's CSRF token ------------------------------------------------------

FORM_CASES = [
    ("manage", {"action": "grant", "username": f"stranger{NUL}", "role": "viewer"}, "username"),
    ("manage", {"action": "grant", "username": "stranger", "role": f"viewer{NUL}"}, "role"),
    ("manage", {"action": "grant", "username": "u" * 151, "role": "viewer"}, "username"),
    ("manage", {"action": "revoke", "username": f"viewer{NUL}"}, "username"),
    ("manage", {"action": "add_member", "name": f"w{NUL}9", "role": "worker"}, "name"),
    ("manage", {"action": "add_member", "name": "w9", "role": "worker", "persona": f"p{NUL}"}, "persona"),
    ("manage", {"action": "add_member", "name": "w9", "role": "worker", "model": f"offline{NUL}"}, "model"),
    ("manage", {"action": "add_member", "name": "w9", "role": "worker", "model": LONG_MODEL}, "model"),
    ("manage", {"action": "add_member", "name": "operator", "role": "worker"}, "name"),
    ("manage", {"action": "add_member", "name": "-w9", "role": "worker"}, "name"),
    ("manage", {"action": "add_member", "name": "<i>w9</i>", "role": "worker"}, "name"),
    ("manage", {"action": "remove_member", "name": f"w2{NUL}"}, "name"),
    ("manage", {"action": f"grant{NUL}"}, "action"),
    ("tokens", {"action": "create", "name": f"laptop{NUL}"}, "name"),
    ("tokens", {"action": "create", "name": "t" * 81}, "name"),
    ("tokens", {"action": "revoke", "token_id": NUL}, "token_id"),
    ("tokens", {"action": "revoke", "token_id": "abc"}, "token_id"),
    ("rules", {"action": "add_rule", "domain": "conduct", "text": f"be kind{NUL}"}, "text"),
    ("rules", {"action": "add_rule", "domain": f"conduct{NUL}", "text": "be kind"}, "domain"),
    ("rules", {"action": "edit_rule", "rule_id": NUL, "text": "x"}, "rule_id"),
    ("rules", {"action": "reject", "proposal_id": "1", "reason": f"no{NUL}"}, "reason"),
    ("waggles", {"action": "disable", "name": f"w{NUL}", "scope": "space"}, "name"),
    ("waggles", {"action": "disable", "name": "w", "scope": f"space{NUL}"}, "scope"),
    ("inbox", {"message_id": NUL, "body": "x"}, "message_id"),
    ("inbox", {"message_id": "1", "body": f"x{NUL}"}, "body"),
]


def _page(slug: str, form: str) -> str:
    return "/tokens/" if form == "tokens" else f"/spaces/{slug}/{form}/"


def _csrf_client(user) -> tuple[Client, str]:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/tokens/")  # any page sets the csrftoken cookie
    return client, client.cookies["csrftoken"].value


@pytest.fixture
def member_domains(world):
    from veronica.models import Member

    Member.objects.filter(space=world.space, name="boss").update(rule_domains=["conduct"])


@pytest.mark.parametrize("form, data, field", FORM_CASES)
def test_a_bad_console_form_rerenders_with_the_field_error(world, member_domains, form, data, field):
    client, token = _csrf_client(world.owner)
    before = db_state()
    response = client.post(_page("alpha", form), {**data, "csrfmiddlewaretoken": token})
    assert response.status_code < 500, f"got {response.status_code}: a server error"
    assert 400 <= response.status_code < 500 and response.status_code != 403, response.status_code
    assert f"{field}: " in response.content.decode(), response.content.decode()[:2000]
    assert not changed_tables(before, db_state()), f"partial write: {changed_tables(before, db_state())}"


def test_a_refused_form_keeps_the_page_and_shows_no_internals(world, member_domains):
    client, token = _csrf_client(world.owner)
    response = client.post("/spaces/alpha/rules/", {"action": "add_rule", "domain": "conduct", "text": f"x{NUL}",
                                                    "csrfmiddlewaretoken": token})
    page = response.content.decode()
    assert response.status_code == 400 and "text: text contains a NUL character" in page
    assert "PostgreSQL" not in page and "Traceback" not in page


@pytest.mark.parametrize("url", ["/spaces/alpha/members/w1%00/", "/spaces/alpha/members/w1%00/panels/header/",
                                 "/spaces/alpha/members/%ED%A0%80/"])
def test_a_bad_member_name_in_a_console_url_is_404(world, url):
    assert world.client(world.owner).get(url).status_code == 404


# --- admin add forms: Django's own form errors, never a 500 ------------------------------------------------

ADMIN_CASES = [
    ("member", {"name": f"w{NUL}9"}, "name"),
    ("member", {"name": "operator"}, "name"),
    ("member", {"name": "w9", "persona": f"p{NUL}"}, "persona"),
    ("member", {"name": "w9", "schedule": "0 0 30 2 *"}, "schedule"),
    ("member", {"name": "w9", "schedule": "*/5 * * * * *"}, "schedule"),
    ("member", {"name": "w9", "model": LONG_MODEL}, "model"),
    ("member", {"name": "w9", "rule_domains": '["a\\u0000"]'}, "rule_domains"),
    ("member", {"name": "w9", "budget_override": "99999999999"}, "budget_override"),
    ("skill", {"name": "s", "body": f"b{NUL}"}, "body"),
    ("skill", {"name": f"s{NUL}", "body": "b"}, "name"),
    ("task", {"title": f"t{NUL}"}, "title"),
    ("task", {"title": "t", "spec": f"s{NUL}"}, "spec"),
]

ADMIN_DEFAULTS = {
    "member": {"role": "worker", "model": "offline", "permission_mode": "bypass", "permission_origin": "manifest",
               "membership": "active", "run_status": "idle", "phase": "ready", "schedule_origin": "manifest",
               "rule_domains": "[]", "max_iterations": "24", "clone_seq": "0", "retire_policy": ""},
    "skill": {"description": ""},
    "task": {"creator_name": "admin", "verify_policy": "auto"},
}


@pytest.mark.parametrize("model, data, field", ADMIN_CASES)
def test_a_bad_admin_add_form_shows_the_field_error(world, model, data, field):
    client = world.client(world.staff)
    world.staff.is_superuser = True
    world.staff.save()
    before = db_state()
    response = client.post(f"/admin/veronica/{model}/add/", {"space": world.space.pk, **ADMIN_DEFAULTS[model], **data})
    assert response.status_code < 500, f"got {response.status_code}: a server error"
    assert response.status_code == 200, response.status_code  # the admin re-renders its form with the errors
    errors = response.context["adminform"].form.errors
    assert field in errors or re.search(field, str(errors)), errors
    assert not changed_tables(before, db_state()), f"partial write: {changed_tables(before, db_state())}"


@pytest.mark.parametrize("data, field", [
    ({"rule_domains": '["a\\u0000"]'}, "rule_domains"),
    ({"schedule": "0 0 30 2 *"}, "schedule"),
    ({"schedule": "* * * * * *"}, "schedule"),
    ({"persona": f"p{NUL}"}, "persona"),
    ({"budget_override": "99999999999"}, "budget_override"),
])
def test_a_bad_admin_member_edit_shows_the_field_error(world, data, field):
    from django.forms.models import model_to_dict

    from veronica.models import Member

    world.staff.is_superuser = True
    world.staff.save()
    w1 = Member.objects.get(space=world.space, name="w1")
    current = {k: v for k, v in model_to_dict(w1).items() if v is not None}
    current["rule_domains"] = json.dumps(current.get("rule_domains", []))
    before = db_state()
    response = world.client(world.staff).post(f"/admin/veronica/member/{w1.pk}/change/", {**current, **data})
    assert response.status_code == 200, response.status_code
    assert field in response.context["adminform"].form.errors, response.context["adminform"].form.errors
    assert not changed_tables(before, db_state()), f"partial write: {changed_tables(before, db_state())}"
