"""Pure parts of learning: parsing, ops, diffs, rendering, prompts and the offline provider (no DB)."""
import json

import pytest

from learning import offline
from learning.ops import (
    MAX_OPS_PER_PROPOSAL,
    GateError,
    OpError,
    apply_ops,
    canonicalize,
    diff_text,
    normalize_ops,
    snapshot_diff,
)
from learning.parsing import ParseError, extract_json_object
from learning.prompts import (
    DISTILL_SYSTEM,
    LEARN_SYSTEM,
    REFLECT_SYSTEM,
    distill_prompt,
    learn_prompt,
    parse_distill,
    parse_learn,
    parse_reflect,
    reflect_prompt,
)
from learning.render import render_block


def rules(*texts, strength=1):
    return [{"id": i + 1, "text": t, "strength": strength, "enabled": True} for i, t in enumerate(texts)]


# --- parsing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    '{"lessons": []}',
    'Sure! Here you go:\n```json\n{"lessons": []}\n```\nHope that helps.',
    'The answer is {"lessons": []} and nothing else.',
    '```\n{"lessons": []}\n```',
    'noise {not json} then {"lessons": []}',
])
def test_extract_json_tolerates_wrapping(raw):
    assert extract_json_object(raw) == {"lessons": []}


@pytest.mark.parametrize("raw", ["", "   ", "no json here", "[1, 2]", '{"a": ', None, 42])
def test_extract_json_rejects_garbage(raw):
    with pytest.raises(ParseError):
        extract_json_object(raw)


def test_parse_reflect_domains_and_limits():
    out = parse_reflect('{"lessons": ["Do X.", {"text": "Do Y.", "domain": "b"}, {"text": "Do Z.", "domain": "zz"}]}', ["a", "b"])
    # no domain, or one outside the item's domains: the lesson goes to the item's first domain, once (issue 22.9)
    assert out == [("a", "Do X."), ("b", "Do Y."), ("a", "Do Z.")]
    with pytest.raises(ParseError):
        parse_reflect('{"lessons": "x"}', ["a"])
    with pytest.raises(ParseError):
        parse_reflect('{"lessons": [""]}', ["a"])
    with pytest.raises(ParseError):
        parse_reflect(json.dumps({"lessons": ["x" * 5000]}), ["a"])


def test_parse_distill_validates_names():
    assert parse_distill('{"notes": [{"name": "db-choice", "content": "We use PostgreSQL."}]}') == [("db-choice", "We use PostgreSQL.")]
    for bad in ["../etc/passwd", "", "a/b", ".hidden", "x" * 100]:
        with pytest.raises(ParseError):
            parse_distill(json.dumps({"notes": [{"name": bad, "content": "c"}]}))
    with pytest.raises(ParseError):
        parse_distill('{"notes": [{"name": "a", "content": ""}]}')
    with pytest.raises(ParseError):
        parse_distill('{"memo": []}')


# --- ops ----------------------------------------------------------------------------------------

def test_normalize_ops_accepts_aliases_and_refs():
    ops = normalize_ops({"operations": [
        {"op": "add", "text": "  Be   brief. "},
        {"op": "edit", "rule": "L3", "text": "Reworded."},
        {"op": "strengthen", "rule": 4},
        {"op": "weaken", "id": "#5"},
    ]})
    assert ops == [
        {"op": "add", "text": "Be brief."},
        {"op": "edit", "rule": 3, "text": "Reworded."},
        {"op": "agree", "rule": 4},
        {"op": "remove", "rule": 5},
    ]


@pytest.mark.parametrize("bad", [
    "not a list",
    [{"op": "rewrite_all", "text": "x"}],
    [{"op": "replace_all"}],
    [{"op": "edit", "rule": "U2", "text": "user rules are immutable"}],
    [{"op": "remove", "rule": "U2"}],
    [{"op": "agree"}],
    [{"op": "add", "text": ""}],
    [{"op": "agree", "rule": "L1"}, {"op": "remove", "rule": 1}],
    [{"op": "add", "text": f"r{i}"} for i in range(MAX_OPS_PER_PROPOSAL + 1)],
])
def test_normalize_ops_refuses(bad):
    with pytest.raises(OpError):
        normalize_ops(bad)


def test_apply_ops_each_operation():
    base = rules("A.", "B.", "C.")
    base[2]["strength"] = 2
    ops = normalize_ops([
        {"op": "add", "text": "D."},
        {"op": "edit", "rule": 1, "text": "A, sharper."},
        {"op": "agree", "rule": 2},
        {"op": "remove", "rule": 3},
    ])
    out = apply_ops(base, ops, max_active=25)
    assert base[0]["text"] == "A."  # input untouched
    assert [(r["id"], r["text"], r["strength"], r["enabled"]) for r in out] == [
        (1, "A, sharper.", 1, True), (2, "B.", 2, True), (3, "C.", 1, True), (None, "D.", 1, True)]
    again = apply_ops(out, normalize_ops([{"op": "remove", "rule": 3}]), max_active=25)
    assert again[2]["enabled"] is False and again[2]["strength"] == 0  # weakened to 0: retired
    with pytest.raises(OpError):  # a retired rule cannot be targeted
        apply_ops(again, normalize_ops([{"op": "agree", "rule": 3}]), max_active=25)
    with pytest.raises(OpError):
        apply_ops(base, normalize_ops([{"op": "agree", "rule": 99}]), max_active=25)


