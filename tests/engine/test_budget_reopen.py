"""A tripped day reopens (issue 22.6): the run after an owner's reset is metered from the reset,
on the run's own metering path (on PostgreSQL the fence statement carries it)."""
from __future__ import annotations

from veronica.swarm import bus
from veronica.engine import budget, runner, supervisor
from veronica.models import Member, Run


def test_after_a_reset_the_member_runs_again_and_its_budget_counts_from_the_reset(space, scripted, rung,
                                                                                  django_capture_on_commit_callbacks):
    Member.objects.filter(space=space, name="w1").update(budget_override=150)
    w1 = supervisor.get_member(space, "w1")
    scripted(("list_dir", {"path": "."}), "first answer", "second answer")
    bus.send(space, "boss", "w1", "job one")
    assert runner.wake(w1.pk, "message") == "budget"  # 110 + 110 tokens: tripped after the second call
    bus.send(space, "boss", "w1", "job two")
    assert runner.wake(w1.pk, "message") == "budget-tripped"
    rung.clear()
    with django_capture_on_commit_callbacks(execute=True):
        budget.reset_day(w1, actor="owner")
    assert rung == [(w1.pk, "resume")], "the reopened member is woken for its waiting mail"
    assert runner.wake(w1.pk, "resume") == "done"
    assert not budget.is_tripped(w1), "110 tokens since the reset are under the 150 budget"
    assert Run.objects.filter(member=w1).count() == 2
