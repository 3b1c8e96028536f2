"""The audit trail (issue 27 point 2): every verb a person or a token calls, through its door, is one
append-only row with who, how, from where and what (before -> after, secrets masked)."""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from tests.console.helpers import call, open_question, pending_approval
from veronica.swarm import access, audit, ledger
from veronica.engine import approvals, supervisor
from veronica.models import ApiToken, AppendOnly, AuditRow, Member, Space

API = "/api/spaces/alpha"
TOKEN_FIELDS = {"id", "name", "prefix", "read_only", "expires_at", "revoked_at"}  # never the key or its hash
M = f"{API}/members/w1"


@dataclass
class Door:
    client: Client
    via: str
    token: ApiToken | None = None

    def call(self, method: str, url: str, body: dict | None = None):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {self.key}"} if self.token else {}
        data = json.dumps(body) if body is not None else ""
        return self.client.generic(method, url, data=data, content_type="application/json", **headers)

    def post_form(self, url: str, data: dict):
        return self.client.post(url, data)


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"  # spaces created from archives and templates live here
    settings.SECRETS_KEYS = [Fernet.generate_key().decode()]  # the secrets verbs' cases encrypt
    settings.A2A_ALLOW_HOSTS = ["127.0.0.0/8"]  # the remote agent case's card is on loopback (hosted refuses it by default)


@pytest.fixture
def doors(world):
    token, key = access.create_token(world.owner, "script")  # no person is acting here: no row
    by_token = Door(Client(), "token", token)
    by_token.key = key
    return {"session": Door(world.client(world.owner), "session"), "token": by_token,
            "admin": Door(world.client(world.staff), "admin"), "staff": Door(world.client(world.staff), "session")}


@dataclass
class Case:
    verb: str  # module.function
    door: str
    action: str
    do: Callable  # (world, door) -> response
    check: Callable = lambda row: True  # noqa: E731 - the row's what
    target: str | None = None
    space: str = "alpha"
    actor: str = "owner"


def _task(world, **kw):
    return ledger.create_task(world.space, "boss", "a job", **kw)


def _failed_task(world):
    from veronica.models import Task

    task = _task(world)
    Task.objects.filter(pk=task.pk).update(status="failed")  # how a run leaves it; no person's change
    return task


def _assign_and_run(world):
    task = _task(world, assignee=supervisor.get_member(world.space, "w1"))
    return task


def _suspend(world):
    supervisor.suspend(supervisor.get_member(world.space, "w1"), actor="test")


def _freeze(world):
    supervisor.freeze(supervisor.get_member(world.space, "w1"), actor="test")


def _admin_action(model: str, action: str, pk_of: Callable):
    def do(world, door):
        return door.post_form(f"/admin/veronica/{model}/", {"action": action, "_selected_action": [pk_of(world)]})
    return do


def _rule(world):
    return approvals.allow_always(supervisor.get_member(world.space, "w1"), "write_file", user=world.owner)


def _skill(world):
    from veronica.swarm import skills
    skills.add_skill(world.space, "howto", "# how", actor="test")


def _mcp(world):
    from veronica.swarm import mcp_servers
    mcp_servers.add(world.space, mcp_servers.check({"name": "files", "command": ["true"], "env": {"API_KEY": "old"}}),
                    actor="test")


def _check(world):
    from veronica.engine import checks
    checks.add_check(world.space, {"name": "lint", "command": "true"}, actor="test")


def _notifier(world):
    from veronica.ops import notify
    notify.configure(world.space, emails="ops@example.com", actor="test")


def _report(world):
    from veronica.swarm import bus
    return bus.send(world.space, "w1", bus.OPERATOR, "the report")[0]  # a member's mail: nobody's audit row


def _secret(world):
    from veronica.ops import webhooks
    webhooks.rotate_secret(world.space, actor="test")


def _memory(world):
    from veronica.swarm import memory
    memory.write(supervisor.get_member(world.space, "w1"), "notes.md", "x", actor="test")


def _a2a_credential(world):
    from veronica.swarm import a2a_settings
    return a2a_settings.create_credential(world.space, "partner", "operator", actor="test")[0]


def _a2a_remote(world):
    from veronica.swarm import a2a_settings
    a2a_settings.add_remote(world.space, a2a_settings.RemoteConfig(name="helper", card_url="http://127.0.0.1:9/card"),
                            actor="test", fetch_card=False)


def _add_remote(world, door):
    from unittest import mock

    from veronica.swarm import a2a_client
    card = mock.Mock(endpoint="http://127.0.0.1:9/a2a", description="helps")
    with mock.patch.object(a2a_client, "fetch_card", return_value=card):
        return door.call("POST", f"{API}/a2a/remotes/", {"name": "helper", "card_url": "http://127.0.0.1:9/card",
                                                          "token": "t0ken-value"})


