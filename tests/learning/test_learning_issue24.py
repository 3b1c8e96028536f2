"""Issue 24, point 7: learning loses nothing and keeps its cap."""
import pytest

from learning import api, people, store
from learning.models import Proposal, Reflection, Rule, RuleChange
from learning.ops import GateError
from learning.sources import Correction, StaticSource

pytestmark = pytest.mark.django_db


def fill(n, domain="ops"):
    store.apply_ops(domain, [{"op": "add", "text": f"Existing rule number {i}."} for i in range(12)], actor="t")
    store.apply_ops(domain, [{"op": "add", "text": f"More rule number {i}."} for i in range(n - 12)], actor="t")


def active():
    return Rule.objects.filter(source="learned", enabled=True).count()


def test_reenabling_a_disabled_learned_rule_at_the_cap_is_refused_on_every_path():
    fill(25)
    rule = Rule.objects.filter(source="learned").first()
    people.set_learned_enabled(rule.pk, False, actor="op")
    store.apply_ops("ops", [{"op": "add", "text": "Never deploy on Fridays."}], actor="t")
    assert active() == 25
    with pytest.raises(GateError, match="limit is 25"):
        people.set_learned_enabled(rule.pk, True, actor="op")
    assert active() == 25
    rule.refresh_from_db()
    assert not rule.enabled
    # below the cap it is enabled as before
    other = Rule.objects.filter(source="learned", enabled=True).exclude(pk=rule.pk).first()
    people.set_learned_enabled(other.pk, False, actor="op")
    people.set_learned_enabled(rule.pk, True, actor="op")
    assert active() == 25


def test_reverting_a_disable_refuses_to_grow_a_domain_past_the_cap():
    fill(25)
    domain = Rule.objects.filter(source="learned").first().domain
    Rule.objects.create(domain=domain, source="learned", text="A rule from before the cap held.")  # 26: legacy
    rule = Rule.objects.filter(source="learned").first()
    people.set_learned_enabled(rule.pk, False, actor="op")
    assert active() == 25
    with pytest.raises(people.ReviewError, match="limit is 25"):  # undoing the disable would make 26
        people.revert_change(RuleChange.objects.latest("id").pk, actor="op")
    assert active() == 25


def test_the_admin_form_refuses_to_enable_a_learned_rule_at_the_cap():
    from learning.admin import RuleForm

    fill(25)
    rule = Rule.objects.filter(source="learned").first()
    people.set_learned_enabled(rule.pk, False, actor="op")
    store.apply_ops("ops", [{"op": "add", "text": "Never deploy on Fridays."}], actor="t")
    form = RuleForm({"domain": rule.domain_id, "text": rule.text, "enabled": True}, instance=Rule.objects.get(pk=rule.pk))
    assert not form.is_valid() and "limit is 25" in str(form.errors["enabled"])


def test_only_the_reflections_a_proposal_covers_are_consumed():
    domain = store.domain_for("ops")
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    for i in range(40):
        Reflection.objects.create(kind="correction", item_key=f"c{i}", domain=domain,
                                  text=f"Always check {words[i % 8]}{i} before {words[(i + 3) % 8]}{i} at {i}x.")
    run = api.run_learn()
    proposal = Proposal.objects.get()
    assert len(proposal.ops) == 12
    assert Reflection.objects.filter(consumed_at__isnull=False).count() == 12
    assert set(Reflection.objects.filter(proposal=proposal).values_list("item_key", flat=True)) == {f"c{i}" for i in range(12)}
    assert run.stats["reflections_waiting"] == 28
    # the rest wait for the next pass, which proposes the next twelve
    api.run_learn()
    assert Proposal.objects.count() == 2 and Reflection.objects.filter(consumed_at__isnull=True).count() == 16


def test_a_member_with_two_rule_domains_gets_one_proposal_for_one_lesson():
    api.run_reflect(StaticSource(correction_items=[Correction("c1", ["ops", "writing"], "never push to main")]))
    assert Reflection.objects.count() == 1
    api.run_learn()
    assert Proposal.objects.count() == 1
