"""reflect, learn and distill: ledgers, bad output, auto-approve, the gate, and user rules untouched."""
import ast
import json
from pathlib import Path

import pytest

from learning import api, offline, store
from learning.models import (
    MinedItem,
    PassRun,
    Proposal,
    ProposalStatus,
    Reflection,
    Rule,
    RuleChange,
    RuleSource,
    WriterLease,
)
from learning.sources import Correction, SessionItem, StaticSource

pytestmark = pytest.mark.django_db
LEARNING = Path(__file__).resolve().parents[2] / "learning"


def user_rules_bytes():
    rows = Rule.objects.filter(source=RuleSource.USER).order_by("id").values_list(
        "id", "domain", "text", "enabled", "strength", "created_at", "updated_at", "created_by", "updated_by")
    return json.dumps([list(map(str, r)) for r in rows]).encode()


def const(answer):
    def complete(system, prompt):
        return answer
    return complete


# --- reflect --------------------------------------------------------------------------------------

def test_reflect_mines_each_item_once_into_reflections(source):
    run = api.run_reflect(source)
    assert run.status == "ok"
    assert set(MinedItem.objects.values_list("kind", "key")) == {("session", "s1"), ("outbox", "o1"), ("correction", "c1")}
    texts = set(Reflection.objects.values_list("domain__name", "text"))
    assert ("ops", "Do not run rm -rf (reason: it deletes the workspace).") in texts
    assert ("ops", "Never push to main.") in texts
    assert any(d == "writing" for d, _ in texts)
    again = api.run_reflect(source)
    assert again.status == "ok" and again.stats == {}
    assert MinedItem.objects.count() == 3


def test_ledgers_are_separate_and_corrections_keyed_per_correction():
    src = StaticSource(
        session_items=[SessionItem("k1", "m", ["ops"], "operator: never do A")],
        correction_items=[Correction("k1", ["ops"], "do not do B"), Correction("k1#2", ["ops"], "do not do B, really")],
    )
    api.run_reflect(src)
    # the same key in the session and correction ledgers is two items, and a second correction of the
    # same thing is a new lesson
    assert set(MinedItem.objects.values_list("kind", "key")) == {("session", "k1"), ("correction", "k1"), ("correction", "k1#2")}
    assert Reflection.objects.filter(kind="correction").count() == 2
    # distill's ledger is separate from reflect's session ledger
    api.run_distill(src)
    assert MinedItem.objects.filter(kind="distilled", key="k1").exists()


@pytest.mark.parametrize("answer", ["I cannot help with that.", '{"lessons": "nope"}', '{"lessons": [42]}', ""])
def test_reflect_bad_output_records_error_and_changes_nothing(source, answer):
    run = api.run_reflect(source, const(answer))
    assert run.status == "error" and len(run.errors) == 3
    assert not MinedItem.objects.exists() and not Reflection.objects.exists()
    assert api.run_reflect(source).stats["mined_correction"] == 1  # retried next time


def test_reflect_provider_failure_is_an_item_error(source):
    def boom(system, prompt):
        raise TimeoutError("provider timed out")
    run = api.run_reflect(source, boom)
    assert run.status == "error" and "provider timed out" in run.errors[0]["error"]
    assert not MinedItem.objects.exists()
    assert not WriterLease.objects.exclude(holder="").exists()  # lock released


def test_crashed_pass_releases_lock_and_records_crash():
    class Broken(StaticSource):
        def corrections(self):
            raise RuntimeError("host table missing")
    with pytest.raises(RuntimeError):
        api.run_reflect(Broken())
    assert PassRun.objects.get().status == "crashed"
    assert api.run_reflect(StaticSource(), wait=0).status == "ok"  # not wedged


def test_item_without_domains_goes_to_default_domain():
    api.run_reflect(StaticSource(correction_items=[Correction("c", [], "never do X")]))
    assert Reflection.objects.get().domain.name == "general"


# --- learn ----------------------------------------------------------------------------------------

def test_learn_proposes_ops_and_consumes_reflections(source):
    api.run_reflect(source)
    run = api.run_learn()
    assert run.status == "ok" and run.stats["proposals"] == 2
    p = Proposal.objects.get(domain__name="ops")
    assert p.status == "pending"
    assert {op["op"] for op in p.ops} == {"add"}
    assert [line["sign"] for line in p.diff] == ["+", "+"]
    assert not Reflection.objects.filter(consumed_at__isnull=True).exists()
    assert set(Reflection.objects.filter(domain__name="ops").values_list("proposal_id", flat=True)) == {p.pk}
    assert api.prompt_block(["ops"]) is None  # nothing applied before review
    assert api.run_learn().stats == {}