def _set_secret(world, door):
    return door.call("POST", f"{API}/secrets/", {"name": "API_KEY", "value": "s3cret-value"})


def _a_secret(world):
    from veronica.swarm import secrets
    secrets.set_secret(world.space, "OLD_KEY", "old-value-123", actor="test")


CASES = [
    # members and run control (API; session and token alike)
    Case("supervisor.suspend", "token", "member.suspend", lambda w, d: d.call("POST", f"{M}/suspend/"),
         lambda r: r.after["run_status"] == "suspended" and r.before["run_status"] == "idle", "w1"),
    Case("supervisor.resume", "session", "member.resume", lambda w, d: (_suspend(w), d.call("POST", f"{M}/resume/"))[1],
         lambda r: r.before["run_status"] == "suspended"),
    Case("supervisor.freeze", "token", "member.freeze", lambda w, d: d.call("POST", f"{M}/freeze/"),
         lambda r: r.after["membership"] == "frozen"),
    Case("supervisor.unfreeze", "token", "member.unfreeze", lambda w, d: (_freeze(w), d.call("POST", f"{M}/unfreeze/"))[1],
         lambda r: r.after["membership"] == "active"),
    Case("supervisor.halt_all", "token", "space.halt_all", lambda w, d: d.call("POST", f"{API}/halt/"),
         lambda r: r.after == {"suspended": 3}),
    Case("supervisor.resume_all", "token", "space.resume_all",
         lambda w, d: (_suspend(w), d.call("POST", f"{API}/resume/"))[1], lambda r: r.after == {"resumed": 1}),
    Case("supervisor.rename_space", "token", "space.rename", lambda w, d: d.call("PUT", f"{API}/name/", {"name": "Renamed"}),
         lambda r: r.before == {"name": "Alpha"} and r.after == {"name": "Renamed"}),
    Case("supervisor.add_member", "token", "member.add", lambda w, d: d.call("POST", f"{API}/members/", {"name": "w9"}),
         lambda r: r.before is None and r.after["name"] == "w9", "w9"),
    Case("roster.remove_member", "token", "member.remove", lambda w, d: d.call("DELETE", f"{API}/members/w2/"),
         lambda r: r.before["removed_at"] is None and r.after["removed_at"], "w2"),
    Case("roster.spawn", "token", "member.spawn", lambda w, d: d.call("POST", f"{M}/spawn/"),
         lambda r: r.after["name"] == "w1-1"),
    Case("supervisor.compact", "token", "member.compact", lambda w, d: d.call("POST", f"{M}/compact/", {"kind": "micro"}),
         lambda r: r.after == {"kind": "micro"}, "w1"),
    Case("supervisor.clear_session", "token", "member.clear_session", lambda w, d: d.call("POST", f"{M}/clear/")),
    Case("roster.set_schedule", "token", "member.schedule_set",
         lambda w, d: d.call("PUT", f"{M}/schedule/", {"cron": "*/5 * * * *"}), lambda r: r.after["schedule"] == "*/5 * * * *"),
    Case("roster.clear_schedule", "token", "member.schedule_clear", lambda w, d: d.call("DELETE", f"{M}/schedule/"),
         lambda r: r.after["schedule_tombstone"] is True),
    Case("supervisor.set_permission_mode", "token", "member.permission_mode",
         lambda w, d: d.call("POST", f"{M}/permission/", {"mode": "default"}),
         lambda r: r.before["permission_mode"] == "bypass" and r.after["permission_mode"] == "default"),
    Case("supervisor.edit_member", "token", "member.edit",
         lambda w, d: d.call("PATCH", f"{M}/", {"persona": "careful", "schedule": "0 * * * *"}),
         lambda r: r.after["persona"] == "careful" and r.after["schedule"] == "0 * * * *" and r.before["persona"] == ""),
    # budgets and settings
    Case("budget.set_member_budget", "token", "member.budget_set",
         lambda w, d: d.call("PUT", f"{M}/budget/", {"budget_override": 5000}), lambda r: r.after == {"budget_override": 5000}),
    Case("budget.reset_day", "token", "member.budget_reset_day", lambda w, d: d.call("POST", f"{M}/budget/reset/")),
    Case("budget.set_space_limits", "token", "space.limits_set",
         lambda w, d: d.call("PUT", f"{API}/budget/", {"daily_token_ceiling": 9000}),
         lambda r: r.before == {"daily_token_ceiling": 0} and r.after == {"daily_token_ceiling": 9000}),
    Case("retention.set_retention_days", "token", "space.retention_set",
         lambda w, d: d.call("PUT", f"{API}/retention/", {"retention_days": 30}), lambda r: r.after == {"retention_days": 30}),
    Case("watchdogs.set_thresholds", "token", "space.thresholds_set",
         lambda w, d: d.call("PUT", f"{API}/watchdogs/", {"stuck_run_minutes": 45}), lambda r: r.after == {"stuck_run_minutes": 45}),
    Case("notify.configure", "token", "space.notify_set",
         lambda w, d: d.call("PUT", f"{API}/notify/", {"emails": "ops@example.com",
                                                       "slack_url": "https://hooks.slack.example/services/T0/B0/s3cret"}),
         lambda r: r.after == {"notify_emails": "ops@example.com", "notify_slack_url": "https://hooks.slack.example/•••"}),
    Case("checks.configure", "token", "space.checks_set",
         lambda w, d: d.call("PUT", f"{API}/checks/", {"checks": [{"name": "t", "command": "true"}]}),
         lambda r: r.after["verify_checks"][0]["name"] == "t"),
    Case("checks.add_check", "session", "space.check_add",
         lambda w, d: d.post_form("/spaces/alpha/manage/", {"action": "add_check", "name": "lint", "command": "true"}),
         lambda r: r.after["verify_checks"][0]["name"] == "lint"),
    Case("checks.update_check", "session", "space.check_update",
         lambda w, d: (_check(w), d.post_form("/spaces/alpha/manage/", {"action": "edit_check", "check": "lint", "name": "lint",
                                                                       "command": "false"}))[1],
         lambda r: r.after["verify_checks"][0]["command"] == "false"),
    Case("checks.remove_check", "session", "space.check_remove",
         lambda w, d: (_check(w), d.post_form("/spaces/alpha/manage/", {"action": "remove_check", "check": "lint"}))[1],
         lambda r: r.after == {"verify_checks": []}),
    Case("blackboard.set_cap", "admin", "space.blackboard_cap",
         lambda w, d: d.post_form(f"/admin/veronica/space/{w.space.pk}/change/", {}), None),  # replaced below
    Case("blackboard.write", "token", "blackboard.write", lambda w, d: d.call("PUT", f"{API}/blackboard/", {"content": "# plan"}),
         lambda r: r.after["content"] == "# plan"),
    Case("webhooks.rotate_secret", "token", "space.webhook_secret_rotate", lambda w, d: d.call("POST", f"{API}/webhook/secret/"),
         lambda r: r.after["webhook_secret"] == audit.MASK and r.before["webhook_secret"] == ""),
    Case("webhooks.clear_secret", "token", "space.webhook_secret_clear",
         lambda w, d: (_secret(w), d.call("DELETE", f"{API}/webhook/secret/"))[1],
         lambda r: r.before["webhook_secret"] == audit.MASK and r.after["webhook_secret"] == ""),
    Case("notify.send_test", "session", "space.notify_test",
         lambda w, d: (_notifier(w), d.post_form("/spaces/alpha/manage/", {"action": "notify_test"}))[1]),
    # tasks
    Case("ledger.create_task", "token", "task.create", lambda w, d: d.call("POST", f"{API}/tasks/", {"title": "ship it"}),
         lambda r: r.before is None and r.after["title"] == "ship it" and r.target.endswith(" ship it")),
    Case("ledger.assign", "token", "task.assign",
         lambda w, d: d.call("POST", f"{API}/tasks/{_task(w).pk}/assign/", {"assignee": "w1"}),
         lambda r: r.before["assignee_id"] is None and r.after["assignee_id"]),
    Case("ledger.reassign", "token", "task.reassign",
         lambda w, d: d.call("POST", f"{API}/tasks/{_assign_and_run(w).pk}/reassign/", {"assignee": "w2"}),
         lambda r: r.after["assignee_id"] == Member.objects.get(name="w2", space__slug="alpha").pk),
    Case("ledger.cancel", "token", "task.cancel", lambda w, d: d.call("POST", f"{API}/tasks/{_task(w).pk}/cancel/", {}),
         lambda r: r.after["status"] == "cancelled"),
    Case("ledger.retry", "token", "task.retry",
         lambda w, d: d.call("POST", f"{API}/tasks/{_failed_task(w).pk}/retry/", {}),
         lambda r: r.before["status"] == "failed" and r.after["status"] != "failed"),
    # approvals, questions, mail
    Case("approvals.decide", "token", "approval.decide",
         lambda w, d: d.call("POST", f"{API}/approvals/{pending_approval(w.space).pk}/deny/", {"reason": "no"}),
         lambda r: r.before["status"] == "pending" and r.after["status"] == "denied"),
    Case("approvals.allow_always", "token", "approval_rule.add",
         lambda w, d: d.call("POST", f"{API}/approval-rules/", {"member": "w1", "tool": "write_file"}),
         lambda r: r.after["tool_name"] == "write_file"),
    Case("approvals.revoke_rule", "token", "approval_rule.revoke",
         lambda w, d: d.call("DELETE", f"{API}/approval-rules/{_rule(w).pk}/"), lambda r: r.after["revoked_at"]),
    Case("approvals.answer", "token", "question.answer",
         lambda w, d: d.call("POST", f"{API}/questions/{open_question(w.space).pk}/answer/", {"answer": "main"}),
         lambda r: r.after["answer"] == "main"),
    Case("bus.send", "token", "message.send", lambda w, d: d.call("POST", f"{API}/messages/", {"to": "boss", "body": "hello"}),
         lambda r: r.after["body"] == "hello", "boss"),
    Case("chat.send_to", "token", "message.send", lambda w, d: d.call("POST", f"{M}/chat/", {"body": "hi"}),
         lambda r: r.after["body"] == "hi", "w1"),
    Case("bus.accept_operator_mail", "session", "message.accept",
         lambda w, d: d.post_form("/spaces/alpha/inbox/", {"message_id": _report(w).pk, "body": "edited"}),
         lambda r: r.after["accepted_body"] == "edited" and r.before["accepted_at"] is None),
    Case("alarms.set_alarm", "admin", "member.alarm_set",
         lambda w, d: d.post_form("/admin/veronica/alarm/add/", {"member": supervisor.get_member(w.space, "w1").pk,
                                                                 "fire_at_0": f"{timezone.now().date() + timedelta(days=2)}",
                                                                 "fire_at_1": "09:00:00",
                                                                 "note": "wake up"}),
         lambda r: r.after["note"] == "wake up", actor="staff"),
    # skills, memory, MCP servers
    Case("skills.add_skill", "token", "skill.add",
         lambda w, d: d.call("POST", f"{API}/skills/", {"name": "howto", "body": "# how"}), lambda r: r.after["body"] == "# how"),
    Case("skills.remove_skill", "token", "skill.remove", lambda w, d: (_skill(w), d.call("DELETE", f"{API}/skills/howto/"))[1],
         target="howto"),
    Case("memory.write", "token", "memory.write",
         lambda w, d: d.call("POST", f"{M}/memory/", {"name": "notes.md", "content": "abc"}),
         lambda r: r.after == {"name": "notes.md", "chars": 3}),
    Case("memory.delete", "token", "memory.delete", lambda w, d: (_memory(w), d.call("DELETE", f"{M}/memory/notes.md/"))[1]),
    Case("mcp_servers.add", "session", "mcp.add",
         lambda w, d: d.post_form("/spaces/alpha/manage/", {"action": "add_mcp", "name": "files", "command": "true",
                                                             "env": "API_KEY=s3cret"}),
         lambda r: r.after["env"] == audit.MASK and "s3cret" not in json.dumps(r.after)),
    Case("mcp_servers.set_env", "session", "mcp.set_env",
         lambda w, d: (_mcp(w), d.post_form("/spaces/alpha/manage/", {"action": "env_mcp", "name": "files",
                                                                      "env": "API_KEY=new"}))[1],
         lambda r: r.after["env"] == audit.MASK and "new" not in json.dumps(r.after["env"])),
    Case("mcp_servers.remove", "session", "mcp.remove",
         lambda w, d: (_mcp(w), d.post_form("/spaces/alpha/manage/", {"action": "remove_mcp", "name": "files"}))[1]),
    # access and tokens
    Case("access.grant", "token", "access.grant",
         lambda w, d: d.call("POST", f"{API}/access/", {"username": "stranger", "role": "viewer"}),
         lambda r: r.after == {"user": "stranger", "role": "viewer"}),
    Case("access.revoke", "session", "access.revoke",
         lambda w, d: d.post_form("/spaces/alpha/manage/", {"action": "revoke", "username": "viewer"}),
         lambda r: r.after == {"user": "viewer"}),
    Case("access.create_token", "session", "token.create", lambda w, d: d.call("POST", "/api/tokens/", {"name": "ci"}),
         lambda r: r.after["name"] == "ci" and set(r.after) == TOKEN_FIELDS, "ci", ""),
    Case("access.revoke_token", "session", "token.revoke",
         lambda w, d: d.call("DELETE", f"/api/tokens/{access.create_token(w.owner, 'old')[0].pk}/"),
         lambda r: r.after["revoked_at"], "old", ""),
    # secrets (names and where they apply; never the value) and A2A settings
    Case("secrets.set_secret", "token", "secret.set", _set_secret,
         lambda r: r.after == {"name": "API_KEY", "member": None, "in_commands": False} and "s3cret" not in json.dumps(r.as_wire()),
         "API_KEY"),
    Case("secrets.delete_secret", "session", "secret.delete",
         lambda w, d: (_a_secret(w), d.call("DELETE", f"{API}/secrets/OLD_KEY/"))[1], target="OLD_KEY"),
    Case("a2a_settings.set_enabled", "token", "a2a.serve", lambda w, d: d.call("POST", f"{API}/a2a/", {"enabled": True}),
         lambda r: r.after == {"enabled": True}),
    Case("a2a_settings.set_members", "session", "a2a.members", lambda w, d: d.call("POST", f"{API}/a2a/", {"members": ["w1"]}),
         lambda r: r.after == {"members": ["w1"]}),
    Case("a2a_settings.create_credential", "token", "a2a.credential.create",
         lambda w, d: d.call("POST", f"{API}/a2a/credentials/", {"name": "partner", "role": "viewer"}),
         lambda r: r.after == {"name": "partner", "role": "viewer"}, "partner"),
    Case("a2a_settings.revoke_credential", "session", "a2a.credential.revoke",
         lambda w, d: d.call("DELETE", f"{API}/a2a/credentials/{_a2a_credential(w).pk}/"), target="partner"),
    Case("a2a_settings.add_remote", "token", "a2a.remote.add", _add_remote,
         lambda r: r.after["bearer_set"] is True and "t0ken" not in json.dumps(r.as_wire()), "helper"),
    Case("a2a_settings.remove_remote", "session", "a2a.remote.remove",
         lambda w, d: (_a2a_remote(w), d.call("DELETE", f"{API}/a2a/remotes/helper/"))[1], target="helper"),
    # exports and imports
    Case("archive.create_from_template", "staff", "space.import",
         lambda w, d: d.post_form("/new-space/", {"source": "template", "template": "demo-team", "slug": "fresh"}),
         lambda r: r.after == {"slug": "fresh", "from": "template", "template": "demo-team"}, "fresh", "fresh", "staff"),
    Case("archive.export_archive", "session", "space.export", lambda w, d: d.client.get("/spaces/alpha/export/"),
         lambda r: r.after["bytes"] > 0),
    # the admin door
    Case("supervisor.freeze", "admin", "member.freeze",
         _admin_action("member", "freeze", lambda w: supervisor.get_member(w.space, "w1").pk),
         lambda r: r.after["membership"] == "frozen", "w1", actor="staff"),
    Case("supervisor.halt_all", "admin", "space.halt_all", _admin_action("space", "halt_all", lambda w: w.space.pk),
         lambda r: r.after == {"suspended": 3}, actor="staff"),
    Case("retention.purge_space", "admin", "space.purge", _admin_action("space", "purge_retention", lambda w: w.space.pk),
         actor="staff"),
]
CASES = [c for c in CASES if c.check is not None]  # the admin's blackboard cap is a test of its own below


