"""learning alone: domains are per owner (an opaque key), global domains are shared on purpose,
and every id-addressed write can be fenced to a caller's domains."""
import pytest
from django.db import IntegrityError, transaction

from learning import api, store
from learning.models import Domain, Proposal, Reflection, Rule
from learning.sources import Correction, StaticSource

pytestmark = pytest.mark.django_db


def test_the_same_name_under_two_owners_is_two_domains():
    mine, theirs = store.domain_for("conduct", "t:1"), store.domain_for("conduct", "t:2")
    assert mine != theirs and (mine.label, theirs.label) == ("t:1/conduct", "t:2/conduct")
    assert store.domain_for("conduct", "t:1") == mine  # found, not created again
    api.add_user_rule("conduct", "One's rule.", actor="a", owner="t:1")
    api.add_user_rule("conduct", "Two's rule.", actor="b", owner="t:2")
    one, two = api.prompt_block(["conduct"], owner="t:1"), api.prompt_block(["conduct"], owner="t:2")
    assert "One's rule." in one and "Two's rule." not in one
    assert "Two's rule." in two and "One's rule." not in two
    assert api.prompt_block(["conduct"], owner="t:3") is None
    assert api.prompt_block(["conduct"]) is None  # the unowned namespace is yet another one


def test_global_domains_are_never_made_on_the_fly_and_are_read_by_every_owner():
    assert store.domain_for("global:house", "t:1") is None
    with pytest.raises(api.RuleInputError) as exc:
        api.add_user_rule("global:house", "x", actor="a", owner="t:1")
    assert exc.value.field == "domain" and not Domain.objects.exists() and not Rule.objects.exists()
    shared = Domain.objects.create(name="house", is_global=True)
    api.add_user_rule(shared, "House rule.", actor="staff")
    for owner in ("t:1", "t:2"):
        assert "(global:house) House rule." in api.prompt_block(["global:house"], owner=owner)
        assert api.prompt_block(["house"], owner=owner) is None  # a bare name is the owner's own
    with pytest.raises(IntegrityError), transaction.atomic():
        Domain.objects.create(name="house", is_global=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        Domain.objects.create(name="other", is_global=True, owner="t:1")


def test_scope_makes_another_owners_ids_not_found():
    mine = store.domain_for("conduct", "t:1")
    theirs_rule = api.add_user_rule("conduct", "Theirs.", actor="b", owner="t:2")
    store.apply_ops(theirs_rule.domain, [{"op": "add", "text": "Learned theirs."}], actor="t")
    learned = Rule.objects.get(source="learned")
    proposal = Proposal.objects.create(domain=theirs_rule.domain, ops=[{"op": "agree", "rule": learned.pk}])
    with pytest.raises(api.RuleInputError):
        api.edit_user_rule(theirs_rule.pk, "Mine now.", actor="a", scope=[mine])
    with pytest.raises(api.RuleInputError):
        api.remove_user_rule(theirs_rule.pk, actor="a", scope=[mine])
    with pytest.raises(Rule.DoesNotExist):
        api.set_learned_enabled(learned.pk, False, actor="a", scope=[mine])
    with pytest.raises(api.ReviewError):
        api.approve_proposal(proposal.pk, actor="a", scope=[mine])
    with pytest.raises(api.ReviewError):
        api.reject_proposal(proposal.pk, actor="a", scope=[mine])
    with pytest.raises(api.ReviewError):
        api.revert_change(theirs_rule.domain.changes.first().pk, actor="a", scope=[mine])
    own = api.add_user_rule(mine, "Mine.", actor="a")
    with pytest.raises(api.RuleInputError):  # nor move one's own rule into another owner's domain
        api.edit_user_rule(own.pk, "Mine.", actor="a", domain=theirs_rule.domain, scope=[mine])
    assert Rule.objects.get(pk=theirs_rule.pk).text == "Theirs." and Rule.objects.get(pk=learned.pk).enabled
    assert Proposal.objects.get(pk=proposal.pk).status == "pending" and Rule.objects.get(pk=own.pk).domain == mine


def test_passes_keep_each_owners_lessons_in_its_own_domains():
    source = StaticSource(correction_items=[
        Correction("c1", ["conduct"], "approval denied: x; reason: never do one's thing", owner="t:1"),
        Correction("c2", ["conduct"], "approval denied: y; reason: never do two's thing", owner="t:2"),
    ])
    api.run_reflect(source=source)
    assert {(r.domain.label, r.text.split("never do ")[-1]) for r in Reflection.objects.all()} >= {
        ("t:1/conduct", "one's thing."), ("t:2/conduct", "two's thing.")}
    run = api.run_learn(domain=store.domain_for("conduct", "t:1"), auto_approve=True)
    assert run.stats.get("auto_approved") == 1
    assert "one's thing" in api.prompt_block(["conduct"], owner="t:1")
    assert api.prompt_block(["conduct"], owner="t:2") is None  # its reflections wait for its own pass
    api.run_learn(auto_approve=lambda d: d.owner == "t:2")
    assert "two's thing" in api.prompt_block(["conduct"], owner="t:2")
    assert "two's thing" not in api.prompt_block(["conduct"], owner="t:1")


def test_changing_a_domains_owner_invalidates_cached_blocks():
    d = store.domain_for("conduct", "t:1")
    api.add_user_rule(d, "Moves with the domain.", actor="a")
    assert api.prompt_block(["conduct"], owner="t:1")
    d.owner = "t:2"
    d.save()
    assert api.prompt_block(["conduct"], owner="t:1") is None
    assert "Moves with the domain." in api.prompt_block(["conduct"], owner="t:2")