def test_learn_agrees_instead_of_duplicating():
    store.apply_ops("ops", [{"op": "add", "text": "Never push to main."}], actor="t")
    rule = Rule.objects.get()
    api.run_reflect(StaticSource(correction_items=[Correction("c", ["ops"], "never push to main")]))
    api.run_learn(auto_approve=True)
    rule.refresh_from_db()
    assert rule.strength == 2 and Rule.objects.count() == 1


def test_learn_domain_filter(source):
    api.run_reflect(source)
    api.run_learn(domain="writing")
    assert list(Proposal.objects.values_list("domain__name", flat=True)) == ["writing"]
    assert Reflection.objects.filter(domain__name="ops", consumed_at__isnull=True).exists()


@pytest.mark.parametrize("answer", [
    "no json",
    '{"operations": [{"op": "rewrite", "text": "everything"}]}',
    '{"operations": [{"op": "edit", "rule": "U1", "text": "user rules are mine now"}]}',
    '{"operations": [{"op": "agree", "rule": "L999"}]}',
    '{"rules": ["a wholesale replacement"]}',
])
def test_learn_bad_output_changes_nothing(source, answer):
    api.add_user_rule("ops", "Operator rule.", actor="a")
    api.run_reflect(source)
    before = user_rules_bytes()
    run = api.run_learn(complete=const(answer))
    assert run.status == "error"
    assert not Proposal.objects.exists()
    assert not Reflection.objects.filter(consumed_at__isnull=False).exists()
    assert user_rules_bytes() == before


def test_learn_nothing_to_change_consumes_without_proposal(source):
    api.run_reflect(source)
    run = api.run_learn(complete=const('{"operations": [], "rationale": "already covered"}'))
    assert run.stats["no_change"] == 2 and not Proposal.objects.exists()
    assert not Reflection.objects.filter(consumed_at__isnull=True).exists()


def test_learn_auto_approve_bool_and_callable(source):
    api.run_reflect(source)
    run = api.run_learn(auto_approve=lambda domain: domain.name == "ops")
    assert run.stats["auto_approved"] == 1
    assert Proposal.objects.get(domain__name="ops").status == "approved" and Proposal.objects.get(domain__name="ops").auto_approved
    assert Proposal.objects.get(domain__name="writing").status == "pending"
    assert "Do not run rm -rf" in api.prompt_block(["ops"])
    change = RuleChange.objects.get(source="learned")
    assert change.actor == "auto-approve (learn pass)" and change.proposal.domain.name == "ops"


def test_learn_gate_refuses_growing_past_25():
    store.apply_ops("ops", [{"op": "add", "text": f"Existing rule number {i}."} for i in range(12)], actor="t")
    store.apply_ops("ops", [{"op": "add", "text": f"More rule number {i}."} for i in range(13)], actor="t")
    assert Rule.objects.filter(source="learned", enabled=True).count() == 25
    api.run_reflect(StaticSource(correction_items=[Correction("c", ["ops"], "never deploy on fridays")]))
    run = api.run_learn(auto_approve=True)
    assert run.status == "error" and run.stats["gate_refusals"] == 1
    assert "limit 25" in run.errors[0]["error"]
    assert not Proposal.objects.exists()
    assert Rule.objects.filter(source="learned", enabled=True).count() == 25
    # a proposal that keeps the count is fine at the limit
    first = Rule.objects.filter(source="learned").first()
    answer = json.dumps({"operations": [{"op": "edit", "rule": f"L{first.pk}", "text": "Never deploy on Fridays."}]})
    assert api.run_learn(complete=const(answer), auto_approve=True).stats["auto_approved"] == 1


def test_learn_prompt_states_user_rules_are_immutable(source):
    api.add_user_rule("ops", "Operator rule.", actor="a")
    api.run_reflect(source)
    seen = {}

    def spy(system, prompt):
        seen["system"], seen["prompt"] = system, prompt
        return offline.complete(system, prompt)

    api.run_learn(domain="ops", complete=spy)
    assert "IMMUTABLE" in seen["system"]
    assert "Operator rule." in seen["prompt"] and '"ref": "U' in seen["prompt"]


# --- distill --------------------------------------------------------------------------------------

def test_distill_writes_memory_once(source):
    run = api.run_distill(source)
    assert run.status == "ok" and run.stats == {"distilled": 1, "notes": 1}
    assert source.memory[("alice", "session-s1")].endswith("- We decided to use PostgreSQL.")
    source.memory.clear()
    api.run_distill(source)
    assert source.memory == {}


def test_distill_bad_output_or_write_failure_changes_nothing(source):
    run = api.run_distill(source, const('{"notes": [{"name": "../../etc/passwd", "content": "x"}]}'))
    assert run.status == "error" and source.memory == {}
    assert not MinedItem.objects.filter(kind="distilled").exists()

    class Failing(StaticSource):
        def write_memory(self, member_key, name, content):
            raise OSError("disk full")
    failing = Failing(session_items=source.session_items)
    run = api.run_distill(failing)
    assert run.status == "error" and "disk full" in run.errors[0]["error"]
    assert not MinedItem.objects.filter(kind="distilled").exists()