def _ids(case: Case) -> str:
    return f"{case.verb}-{case.door}"


def _check_row(row: AuditRow, *, action: str, via: str, actor: str = "user:owner", space: str = "alpha") -> None:
    assert (row.action, row.via, row.actor, row.space_slug) == (action, via, actor, space), row.as_wire()
    if via in ("session", "token", "admin"):
        assert row.ip == "127.0.0.1"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_every_verb_through_its_door_is_one_audit_row(world, doors, case):
    door = doors[case.door]
    start = AuditRow.objects.count()
    response = case.do(world, door)
    assert response.status_code < 400, getattr(response, "content", b"")[:400]
    rows = list(AuditRow.objects.order_by("id")[start:])
    assert len(rows) == 1, [r.as_wire() for r in rows]
    row = rows[0]
    _check_row(row, action=case.action, via=door.via, actor=f"user:{case.actor}", space=case.space)
    assert row.token_id == (door.token.pk if door.token else None)
    if case.target is not None:
        assert row.target == case.target
    assert case.check(row), row.as_wire()


def test_the_admin_blackboard_cap_is_a_row_with_before_and_after(world, doors):
    from tests.console.test_admin_doors import admin_save

    response = admin_save(doors["admin"].client, world.space, blackboard_cap=1234)
    assert response.status_code == 302
    row = AuditRow.objects.get(action="space.blackboard_cap")
    _check_row(row, action="space.blackboard_cap", via="admin", actor="user:staff")
    assert (row.before, row.after) == ({"blackboard_cap": 8000}, {"blackboard_cap": 1234})


