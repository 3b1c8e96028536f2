"""The two loops end to end through the agent runtime: waggle replays a repeated route, and a
denied call with a reason becomes a reviewed rule in the member's next system prompt."""
from django.db.models import Sum

from veronica.swarm import bus
from veronica.engine import approvals, runner, supervisor
from veronica.engine.drive import run_until_quiet
from veronica.portable.manifest import register
from veronica.models import Approval, Member, Run, Space
from veronica.portable.seed import DEMO_GOAL


def _round(space: Space) -> int:
    first = Run.objects.order_by("-id").values_list("id", flat=True).first() or 0
    bus.send(space, "operator", "leader", DEMO_GOAL)
    run_until_quiet(space)
    for member in space.members.filter(removed_at__isnull=True):
        supervisor.clear_session(member, actor="test")
    return Run.objects.filter(pk__gt=first).aggregate(n=Sum("model_calls"))["n"]


def test_the_demo_team_run_twice_replays_routes_and_needs_fewer_model_calls(db, demo_manifest):
    from waggle.models import LedgerEntry

    space = register(demo_manifest)
    first = _round(space)
    replays_before = LedgerEntry.objects.filter(fail=False).count()
    second = _round(space)
    assert LedgerEntry.objects.filter(fail=False).count() > replays_before
    assert second < first, f"second run made {second} model calls, the first {first}"
    assert space.events.filter(kind="waggle.replayed").exists()
    third = _round(space)  # the same workspace a third time: fewer again
    assert third < second, f"third run made {third} model calls, the second {second}"


def test_a_denial_with_a_reason_becomes_a_rule_in_the_next_system_prompt(space, scripted, django_user_model):
    from learning import api as learning
    from learning.models import Proposal

    operator = django_user_model.objects.create_user("op")
    w1 = supervisor.set_permission_mode(supervisor.get_member(space, "w1"), "default", actor="op")
    Member.objects.filter(pk=w1.pk).update(rule_domains=["ops"])
    provider = scripted(("run_command", {"command": "rm -rf build"}), "ok", "hello again")
    bus.send(space, "boss", "w1", "clean the build")
    runner.wake(w1.pk, "message")
    approvals.decide(Approval.objects.get(), approve=False, user=operator, reason="never delete build outputs; ask the leader first")
    runner.wake(w1.pk, "resume")
    assert "Rules" not in provider.systems[-1] and "never delete" not in provider.systems[-1]

    learning.run_reflect()
    learning.run_learn(domain="ops")
    proposal = Proposal.objects.get(status="pending")
    learning.approve_proposal(proposal.pk, actor=operator)

    bus.send(space, "boss", "w1", "next job")
    runner.wake(w1.pk, "message")
    assert "never delete build outputs" in provider.systems[-1]


def test_the_mail_that_woke_a_member_replays_the_call_it_names_before_the_model_asks(space, scripted):
    """An inbound route (learned: a file named in the mail is read first) runs before the first
    model call; its block is appended to the brief, and the model's reply settles it as used."""
    from pathlib import Path

    from waggle.inbound import TokenShape, route_of
    from waggle.inbound import Heard
    from waggle.models import LedgerEntry, Waggle

    Path(space.workdir, "notes").mkdir()
    Path(space.workdir, "notes", "plan.md").write_text("step one: ship release R7-alpha\n")
    shape = TokenShape.learn(["docs/a.md", "src/main.py", "notes/todo.txt"])
    route = route_of(Heard(tool="read_file", key="path", literals=(), shape=shape, rivals=(), contexts=5, used=5.0))
    Waggle.objects.create(name=route.name, space_key=str(space.pk), route=route.to_json(), script="x", length=1)
    provider = scripted(("task_list", {}), "It says to ship release R7-alpha.")  # the answer draws on the replay
    bus.send(space, "boss", "w1", "Please look at notes/plan.md and tell me what it says.")
    runner.wake(supervisor.get_member(space, "w1").pk, "message")
    brief = provider.requests[0][-1]["content"]
    assert "[waggle: replayed 1 step]" in brief and "step one: ship release R7-alpha" in brief
    assert brief.index("## Unread mail") < brief.index("[waggle:")  # the mail comes first, the replay after it
    entry = LedgerEntry.objects.get(name=route.name)
    assert entry.settled and entry.used_steps == 1  # the model did not read the file again
    assert space.events.filter(kind="waggle.replayed").exists()
