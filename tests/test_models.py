import pytest
from django.db import IntegrityError, transaction

from veronica.models import Member, Role, Task


def test_two_leaders_are_refused_by_the_database(space):
    with pytest.raises(IntegrityError), transaction.atomic():
        Member.objects.create(space=space, name="second-boss", role=Role.LEADER)


def test_a_removed_leader_frees_the_leader_slot(space):
    boss = space.members.get(role=Role.LEADER)
    Member.objects.filter(pk=boss.pk).update(removed_at="2026-01-01T00:00:00Z")
    Member.objects.create(space=space, name="new-boss", role=Role.LEADER)
    live = space.members.filter(role=Role.LEADER, removed_at__isnull=True)
    assert list(live.values_list("name", flat=True)) == ["new-boss"]
    assert space.members.filter(pk=boss.pk, removed_at__isnull=False).exists(), "the removed leader's row (its history) stays"
    with pytest.raises(IntegrityError), transaction.atomic():  # and the slot is taken again
        Member.objects.create(space=space, name="third-boss", role=Role.LEADER)


def test_member_name_unique_per_space_but_free_across_spaces(space, tmp_path):
    from tests.conftest import make_space

    with pytest.raises(IntegrityError), transaction.atomic():
        Member.objects.create(space=space, name="w1")
    other = make_space(tmp_path, "beta")
    assert other.members.filter(name="w1").exists()


@pytest.mark.parametrize("field,value", [("status", "exploded"), ("verify_policy", "maybe")])
def test_task_status_check_constraint(space, field, value):
    task = Task.objects.create(space=space, title="t", creator_name="boss")
    with pytest.raises(IntegrityError), transaction.atomic():
        Task.objects.filter(pk=task.pk).update(**{field: value})


@pytest.mark.parametrize("field,value", [("membership", "sleeping"), ("run_status", "dancing"), ("role", "king")])
def test_member_choice_check_constraints(space, field, value):
    with pytest.raises(IntegrityError), transaction.atomic():
        Member.objects.filter(name="w1", space=space).update(**{field: value})