def test_rules_page_changes_are_rows_with_the_rule_text(world, doors):
    from learning.models import Rule

    Member.objects.filter(space=world.space, name="w1").update(rule_domains=["ops"])
    page, session = "/spaces/alpha/rules/", doors["session"]
    assert session.post_form(page, {"action": "add_rule", "domain": "ops", "text": "be careful"}).status_code == 302
    rule = Rule.objects.get(domain__name="ops", source="user")
    assert session.post_form(page, {"action": "edit_rule", "rule_id": rule.pk, "text": "be very careful"}).status_code == 302
    assert session.post_form(page, {"action": "remove_rule", "rule_id": rule.pk}).status_code == 302
    rows = list(AuditRow.objects.exclude(action="login").order_by("id"))  # force_login is a login too
    assert [(r.action, r.via, r.actor, r.space_slug) for r in rows] == [
        ("rule.add", "session", "user:owner", "alpha"), ("rule.edit", "session", "user:owner", "alpha"),
        ("rule.remove", "session", "user:owner", "alpha")]
    assert rows[1].before == {"text": "be careful"} and rows[1].after == {"text": "be very careful"}


# --- management commands and logins --------------------------------------------------------------------------

def test_management_commands_are_rows_by_the_os_user_via_command(world, tmp_path):
    out = io.StringIO()
    call_command("token", "create", "owner", "from-cli", stdout=out, stderr=io.StringIO())
    call_command("export", "alpha", str(tmp_path / "alpha.tar.gz"), stdout=io.StringIO())
    rows = list(AuditRow.objects.order_by("id"))
    assert [(r.action, r.via, r.target, r.space_slug) for r in rows] == [
        ("token.create", "command", "from-cli", ""), ("space.export", "command", "", "alpha")]
    assert all(r.actor == f"os:{audit.os_user()}" and r.user_id is None and r.ip for r in rows)
    assert out.getvalue().strip() not in json.dumps(rows[0].after) and set(rows[0].after) == TOKEN_FIELDS
    call_command("register", str(tmp_path / "alpha.tar.gz"), "--slug", "gamma", stdout=io.StringIO())
    imported = AuditRow.objects.get(action="space.import")  # one row: the register inside it is part of the import
    assert (imported.via, imported.space_slug, imported.after) == ("command", "gamma", {"slug": "gamma", "from": "archive",
                                                                                       "bytes": imported.after["bytes"]})


