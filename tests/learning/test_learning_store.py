"""Rules per domain, the prompt block, user-rule writes, history and revert."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from learning import api, store
from learning.models import ChangeAction, Rule, RuleChange, RuleSource, StoreState, UserRuleWriteRefused

pytestmark = pytest.mark.django_db


def learn(domain, *texts, actor="t"):
    store.apply_ops(domain, [{"op": "add", "text": t} for t in texts], actor=actor)
    return list(Rule.objects.filter(domain__name=domain, source=RuleSource.LEARNED).order_by("id"))


# --- prompt block ---------------------------------------------------------------------------------

def test_prompt_block_routed_domains_only_user_first_enabled_learned_only():
    learn("ops", "Learned ops A.", "Learned ops B.")
    api.add_user_rule("ops", "User ops rule.", actor="alice")
    api.add_user_rule("writing", "User writing rule.", actor="alice")
    learn("triage", "Triage only.")
    b_rule = Rule.objects.get(text="Learned ops B.")
    api.set_learned_enabled(b_rule.pk, False, actor="alice")

    block = api.prompt_block(["ops"])
    assert "User ops rule." in block and "Learned ops A." in block
    assert "Learned ops B." not in block  # disabled
    assert "User writing rule." not in block and "Triage only." not in block  # not routed
    assert block.index("User ops rule.") < block.index("Learned ops A.")

    both = api.prompt_block(["writing", "ops"])
    # every user rule (of every routed domain) comes before any learned rule
    assert both.index("User writing rule.") < both.index("User ops rule.") < both.index("Learned ops A.")


def test_prompt_block_is_none_when_nothing_applies():
    assert api.prompt_block([]) is None
    assert api.prompt_block(["ops"]) is None
    learn("ops", "Only rule.")
    api.set_learned_enabled(Rule.objects.get().pk, False, actor="a")
    assert api.prompt_block(["ops"]) is None  # no empty heading for disabled-only domains
    assert api.prompt_block(["other"]) is None


def test_learned_rules_ordered_by_strength():
    rules = learn("ops", "Weak.", "Strong.")
    store.apply_ops("ops", [{"op": "agree", "rule": rules[1].pk}], actor="t")
    block = api.prompt_block(["ops"])
    assert block.index("Strong.") < block.index("Weak.")


def test_prompt_block_query_budget_and_cache_invalidation():
    learn("ops", "First.")
    with CaptureQueriesContext(connection) as cold:
        first = api.prompt_block(["ops"])
    assert len(cold) == 2  # stamp + rules
    with CaptureQueriesContext(connection) as warm:
        assert api.prompt_block(["ops"]) == first
    assert len(warm) == 1  # stamp only
    with CaptureQueriesContext(connection) as none:
        api.prompt_block([])
    assert len(none) == 0

    api.add_user_rule("ops", "New user rule.", actor="a")  # any write changes the stamp
    assert "New user rule." in api.prompt_block(["ops"])
    StoreState.objects.filter(pk=1).update(stamp=12345)  # what another process's write looks like
    Rule.objects.filter(source=RuleSource.LEARNED).update(text="Changed elsewhere.")
    assert "Changed elsewhere." in api.prompt_block(["ops"])


def test_prompt_block_takes_no_transaction():
    learn("ops", "R.")
    with CaptureQueriesContext(connection) as ctx:
        api.prompt_block(["ops"])
        store.clear_cache()
        api.prompt_block(["ops"])
    sql = " ".join(q["sql"].upper() for q in ctx.captured_queries)
    assert "BEGIN" not in sql and "FOR UPDATE" not in sql and "SAVEPOINT" not in sql


# --- user rules: only people write them ---------------------------------------------------------

def test_user_rule_crud_records_history(django_user_model):
    user = django_user_model.objects.create_user("carol", password="x" * 12)
    rule = api.add_user_rule("Ops", "  Be careful.  ", actor=user)
    assert (rule.domain.name, rule.text, rule.source, rule.created_by) == ("ops", "Be careful.", "user", "carol")
    api.edit_user_rule(rule.pk, "Be very careful.", actor="dave")
    api.remove_user_rule(rule.pk, actor="erin")
    history = list(RuleChange.objects.order_by("id"))
    assert [(h.action, h.actor, h.source) for h in history] == [
        ("add", "carol", "user"), ("edit", "dave", "user"), ("remove", "erin", "user")]
    assert history[1].before[0]["text"] == "Be careful." and history[1].after[0]["text"] == "Be very careful."
    assert history[1].diff[0]["sign"] == "~"
    assert all(h.created_at for h in history)


@pytest.mark.parametrize("kwargs,field", [
    ({"domain": "Bad Domain!", "text": "x"}, "domain"),
    ({"domain": "", "text": "x"}, "domain"),
    ({"domain": "ops", "text": "   "}, "text"),
    ({"domain": "ops", "text": "x" * 1001}, "text"),
])
def test_user_rule_bad_input_names_the_field(kwargs, field):
    with pytest.raises(api.RuleInputError) as exc:
        api.add_user_rule(**kwargs, actor="a")
    assert exc.value.field == field
    assert not Rule.objects.exists() and not RuleChange.objects.exists()


def test_user_rule_needs_an_actor():
    with pytest.raises(api.RuleInputError):
        api.add_user_rule("ops", "x", actor="")


def test_user_rules_cannot_be_written_outside_the_people_api():
    with pytest.raises(UserRuleWriteRefused):
        Rule(domain=store.domain_for("ops"), source=RuleSource.USER, text="sneaky").save()
    rule = api.add_user_rule("ops", "Mine.", actor="a")
    rule.text = "changed"
    with pytest.raises(UserRuleWriteRefused):
        rule.save()
    with pytest.raises(UserRuleWriteRefused):
        rule.delete()
    # bulk paths too
    with pytest.raises(UserRuleWriteRefused):
        Rule.objects.filter(domain__name="ops").update(text="bulk")
    with pytest.raises(UserRuleWriteRefused):
        Rule.objects.all().delete()
    with pytest.raises(UserRuleWriteRefused):
        Rule.objects.bulk_create([Rule(domain=rule.domain, source=RuleSource.USER, text="bulk")])
    with pytest.raises(UserRuleWriteRefused):
        Rule.objects.bulk_update([rule], ["text"])
    assert Rule.objects.get(pk=rule.pk).text == "Mine."
    Rule(domain=rule.domain, source=RuleSource.LEARNED, text="learned rows are fine").save()
    Rule.objects.filter(source=RuleSource.LEARNED).update(enabled=False)


# --- history and revert ---------------------------------------------------------------------------

def test_revert_user_rule_changes():
    rule = api.add_user_rule("ops", "One.", actor="a")
    edit = RuleChange.objects.latest("id")
    api.edit_user_rule(rule.pk, "Two.", actor="b")
    edit = RuleChange.objects.latest("id")
    revert = api.revert_change(edit.pk, actor="c")
    assert revert.action == ChangeAction.REVERT and revert.reverts_id == edit.pk and revert.actor == "c"
    assert Rule.objects.get(pk=rule.pk).text == "One."
    with pytest.raises(api.ReviewError):
        api.revert_change(edit.pk, actor="c")  # already reverted

    api.remove_user_rule(rule.pk, actor="a")
    removal = RuleChange.objects.latest("id")
    api.revert_change(removal.pk, actor="c")
    assert Rule.objects.get(source="user").text == "One."

    add = RuleChange.objects.filter(action="add").first()
    with pytest.raises(api.ReviewError):  # that rule row is gone; reverting the add makes no sense now
        api.revert_change(add.pk, actor="c")


def test_revert_user_rule_move_between_domains():
    rule = api.add_user_rule("ops", "Move me.", actor="a")
    api.edit_user_rule(rule.pk, "Move me.", domain="writing", actor="a")
    move = RuleChange.objects.latest("id")
    assert move.domain.name == "writing" and move.before[0]["domain"] == "unowned/ops"
    api.revert_change(move.pk, actor="b")
    assert Rule.objects.get(pk=rule.pk).domain.name == "ops"


def test_revert_learned_change_and_conflict():
    learn("ops", "A.", "B.")
    first = RuleChange.objects.latest("id")
    a = Rule.objects.get(text="A.")
    store.apply_ops("ops", [{"op": "edit", "rule": a.pk, "text": "A2."}], actor="t")
    second = RuleChange.objects.latest("id")
    with pytest.raises(api.ReviewError):  # a later change touched the domain: revert that first
        api.revert_change(first.pk, actor="p")
    api.revert_change(second.pk, actor="p")
    assert Rule.objects.get(pk=a.pk).text == "A."
    api.revert_change(first.pk, actor="p")
    assert not Rule.objects.filter(source="learned").exists()
    assert api.prompt_block(["ops"]) is None


def test_set_learned_enabled_records_history():
    [rule] = learn("ops", "A.")
    change = api.set_learned_enabled(rule.pk, False, actor="p")
    assert change.action == "disable" and change.diff[0]["sign"] == "-"
    assert api.set_learned_enabled(rule.pk, False, actor="p") is None  # no-op, no history
    api.revert_change(change.pk, actor="q")
    assert Rule.objects.get(pk=rule.pk).enabled
    with pytest.raises(Rule.DoesNotExist):
        api.set_learned_enabled(api.add_user_rule("ops", "U.", actor="a").pk, False, actor="p")
