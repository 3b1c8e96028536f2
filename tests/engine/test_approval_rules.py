"""Approvals (issue 22.7): approve once, or always for this tool on this member (a rule the gate
consults per call, revocable); the run trace shows whole tool results and links an approval
chain's runs."""
from __future__ import annotations

import pytest

from veronica.web import run_trace
from veronica.swarm import bus
from veronica.engine import approvals, runner, supervisor
from veronica.plumbing.errors import Conflict, VeronicaError
from veronica.models import Approval, ApprovalRule, Event, Run


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("op")


def held_w1(space):
    return supervisor.set_permission_mode(supervisor.get_member(space, "w1"), "default", actor="op")


def test_always_approves_this_call_and_the_next_ones_of_that_tool_until_revoked(space, scripted, tmp_path, operator):
    w1 = held_w1(space)
    scripted(("write_file", {"path": "a.txt", "content": "a"}), "wrote a",
             ("write_file", {"path": "b.txt", "content": "b"}), ("run_command", {"command": "true"}), "wrote b",
             ("write_file", {"path": "c.txt", "content": "c"}), "never")
    bus.send(space, "boss", "w1", "write a")
    assert runner.wake(w1.pk, "message") == "waiting"
    approvals.decide(Approval.objects.get(), approve=True, user=operator, always=True)
    rule = ApprovalRule.objects.get()
    assert (rule.member_id, rule.tool_name, rule.created_by, rule.revoked_at) == (w1.pk, "write_file", operator, None)
    assert runner.wake(w1.pk, "resume") == "done" and (tmp_path / "alpha" / "a.txt").exists()

    bus.send(space, "boss", "w1", "write b")  # write_file runs unheld; run_command (no rule) is still held
    assert runner.wake(w1.pk, "message") == "waiting"
    assert (tmp_path / "alpha" / "b.txt").exists()
    assert list(Approval.objects.filter(status="pending").values_list("tool_name", flat=True)) == ["run_command"]
    approvals.decide(Approval.objects.get(status="pending"), approve=True, user=operator)
    assert runner.wake(w1.pk, "resume") == "done"

    approvals.revoke_rule(rule, user=operator)
    bus.send(space, "boss", "w1", "write c")
    assert runner.wake(w1.pk, "message") == "waiting", "a revoked rule holds the very next call"
    assert not (tmp_path / "alpha" / "c.txt").exists()
    assert [e.payload["tool"] for e in Event.objects.filter(kind__in=["approval.rule_added", "approval.rule_revoked"])] == [
        "write_file", "write_file"]


def test_a_rule_is_for_one_member_and_bad_decisions_are_refused(space, operator):
    w1, w2 = held_w1(space), supervisor.get_member(space, "w2")
    approvals.allow_always(w1, "write_file", user=operator)
    assert approvals.always_allowed(w1, "write_file") and not approvals.always_allowed(w2, "write_file")
    assert approvals.allow_always(w1, "write_file", user=operator).pk == ApprovalRule.objects.get().pk, "one live rule per tool"
    held = Approval.objects.create(space=space, member=w1, tool_name="run_command", tool_args={})
    with pytest.raises(VeronicaError, match="not a denial"):
        approvals.decide(held, approve=False, user=operator, always=True)
    with pytest.raises(VeronicaError, match="true or false"):
        approvals.decide(held, approve=True, user=operator, always="yes")
    assert Approval.objects.get(pk=held.pk).status == "pending", "a refused decision leaves nothing half-written"
    approvals.revoke_rule(ApprovalRule.objects.get(), user=operator)
    with pytest.raises(Conflict):
        approvals.revoke_rule(ApprovalRule.objects.get(), user=operator)


def test_the_trace_shows_whole_tool_results_and_links_the_chains_runs(space, scripted, tmp_path, operator):
    (tmp_path / "alpha" / "big.txt").write_text("line of text\n" * 100)  # 1300 characters
    w1 = held_w1(space)
    scripted(("read_file", {"path": "big.txt"}), ("write_file", {"path": "out.txt", "content": "x"}), "done")
    bus.send(space, "boss", "w1", "copy it")
    assert runner.wake(w1.pk, "message") == "waiting"
    approvals.decide(Approval.objects.get(), approve=True, user=operator)
    assert runner.wake(w1.pk, "resume") == "done"
    first, second = Run.objects.order_by("id")
    read = next(r for r in run_trace.trace(first)["rows"] if r["name"] == "read_file")
    assert read["chars"] == len(read["text"]) and read["text"].count("line of text") == 100
    chain = [(c["run"], c["current"]) for c in run_trace.trace(second)["chain"]]
    assert chain == [(first.pk, False), (second.pk, True)]
    assert [c["run"] for c in run_trace.trace(first)["chain"]] == [first.pk, second.pk]