def test_registering_a_manifest_folder_is_a_command_row(db, demo_manifest):
    call_command("register", str(demo_manifest), stdout=io.StringIO())
    row = AuditRow.objects.get()
    assert (row.action, row.via, row.space_slug, row.after) == ("space.register", "command", "demo",
                                                               {"fresh": False, "directory": str(demo_manifest)})


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_logins_and_failed_logins_are_rows(world, path):
    user = User.objects.create_user("ann", password="pw-right", is_staff=True)
    client = Client()
    assert client.post(path, {"username": "ann", "password": "pw-wrong"}).status_code == 200
    assert client.post(path, {"username": "ann", "password": "pw-right"}).status_code == 302
    client.post("/logout/")
    rows = list(AuditRow.objects.order_by("id"))
    via = "admin" if path.startswith("/admin/") else "session"
    assert [(r.action, r.actor, r.via, r.user_id, r.ip) for r in rows] == [
        ("login.failed", "user:ann", via, None, "127.0.0.1"), ("login", "user:ann", via, user.pk, "127.0.0.1"),
        ("logout", "user:ann", "session", user.pk, "127.0.0.1")]
    assert "pw-" not in json.dumps([r.as_wire() for r in rows])


def test_a_password_change_and_the_admins_user_edits_are_rows(world):
    ann = User.objects.create_user("ann", password="old-pass-1")
    client = Client()
    client.force_login(ann)
    response = client.post("/password/", {"old_password": "old-pass-1", "new_password1": "N3w-pass-long!",
                                          "new_password2": "N3w-pass-long!"})
    assert response.status_code == 302
    row = AuditRow.objects.get(action="password.change")
    assert (row.actor, row.via, row.target) == ("user:ann", "session", "ann")
    assert "N3w" not in json.dumps(row.as_wire())
    admin = world.client(world.staff)
    response = admin.post("/admin/auth/user/add/", {"username": "bob", "password1": "Bob-pass-long-1",
                                                    "password2": "Bob-pass-long-1", "usable_password": "true"})
    assert response.status_code == 302, response.content[:300]
    row = AuditRow.objects.get(action="admin.add.auth.user")
    assert (row.actor, row.via, row.target) == ("user:staff", "admin", "bob")


