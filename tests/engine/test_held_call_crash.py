"""A held or interrupted tool call across a worker crash (issue 10, recovery): an approved call is
never lost, a call whose effects leave the database (files, commands, MCP) is never run twice
silently, and a call the crash rolled back (a row-writing tool) or one that only reads is run again."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from veronica.swarm import bus, ledger
from veronica.agent.loop import INTERRUPTED
from veronica.agent.providers.base import Reply, ToolCall, Usage
from veronica.agent.tools import swarm, workspace
from veronica.engine import approvals, leases, runner, supervisor, tick
from veronica.models import Approval, Event, Member, Task, Turn, Wake



@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("op")


def w1_of(space):
    return supervisor.get_member(space, "w1")


def counted(monkeypatch, tools, name: str, *, die_first: bool = False) -> list:
    """Count the real executions of a tool; with die_first the first one applies its effect and then
    the worker dies (SIGKILL: no result, no finish)."""
    tool = next(t for t in tools if t.name == name)
    real, runs = tool.fn, []

    def fn(ctx, args):
        runs.append(args)
        out = real(ctx, args)
        if die_first and len(runs) == 1:
            raise KeyboardInterrupt("SIGKILL")
        return out
    monkeypatch.setattr(tool, "fn", fn)
    return runs


def kill_and_expire(member) -> None:
    Member.objects.filter(pk=member.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
    assert leases.expire_leases() == [member.pk]


def held_write(space, scripted, operator):
    w1 = w1_of(space)
    supervisor.set_permission_mode(w1, "default", actor="op")
    provider = scripted(("write_file", {"path": "log.txt", "content": "appended once\n"}), "written")
    bus.send(space, "boss", "w1", "write the log")
    assert runner.wake(w1.pk, "message") == "waiting"
    approvals.decide(Approval.objects.get(), approve=True, user=operator)
    return w1, provider


def test_an_approved_call_whose_worker_died_before_it_ran_runs_on_the_re_run(space, scripted, operator, rung, tmp_path, monkeypatch):
    w1, provider = held_write(space, scripted, operator)
    runs = counted(monkeypatch, workspace.TOOLS, "write_file")
    from veronica.engine import slot
    slot.claim(w1, "resume")  # the decision's run took the slot, and its worker died at once
    kill_and_expire(w1)
    assert runner.wake(w1.pk, "resume") == "done"
    assert len(runs) == 1 and (tmp_path / "alpha" / "log.txt").read_text() == "appended once\n"
    approval = Approval.objects.get()
    assert approval.consumed and approval.started_at is not None


def test_an_approved_call_whose_worker_died_while_it_ran_is_not_run_again(space, scripted, operator, rung, monkeypatch):
    w1, provider = held_write(space, scripted, operator)
    runs = counted(monkeypatch, workspace.TOOLS, "write_file", die_first=True)
    with pytest.raises(KeyboardInterrupt):
        runner.wake(w1.pk, "resume")
    assert len(runs) == 1 and Approval.objects.get().started_at is not None and not Approval.objects.get().consumed
    kill_and_expire(w1)
    assert runner.wake(w1.pk, "resume") == "done"
    assert len(runs) == 1, "the approved write ran twice"
    result = Turn.objects.filter(role="tool").last().content
    assert "interrupted while it ran" in result and "not run again" in result, "the model is told, not left guessing"
    assert provider.requests[-1][-1]["content"] == result
    assert Approval.objects.get().consumed
    assert Event.objects.filter(kind="approval.interrupted").count() == 1, "and the console shows it"


def test_a_row_writing_call_the_crash_rolled_back_is_run_again(space, scripted, rung, monkeypatch):
    """task_done commits with its result or not at all: a kill inside it leaves nothing, so the re-run
    does it (the bench's offline worker took the old "interrupted" answer as reported: 2 tasks of 120 stuck)."""
    w1 = w1_of(space)
    task = ledger.create_task(space, "boss", "the job", assignee=w1)
    # glob first: the model's turn commits on its own (glob keeps its own commits), so task_done is
    # the turn's second call, run in a transaction of its own
    scripted(Reply(tool_calls=[ToolCall(id="c1", name="glob", args={"pattern": "*.none"}),
                               ToolCall(id="c2", name="task_done", args={"task_id": task.pk, "result": "ok"})],
                   usage=Usage(input=10, output=2)), "reported")
    runs = counted(monkeypatch, swarm.TOOLS, "task_done", die_first=True)
    with pytest.raises(KeyboardInterrupt):
        runner.wake(w1.pk, "message")
    assert Task.objects.get(pk=task.pk).status == "running", "rolled back with the run's transaction"
    kill_and_expire(w1)
    assert runner.wake(w1.pk, "resume") == "done"
    assert len(runs) == 2 and Task.objects.get(pk=task.pk).status in ("done", "verifying")
    assert INTERRUPTED not in Turn.objects.filter(role="tool").last().content


def test_a_crash_inside_a_fused_step_rolls_back_the_turn_with_its_call(space, scripted, rung, monkeypatch):
    """A reply whose calls all run inside the run's transaction is one commit: a kill inside task_done
    leaves neither the call's effect nor the model's turn (nor its usage: the crash window of metering is
    the call's own, milliseconds), so the re-run asks the model again."""
    from veronica.models import UsageDay

    w1 = w1_of(space)
    task = ledger.create_task(space, "boss", "the job", assignee=w1)
    done = ("task_done", {"task_id": task.pk, "result": "ok"})
    provider = scripted(done, done, "reported")
    runs = counted(monkeypatch, swarm.TOOLS, "task_done", die_first=True)
    with pytest.raises(KeyboardInterrupt):
        runner.wake(w1.pk, "message")
    assert Task.objects.get(pk=task.pk).status == "running"
    assert not Turn.objects.filter(role="assistant").exists(), "the model's turn went with the call"
    assert not UsageDay.objects.filter(member=w1, model_calls__gt=0).exists()
    kill_and_expire(w1)
    assert runner.wake(w1.pk, "resume") == "done"
    assert len(runs) == 2 and Task.objects.get(pk=task.pk).status in ("done", "verifying")
    assert len(provider.requests) == 3 and UsageDay.objects.get(member=w1).model_calls == 2


def test_a_mutating_local_call_interrupted_in_bypass_mode_is_reported_not_rerun(space, scripted, rung, monkeypatch):
    w1 = w1_of(space)
    scripted(("write_file", {"path": "a.txt", "content": "x"}), "ok")
    runs = counted(monkeypatch, workspace.TOOLS, "write_file", die_first=True)
    bus.send(space, "boss", "w1", "write")
    with pytest.raises(KeyboardInterrupt):
        runner.wake(w1.pk, "message")
    kill_and_expire(w1)
    assert runner.wake(w1.pk, "resume") == "done"
    assert len(runs) == 1 and Turn.objects.filter(role="tool").last().content == INTERRUPTED


def test_the_sweep_rewakes_a_decided_approval_whose_wake_was_lost(space, scripted, operator, rung):
    w1, _ = held_write(space, scripted, operator)
    rung.clear()  # the decision's wake: lost with the cluster that fetched it
    assert tick.sweep_unread() == [], "fresh: its own wake may still be on the way"
    Approval.objects.update(decided_at=Now() - timedelta(minutes=1))
    Wake.objects.update(created_at=Now() - timedelta(minutes=1))  # the run that asked, long ago
    Member.objects.filter(pk=w1.pk).update(phase="waiting-approval")
    assert tick.sweep_unread() == [w1.pk] and rung == [(w1.pk, "message")]