# --- what a model returns is kept, whatever characters it holds -----------------------------------

# A raw NUL, a "\u0000" escape and a lone-surrogate escape: each made a pass raise on PostgreSQL (and
# the surrogates on SQLite too), on every retry of the item.
ODD = [("raw NUL", "Never\x00 push to main."), ("escaped NUL", "Never\\u0000 push to main."),
       ("lone surrogate", "Never \\ud800 push to main.")]


@pytest.mark.parametrize("label,lesson", ODD, ids=[label for label, _ in ODD])
def test_a_reply_with_nul_or_a_lone_surrogate_is_stored_with_replacement_characters(source, label, lesson):
    run = api.run_reflect(StaticSource(correction_items=[Correction("c", ["ops"], "never push to main")]),
                          const('{"lessons": ["%s"]}' % lesson))
    assert run.status == "ok", run.errors
    (text,) = Reflection.objects.values_list("text", flat=True)
    assert text == "Never\ufffd push to main." or text == "Never \ufffd push to main."

    answer = '{"operations": [{"op": "add", "text": "%s"}], "rationale": "%s"}' % (lesson, lesson)
    run = api.run_learn(complete=const(answer), auto_approve=True)
    assert run.status == "ok" and run.stats["auto_approved"] == 1, run.errors
    rule = Rule.objects.get(source=RuleSource.LEARNED)
    assert "\ufffd" in rule.text and "\x00" not in rule.text

    run = api.run_distill(source, const('{"notes": [{"name": "odd", "content": "%s"}]}' % lesson))
    assert run.status == "ok", run.errors
    assert "\ufffd" in source.memory[("alice", "odd")]


# --- user rules are never touched by a pass ------------------------------------------------------

def test_every_pass_leaves_user_rules_byte_identical(source):
    api.add_user_rule("ops", "Never force-push.", actor="alice")
    api.add_user_rule("writing", "Write in plain English.", actor="alice")
    store.apply_ops("ops", [{"op": "add", "text": "Old learned rule."}], actor="t")
    before, user_history = user_rules_bytes(), RuleChange.objects.filter(source="user").count()

    api.run_reflect(source)
    api.run_learn(auto_approve=True)
    api.run_distill(source)
    # a hostile model trying to reach the user rules through every op
    user_ids = list(Rule.objects.filter(source="user").values_list("id", flat=True))
    learned = Rule.objects.filter(source="learned").first()
    api.run_reflect(StaticSource(correction_items=[Correction("c2", ["ops"], "never do Y")]))
    for rid in user_ids:
        for op in ({"op": "edit", "rule": rid, "text": "pwned"}, {"op": "remove", "rule": rid},
                   {"op": "edit", "rule": f"U{rid}", "text": "pwned"}):
            api.run_learn(complete=const(json.dumps({"operations": [op]})), auto_approve=True)
    api.run_learn(complete=const(json.dumps({"operations": [{"op": "edit", "rule": learned.pk, "text": "Edited."}]})),
                  auto_approve=True)

    assert user_rules_bytes() == before
    assert RuleChange.objects.filter(source="user").count() == user_history
    assert Rule.objects.get(pk=learned.pk).text == "Edited."


def test_pass_modules_have_no_path_to_user_rule_writes():
    """Structural: the passes (and what they call to write rules) never name a user-rule writer."""
    forbidden = {"add_user_rule", "edit_user_rule", "remove_user_rule", "people_write", "revert_change"}
    for module in ("passes.py", "store.py", "lock.py", "ops.py", "prompts.py", "offline.py", "tasks.py"):
        tree = ast.parse((LEARNING / module).read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not (names & forbidden), f"{module} references {names & forbidden}"
    # the only learned-rule writer filters on source=learned for every row it touches
    write = (LEARNING / "store.py").read_text().split("def _write_learned", 1)[1].split("\ndef ", 1)[0]
    assert "source=RuleSource.LEARNED" in write and "RuleSource.USER" not in write


def test_learning_never_imports_the_host():
    for path in LEARNING.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            for mod in mods:
                assert mod.split(".")[0] not in ("veronica", "waggle"), f"{path} imports {mod}"
        assert "import_module(\"veronica" not in path.read_text()


def test_old_pass_runs_are_pruned(settings):
    from datetime import timedelta

    from django.utils import timezone

    old = PassRun.objects.create(kind="reflect", status="ok")
    PassRun.objects.filter(pk=old.pk).update(finished_at=timezone.now() - timedelta(days=31))
    recent = PassRun.objects.create(kind="reflect", status="ok", finished_at=timezone.now() - timedelta(days=1))
    api.run_reflect(StaticSource())
    assert not PassRun.objects.filter(pk=old.pk).exists() and PassRun.objects.filter(pk=recent.pk).exists()