# --- nobody acting: agents and the engine write no row -----------------------------------------------------

def test_a_verb_called_by_no_person_writes_no_row(world):
    supervisor.suspend(supervisor.get_member(world.space, "w1"), actor="boss")  # a tool or the engine: no context
    with audit.acting(None):
        supervisor.resume(supervisor.get_member(world.space, "w1"), actor="boss")
    assert not AuditRow.objects.exists()


def test_a_wake_run_inside_a_request_is_not_the_person(world):
    from veronica.engine import runner

    seen = []

    @audit.as_engine
    def duty():
        seen.append(audit.current())

    with audit.acting(audit.Actor(name="user:owner", via="session")):
        duty()
        assert audit.current() is not None
    assert seen == [None]
    assert getattr(runner.wake, "__wrapped__", None) is not None  # the wake task runs as the engine


def test_a_refused_verb_writes_no_row(world, doors):
    start = AuditRow.objects.count()
    assert doors["token"].call("PUT", f"{API}/name/", {"name": ""}).status_code == 400
    assert AuditRow.objects.count() == start


# --- masking -------------------------------------------------------------------------------------------------

def test_secret_named_fields_are_masked_at_any_depth():
    data = {"webhook_secret": "abc", "password": "p", "api_key": "k", "env": {"X": "1"}, "daily_token_ceiling": 5,
            "token_id": 3, "nested": [{"Authorization": "Bearer x", "name": "ok"}], "cleared_secret": "",
            "url": "https://bob:pw@mcp.example:8443/x?key=1", "value": "sk-live"}
    assert audit.mask(data) == {"webhook_secret": audit.MASK, "password": audit.MASK, "api_key": audit.MASK,
                                "env": audit.MASK, "daily_token_ceiling": 5, "token_id": 3,
                                "nested": [{"Authorization": audit.MASK, "name": "ok"}], "cleared_secret": "",
                                "url": "https://mcp.example:8443/•••", "value": audit.MASK}