def test_gate_refuses_growth_past_limit_but_allows_shrinking():
    full = rules(*[f"Rule {i}." for i in range(25)])
    with pytest.raises(GateError):
        apply_ops(full, [{"op": "add", "text": "One more."}], max_active=25)
    # at the limit, agree/edit/remove still work
    out = apply_ops(full, [{"op": "agree", "rule": 1}, {"op": "edit", "rule": 2, "text": "x"}], max_active=25)
    assert sum(r["enabled"] for r in out) == 25
    over = rules(*[f"Rule {i}." for i in range(27)])  # already over (e.g. a person re-enabled rules)
    assert apply_ops(over, [{"op": "remove", "rule": 1}], max_active=25)  # shrinking is fine
    with pytest.raises(GateError):
        apply_ops(over, [{"op": "add", "text": "x"}, {"op": "remove", "rule": 1}, {"op": "add", "text": "y"}], max_active=25)


def test_canonicalize_dedupes_against_state():
    base = rules("Never push to main.")
    ops = canonicalize(
        [{"op": "add", "text": "never push to MAIN"}, {"op": "add", "text": "Always write tests."},
         {"op": "add", "text": "New rule."}, {"op": "add", "text": "new rule"}],
        base, ["Always write tests."],
    )
    assert ops == [{"op": "agree", "rule": 1}, {"op": "add", "text": "New rule."}]


def test_snapshot_diff_and_text():
    before = rules("A.", "B.", "C.")
    after = [dict(r) for r in before]
    after[0]["text"] = "A2."
    after[1]["strength"] = 2
    after[2].update(strength=0, enabled=False)
    after.append({"id": None, "text": "D.", "strength": 1, "enabled": True})
    lines = snapshot_diff(before, after)
    assert [line["sign"] for line in lines] == ["~", "^", "-", "+"]
    text = diff_text(lines)
    assert "~ L1: 'A.' -> 'A2.'" in text and "+ new: D." in text and "strength 1 → 2" in text
    assert snapshot_diff(before, before) == []


# --- rendering ----------------------------------------------------------------------------------

def test_render_block_none_when_empty_and_user_first():
    assert render_block([], []) is None
    block = render_block([("ops", "U.")], [("ops", "L.")])
    assert block.index("U.") < block.index("L.")
    assert render_block([], [("ops", "L.")]).count("Operator rules") == 0


# --- offline provider ---------------------------------------------------------------------------

def test_offline_reflect_correction_is_parseable_and_deterministic():
    prompt = reflect_prompt("correction", "c1", ["ops"], text="approval denied: do not run rm -rf; reason: it deletes the workspace")
    raw = offline.complete(REFLECT_SYSTEM, prompt)
    assert raw == offline.complete(REFLECT_SYSTEM, prompt)
    assert parse_reflect(raw, ["ops"]) == [("ops", "Do not run rm -rf (reason: it deletes the workspace).")]


def test_offline_reflect_session_and_outbox():
    session = reflect_prompt("session", "s1", ["ops"], member="m", text="tool: ls\noperator: always run the tests first\nok")
    assert parse_reflect(offline.complete(REFLECT_SYSTEM, session), ["ops"]) == [("ops", "Always run the tests first.")]
    quiet = reflect_prompt("session", "s2", ["ops"], text="tool output: do not edit this file")
    assert parse_reflect(offline.complete(REFLECT_SYSTEM, quiet), ["ops"]) == []
    outbox = reflect_prompt("outbox", "o1", ["writing"], original="Dear operator, the job is completed now.",
                            edited="Dear operator, the job is done now.")
    lessons = parse_reflect(offline.complete(REFLECT_SYSTEM, outbox), ["writing"])
    assert lessons and "done" in lessons[0][1]


def test_offline_learn_agrees_with_similar_and_adds_new():
    prompt = learn_prompt(
        "ops", [{"id": 9, "text": "Always write tests."}],
        [{"id": 1, "text": "Never push to main.", "strength": 1, "enabled": True}],
        [{"kind": "correction", "text": "Never push to the main branch."},
         {"kind": "correction", "text": "Always write tests."},
         {"kind": "session", "text": "Do not run rm -rf."}],
        max_active=25,
    )
    ops, rationale = parse_learn(offline.complete(LEARN_SYSTEM, prompt))
    assert ops == [{"op": "agree", "rule": 1}, {"op": "add", "text": "Do not run rm -rf."}]
    assert rationale


def test_offline_distill():
    prompt = distill_prompt("s1", "alice", "hello\nWe decided to use PostgreSQL.\nbye")
    notes = parse_distill(offline.complete(DISTILL_SYSTEM, prompt))
    assert notes == [("session-s1", "# Notes from session s1\n\n- We decided to use PostgreSQL.")]
    assert parse_distill(offline.complete(DISTILL_SYSTEM, distill_prompt("s2", "a", "hi\nbye"))) == []
