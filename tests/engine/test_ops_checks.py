"""Verify checks (issue 11 item 1) through the tools a leader and a worker call, then the django-q2
task the ledger enqueues (run here in-process; tests/engine/test_cluster.py runs it in a real cluster)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from veronica.swarm import ledger
from veronica.portable import manifest
from veronica.agent.tools import ToolContext, swarm
from veronica.engine import check_queue, checks, supervisor
from veronica.plumbing.errors import VeronicaError
from veronica.models import Event, Message, Task, TaskCheck

CHECKS = [{"name": "has-ok", "command": "test -f ok.txt && echo found ok.txt", "timeout": 5},
          {"name": "where", "command": "pwd", "timeout": 5}]


@pytest.fixture
def queued(monkeypatch):
    """What the ledger enqueued (the on-commit django-q2 task), in order."""
    seen: list[int] = []
    monkeypatch.setattr(check_queue, "enqueue", seen.append)
    return seen


def tool_ctx(space, name: str) -> ToolContext:
    return ToolContext(member=supervisor.get_member(space, name), space=space)


def checks_task(space, django_capture_on_commit_callbacks, queued) -> Task:
    checks.configure(space, CHECKS, actor="test")
    swarm.task_create(tool_ctx(space, "boss"), {"title": "write ok.txt", "assignee": "w1", "verify": "checks"})
    task = Task.objects.get(space=space, title="write ok.txt")
    with django_capture_on_commit_callbacks(execute=True):
        out = swarm.task_done(tool_ctx(space, "w1"), {"task_id": task.pk, "result": "written"})
    assert "verifying" in out and "checks (has-ok, where) are queued" in out
    assert queued == [task.pk]
    return task


def test_a_failing_check_sends_the_task_back_to_its_assignee_with_the_evidence(space, django_capture_on_commit_callbacks, queued):
    task = checks_task(space, django_capture_on_commit_callbacks, queued)
    assert checks.run_checks(task.pk) == {"task": task.pk, "passed": False, "attempt": 1}
    task.refresh_from_db()
    assert task.status == "running" and task.check_claimed_at is None
    assert "has-ok: FAILED (exit 1)" in task.check_evidence and "where: passed (exit 0)" in task.check_evidence
    rows = {r.name: r for r in TaskCheck.objects.filter(task=task)}
    assert rows["has-ok"].exit_code == 1 and not rows["has-ok"].passed
    assert rows["where"].output == "/workspace", "checks run in run_command's sandbox"
    mail = Message.objects.filter(recipient__name="w1", subject=f"Task #{task.pk}: checks failed").get()
    assert "has-ok: FAILED" in mail.body and "task_done" in mail.body
    done = Event.objects.filter(space=space, kind="task.check_done").get()
    assert done.payload["passed"] is False and [c["name"] for c in done.payload["checks"]] == ["has-ok", "where"]


def test_passing_checks_move_the_task_to_done_on_the_second_attempt(space, tmp_path, django_capture_on_commit_callbacks, queued):
    task = checks_task(space, django_capture_on_commit_callbacks, queued)
    checks.run_checks(task.pk)
    (tmp_path / "alpha" / "ok.txt").write_text("ok\n")
    with django_capture_on_commit_callbacks(execute=True):
        swarm.task_done(tool_ctx(space, "w1"), {"task_id": task.pk, "result": "fixed"})
    assert checks.run_checks(task.pk) == {"task": task.pk, "passed": True, "attempt": 2}
    task.refresh_from_db()
    assert task.status == "done" and "has-ok: passed" in task.check_evidence
    assert Message.objects.filter(recipient__name="boss", subject=f"Task #{task.pk} done (checks passed)").exists()
    assert checks.counts([space.pk])[space.pk] == {"run": 4, "failed": 1, "timed_out": 0}


def test_a_timeout_is_a_failure_with_evidence(space, django_capture_on_commit_callbacks, queued):
    checks.configure(space, [{"name": "slow", "command": "echo started; sleep 30", "timeout": 1}], actor="test")
    task = ledger.create_task(space, "boss", "slow one", assignee=supervisor.get_member(space, "w1"), verify_policy="checks")
    ledger.complete(task, actor="w1", result="done")
    checks.run_checks(task.pk)
    row = TaskCheck.objects.get(task=task)
    assert row.timed_out and row.exit_code is None and not row.passed
    assert row.output.startswith("timed out after 1 s") and "started" in row.output
    assert row.duration_ms < 10_000, "the whole process group was killed, not waited for"
    assert Task.objects.get(pk=task.pk).status == "running"
    assert checks.counts([space.pk])[space.pk] == {"run": 1, "failed": 1, "timed_out": 1}


def test_a_claimed_verification_runs_once(space, queued):
    checks.configure(space, CHECKS, actor="test")
    task = ledger.create_task(space, "boss", "t", assignee=supervisor.get_member(space, "w1"), verify_policy="checks")
    ledger.complete(task, actor="w1", result="r")
    Task.objects.filter(pk=task.pk).update(check_claimed_at=timezone.now())  # another worker holds it
    assert checks.run_checks(task.pk) is None
    assert not TaskCheck.objects.exists()
    Task.objects.filter(pk=task.pk).update(check_claimed_at=timezone.now() - timedelta(hours=1))  # that worker died
    assert checks.run_checks(task.pk)["attempt"] == 1


def test_the_tick_recovers_a_verification_whose_enqueue_was_lost(space, queued):
    checks.configure(space, CHECKS, actor="test")
    task = ledger.create_task(space, "boss", "t", assignee=supervisor.get_member(space, "w1"), verify_policy="checks")
    ledger.complete(task, actor="w1", result="r")
    assert checks.recover() == 0, "a fresh verification is left to its own enqueue"
    Task.objects.filter(pk=task.pk).update(updated_at=timezone.now() - timedelta(minutes=5))
    assert checks.recover() == 1 and queued == [task.pk]


def test_task_create_refuses_verify_checks_when_the_space_has_none(space):
    with pytest.raises(VeronicaError, match="configures none") as err:
        swarm.task_create(tool_ctx(space, "boss"), {"title": "x", "verify": "checks"})
    assert err.value.field == "verify"
    assert not Task.objects.filter(space=space).exists()


@pytest.mark.parametrize("spec, problem", [
    ([{"name": "a", "command": ""}], "command must be a non-empty string"),
    ([{"name": "a", "command": "true", "timeout": 0}], "timeout must be an integer from 1 to 1800"),
    ([{"name": "a b", "command": "true"}], "name must be 1-60"),
    ([{"name": "a", "command": "true"}, {"name": "a", "command": "false"}], "'a' is used twice"),
    ([{"name": "a", "command": "true", "shell": "zsh"}], "shell: unknown key"),
    ("make test", "must be a list"),
    ([{"name": f"c{i}", "command": "true", "timeout": 300} for i in range(4)], "add up to 1200 s"),
])
def test_bad_check_specs_are_refused_naming_the_entry(space, spec, problem):
    with pytest.raises(VeronicaError, match=problem):
        checks.configure(space, spec, actor="test")


def test_the_manifest_configures_checks_and_the_notifier(db, tmp_path):
    root = tmp_path / "team"
    (root / "workspace").mkdir(parents=True)
    (root / "members" / "lead").mkdir(parents=True)
    (root / "members" / "lead" / "member.toml").write_text('role = "leader"\n')
    (root / "members" / "lead" / "persona.md").write_text("Lead.\n")
    space_toml = root / "space.toml"
    space_toml.write_text('name = "Team"\n[settings]\nstuck_run_minutes = 15\nmailbox_backlog_minutes = 45\n'
                          '[notify]\nwebhook_url = "https://hooks.example.com/ops"\nemail = ["ops@example.com"]\n'
                          '[[verify_checks]]\nname = "tests"\ncommand = "make test"\ntimeout = 120\n')
    space = manifest.register(root)
    assert space.verify_checks == [{"name": "tests", "command": "make test", "timeout": 120}]
    assert space.notify_webhook_url == "https://hooks.example.com/ops" and space.notify_emails == "ops@example.com"
    assert (space.stuck_run_minutes, space.mailbox_backlog_minutes) == (15, 45)
    space_toml.write_text('name = "Team"\n[[verify_checks]]\nname = "tests"\ncommand = "make test"\ntimeout = 0\n')
    with pytest.raises(manifest.ManifestError, match=r"space.toml: verify_checks: verify_checks\[0\].timeout"):
        manifest.load(root)
    space_toml.write_text('name = "Team"\n[notify]\nwebhook_url = "file:///etc/passwd"\n')
    with pytest.raises(manifest.ManifestError, match="notify.webhook_url: webhook_url must be an http:// or https:// URL"):
        manifest.load(root)