def test_a_secrets_verb_never_writes_the_value_and_more_maskers_apply(db, monkeypatch):
    @audit.verb("secret.set")
    def set_secret(space, name: str, value: str, *, actor: str) -> None:
        pass

    monkeypatch.setattr(audit, "MASKERS", [lambda data: {**data, "name": "redacted"} if isinstance(data, dict) else data])
    with audit.acting(audit.Actor(name="user:x", via="token")):
        set_secret(None, "OPENAI_KEY", "sk-live", actor="user:x")
    row = AuditRow.objects.get()
    assert (row.action, row.target, row.after) == ("secret.set", "OPENAI_KEY", {"name": "redacted", "value": audit.MASK})


# --- append-only and retention -------------------------------------------------------------------------------

def _row(**kw) -> AuditRow:
    return audit.record("test.thing", actor=audit.Actor(name="user:x", via="session"), **kw)


def test_rows_are_never_updated_or_deleted_by_the_app(db):
    row = _row(after={"a": 1})
    row.action = "changed"
    with pytest.raises(AppendOnly):
        row.save()
    with pytest.raises(AppendOnly):
        row.delete()
    with pytest.raises(AppendOnly):
        AuditRow.objects.filter(pk=row.pk).update(action="changed")
    with pytest.raises(AppendOnly):
        AuditRow.objects.filter(pk=row.pk).delete()
    assert AuditRow.objects.get(pk=row.pk).action == "test.thing"


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_postgresql_refuses_an_update_or_delete_that_bypasses_the_model(db):
    row = _row()
    for sql in ("UPDATE veronica_auditrow SET action = 'x' WHERE id = %s", "DELETE FROM veronica_auditrow WHERE id = %s"):
        with pytest.raises(Exception, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [row.pk])
    assert AuditRow.objects.filter(pk=row.pk, action="test.thing").exists()


