import pytest

from veronica.swarm import skills
from veronica.engine import supervisor
from veronica.plumbing.errors import Conflict, VeronicaError
from veronica.models import Member, Role, Skill


def test_freeze_and_unfreeze_emit_and_change_membership(space):
    w1 = supervisor.get_member(space, "w1")
    assert supervisor.freeze(w1, actor="t").membership == "frozen"
    assert supervisor.unfreeze(w1, actor="t").membership == "active"
    kinds = list(space.events.values_list("kind", flat=True))
    assert "member.frozen" in kinds and "member.unfrozen" in kinds


def test_leader_cannot_be_removed_and_removal_keeps_history(space):
    from veronica.swarm import bus

    with pytest.raises(Conflict, match="leader cannot be removed"):
        supervisor.remove_member(supervisor.get_member(space, "boss"), actor="t")
    bus.send(space, "boss", "w1", "hi")
    w1 = supervisor.remove_member(supervisor.get_member(space, "w1"), actor="t")
    assert w1.removed_at is not None and w1.inbox.count() == 1


def test_add_member_refuses_a_second_leader_and_bad_fields(space):
    with pytest.raises(Conflict, match="at most one"):
        supervisor.add_member(space, "boss2", role=Role.LEADER, actor="t")
    with pytest.raises(VeronicaError) as err:
        supervisor.add_member(space, "x", model="gpt", actor="t")
    assert err.value.field == "model"
    with pytest.raises(VeronicaError) as err:
        supervisor.add_member(space, "all", actor="t")
    assert err.value.field == "name"


def test_create_member_is_rolled_back_when_a_skill_fails(space):
    with pytest.raises(VeronicaError):
        supervisor.add_member(space, "newbie", actor="t", skills={"good": "body", "Bad Name!": "body"})
    assert not Member.objects.filter(name="newbie").exists()
    assert not Skill.objects.filter(name="good").exists()


def test_bad_cron_is_refused_with_the_reason(space):
    w1 = supervisor.get_member(space, "w1")
    with pytest.raises(VeronicaError, match="not a valid cron"):
        supervisor.set_schedule(w1, "every tuesday", actor="t")
    assert supervisor.set_schedule(w1, "*/5 * * * *", actor="t").schedule_origin == "runtime"
    cleared = supervisor.clear_schedule(w1, actor="t")
    assert cleared.schedule == "" and cleared.schedule_tombstone


def test_spawn_cap_and_retire(space):
    space.spawn_cap = 1
    space.save()
    w1 = supervisor.get_member(space, "w1")
    clone = supervisor.spawn(w1, actor="boss")
    assert clone.name == "w1-1" and clone.spawned_from == w1
    with pytest.raises(Conflict, match="spawn cap"):
        supervisor.spawn(w1, actor="boss")
    with pytest.raises(VeronicaError, match="manifest member"):
        supervisor.retire(w1, actor="boss")
    supervisor.retire(clone, actor="boss")
    again = supervisor.spawn(w1, actor="boss")
    assert again.name == "w1-2"  # clone numbers are never reused


def test_clear_and_compact_refuse_a_busy_member(space):
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="abc")
    with pytest.raises(Conflict, match="while it is running"):
        supervisor.clear_session(w1, actor="t")
    with pytest.raises(Conflict, match="while it is running"):
        supervisor.compact(w1, "micro", actor="t")


def test_suspend_flags_cancel_only_for_a_run_in_flight(space):
    w1, w2 = supervisor.get_member(space, "w1"), supervisor.get_member(space, "w2")
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="abc")
    assert supervisor.suspend(w1, actor="t").cancel_requested is True
    assert supervisor.suspend(w2, actor="t").cancel_requested is False
    assert supervisor.resume(w2, actor="t").run_status == "idle"
    assert supervisor.halt_all(space, actor="t") == 2  # boss and w2; w1 already suspended


def test_skill_changes_apply_at_each_members_next_run(space):
    from veronica.agent.prompt import system_prompt

    skills.add_skill(space, "style", "be brief")
    assert all("## style\nbe brief" in system_prompt(m) for m in Member.objects.filter(space=space)), "the prompt is built per run"
    with pytest.raises(Conflict):
        skills.add_skill(space, "style", "again")
    w1 = supervisor.get_member(space, "w1")
    skills.add_skill(space, "style", "be thorough", member=w1)
    assert [s.body for s in skills.skills_for(w1)] == ["be thorough"]
    skills.remove_skill(space, "style", member=w1)
    assert [s.body for s in skills.skills_for(w1)] == ["be brief"]