def _aged(row: AuditRow, days: int) -> None:
    """As the database would have stamped it `days` ago (the trigger is the app's guard, not the test's)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE veronica_auditrow DISABLE TRIGGER veronica_auditrow_append_only")
        cursor.execute("UPDATE veronica_auditrow SET created_at = %s WHERE id = %s", [timezone.now() - timedelta(days=days), row.pk])
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE veronica_auditrow ENABLE TRIGGER veronica_auditrow_append_only")


def test_the_retention_duty_purges_rows_past_their_own_window(world, settings):
    from veronica.engine import retention

    settings.AUDIT_RETENTION_DAYS = 400
    Space.objects.filter(pk=world.other.pk).update(retention_days=900)  # keeps its events longer: its audit too
    old, recent = _row(target="old"), _row(target="recent")
    kept, gone = _row(target="kept", space=world.other), _row(target="gone", space=world.other)
    _aged(old, 401), _aged(kept, 401), _aged(gone, 901)
    retention.purge_due()
    assert sorted(AuditRow.objects.exclude(action="login").values_list("target", flat=True)) == ["kept", "recent"]
    settings.AUDIT_RETENTION_DAYS = 0  # 0 keeps every row
    assert audit.purge(timezone.now() + timedelta(days=10000)) == 0


def test_vacuum_purges_the_audit_window_and_its_space_purges_are_command_rows(world, settings):
    settings.AUDIT_RETENTION_DAYS = 400
    old = _row(target="old")
    _aged(old, 401)
    Space.objects.filter(pk=world.space.pk).update(retention_days=30)
    out = io.StringIO()
    call_command("vacuum", "--space", "alpha", stdout=out)
    assert "audit trail: removed 1 rows" in out.getvalue()
    row = AuditRow.objects.get(action="space.purge")
    assert (row.via, row.actor, row.space_slug) == ("command", f"os:{audit.os_user()}", "alpha")
    assert not AuditRow.objects.filter(target="old").exists()


# --- the pages: who sees what, filters, export -------------------------------------------------------------------

@pytest.fixture
def trail(world):
    as_owner = audit.Actor(name="user:owner", via="session", user_id=world.owner.pk)
    audit.record("member.edit", space=world.space, target="w1", before={"persona": ""}, after={"persona": "x"}, actor=as_owner)
    audit.record("space.rename", space=world.space, before={"name": "A"}, after={"name": "B"},
                 actor=audit.Actor(name="user:operator", via="token", token_id=7))
    audit.record("member.add", space=world.other, target="beta-only-target", actor=audit.Actor(name="user:stranger", via="session"))
    audit.record("token.create", target="ci", actor=as_owner)


@pytest.mark.parametrize("who,status", [("owner", 200), ("staff", 200), ("operator", 403), ("viewer", 403),
                                        ("stranger", 404), (None, 302)])
def test_a_space_audit_page_is_for_its_owners(world, trail, who, status):
    response = world.client(getattr(world, who) if who else None).get("/spaces/alpha/audit/")
    assert response.status_code == status
    if status == 200:
        html = response.content.decode()
        assert "member.edit" in html and "space.rename" in html
        assert "beta-only-target" not in html and "token.create" not in html  # another space's rows, and rows of no space


@pytest.mark.parametrize("who,status", [("staff", 200), ("owner", 403), ("stranger", 403), (None, 302)])
def test_the_staff_audit_page_is_for_staff(world, trail, who, status):
    response = world.client(getattr(world, who) if who else None).get("/audit/")
    assert response.status_code == status
    if status == 200:
        assert all(a in response.content.decode() for a in ("member.edit", "space.rename", "beta-only-target", "token.create"))


def test_staff_with_the_view_permission_see_the_staff_page(world, trail):
    from django.contrib.auth.models import Permission

    clerk = User.objects.create_user("clerk", is_staff=True)
    assert world.client(clerk).get("/audit/").status_code == 403
    clerk.user_permissions.add(Permission.objects.get(codename="view_auditrow"))
    assert world.client(User.objects.get(pk=clerk.pk)).get("/audit/").status_code == 200


def _exported(client, url) -> list[dict]:
    response = client.get(url)
    assert response.status_code == 200 and response["Content-Type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]


def test_filters_and_the_json_lines_export(world, trail):
    owner, staff = world.client(world.owner), world.client(world.staff)
    assert [r["action"] for r in _exported(owner, "/spaces/alpha/audit/?format=jsonl")] == ["member.edit", "space.rename"]
    assert [r["action"] for r in _exported(owner, "/spaces/alpha/audit/?format=jsonl&via=token")] == ["space.rename"]
    assert [r["action"] for r in _exported(owner, "/spaces/alpha/audit/?format=jsonl&actor=owner")] == ["member.edit"]
    assert [r["action"] for r in _exported(staff, "/audit/?format=jsonl&action=member.")] == ["member.edit", "member.add"]
    assert [r["space"] for r in _exported(staff, "/audit/?format=jsonl&space=beta")] == ["beta"]
    today = timezone.now().date()
    assert len(_exported(staff, f"/audit/?format=jsonl&since={today}&until={today}")) == AuditRow.objects.count()
    assert _exported(staff, f"/audit/?format=jsonl&until={today - timedelta(days=1)}") == []
    row = _exported(staff, "/audit/?format=jsonl&action=space.rename")[0]
    assert {k: row[k] for k in ("actor", "via", "token_id", "before", "after")} == {
        "actor": "user:operator", "via": "token", "token_id": 7, "before": {"name": "A"}, "after": {"name": "B"}}


@pytest.mark.parametrize("query,field", [("via=carrier-pigeon", "via"), ("since=yesterday", "since"),
                                         ("until=2026-13-01", "until"), ("actor=" + "x" * 200, "actor")])
def test_a_bad_filter_is_a_400_naming_the_field(world, trail, query, field):
    response = world.client(world.staff).get(f"/audit/?{query}")
    assert response.status_code == 400 and f"{field}:" in response.content.decode()


def test_the_admin_shows_audit_rows_read_only(world, trail):
    client = world.client(world.staff)
    assert client.get("/admin/veronica/auditrow/").status_code == 200
    row = AuditRow.objects.first()
    assert client.get(f"/admin/veronica/auditrow/{row.pk}/delete/").status_code == 403
    assert client.post("/admin/veronica/auditrow/add/", {}).status_code == 403
