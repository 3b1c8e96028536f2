"""Operations on a domain's learned rules, and diffs (pure, no ORM).

A learn pass never rewrites a rule set wholesale (a published failure mode: one full rewrite
collapsed an 18k-token playbook to 122 tokens and cut accuracy). It proposes small operations:

* add    {"op": "add", "text": ...}               a new learned rule, strength 1
* edit   {"op": "edit", "rule": 7, "text": ...}    reword one learned rule, strength kept
* agree  {"op": "agree", "rule": 7}                strengthen (+1)
* remove {"op": "remove", "rule": 7}               weaken (-1); at 0 the rule retires (disabled)

Snapshots are lists of {"id", "text", "strength", "enabled"} (id None for a rule not yet written).
User rules are never in a snapshot an op can touch: ops address learned rules only.
"""
from __future__ import annotations

import re
from typing import Iterable

from .parsing import ParseError, clean_text

MAX_OPS_PER_PROPOSAL = 12
MAX_RULE_CHARS = 1000
OPS = ("add", "edit", "agree", "remove")
_ALIASES = {
    "strengthen": "agree", "confirm": "agree", "upvote": "agree",
    "weaken": "remove", "delete": "remove", "downvote": "remove",
    "update": "edit", "rewrite": "edit", "modify": "edit", "new": "add", "create": "add",
}
_REF = re.compile(r"^\s*#?\s*([LlUu]?)\s*(\d+)\s*$")


class OpError(ValueError):
    """Ops that cannot be applied (unknown rule, bad shape, ...)."""


class GateError(OpError):
    """The result would grow a domain beyond the active learned-rule budget."""


def parse_ref(value: object) -> int:
    if isinstance(value, bool):
        raise OpError(f"rule reference {value!r} is not a learned rule id")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _REF.match(value)
        if m:
            if m.group(1).upper() == "U":
                raise OpError(f"rule {value} is a user rule; user rules are immutable")
            return int(m.group(2))
    raise OpError(f"rule reference {value!r} is not a learned rule id like 'L12'")


def normalize_ops(raw: object) -> list[dict]:
    """Validate the shape of ops (from a model or a reviewer) and return them in canonical form."""
    if isinstance(raw, dict):
        raw = raw.get("operations", raw.get("ops"))
    if not isinstance(raw, list):
        raise OpError("operations must be a list")
    if len(raw) > MAX_OPS_PER_PROPOSAL:
        raise OpError(f"{len(raw)} operations; a proposal holds at most {MAX_OPS_PER_PROPOSAL}")
    out: list[dict] = []
    seen_rules: set[int] = set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise OpError(f"operation {i + 1} is not an object")
        name = str(item.get("op", item.get("type", item.get("action", "")))).strip().lower()
        name = _ALIASES.get(name, name)
        if name not in OPS:
            raise OpError(f"operation {i + 1}: unknown op {item.get('op')!r} (use add, edit, agree or remove)")
        op: dict = {"op": name}
        try:
            if name in ("add", "edit"):
                op["text"] = clean_text(item.get("text"), field=f"operation {i + 1} text", max_chars=MAX_RULE_CHARS)
        except ParseError as exc:
            raise OpError(str(exc)) from None
        if name != "add":
            ref = item.get("rule", item.get("id", item.get("ref")))
            if ref is None:
                raise OpError(f"operation {i + 1} ({name}) names no rule")
            rule_id = parse_ref(ref)
            if rule_id in seen_rules:
                raise OpError(f"operation {i + 1}: rule L{rule_id} is the target of more than one operation")
            seen_rules.add(rule_id)
            op["rule"] = rule_id
        out.append(op)
    return out


def norm_text(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def canonicalize(ops: list[dict], learned: list[dict], user_texts: Iterable[str]) -> list[dict]:
    """Tidy a model's ops against the current state: drop an add that repeats a user rule or an
    earlier add, turn an add that repeats an active learned rule into an agree (once per rule)."""
    user_norm = {norm_text(t) for t in user_texts}
    active = {norm_text(r["text"]): r["id"] for r in learned if r.get("enabled", True)}
    targeted = {op["rule"] for op in ops if "rule" in op}
    added: set[str] = set()
    out = []
    for op in ops:
        if op["op"] == "add":
            key = norm_text(op["text"])
            if key in user_norm or key in added:
                continue
            if key in active:
                rid = active[key]
                if rid not in targeted:
                    targeted.add(rid)
                    out.append({"op": "agree", "rule": rid})
                continue
            added.add(key)
        out.append(op)
    return out


def count_active(snapshot: list[dict]) -> int:
    return sum(1 for r in snapshot if r.get("enabled", True))


def apply_ops(snapshot: list[dict], ops: list[dict], *, max_active: int) -> list[dict]:
    """Return the snapshot after `ops`. Strict: every op must name an active learned rule of this
    snapshot; a result over the budget that grows the domain raises GateError."""
    result = [dict(r) for r in snapshot]
    by_id = {r["id"]: r for r in result if r.get("id") is not None}
    for op in ops:
        if op["op"] == "add":
            result.append({"id": None, "text": op["text"], "strength": 1, "enabled": True})
            continue
        rule = by_id.get(op["rule"])
        if rule is None:
            raise OpError(f"{op['op']}: L{op['rule']} is not a learned rule of this domain")
        if not rule.get("enabled", True):
            raise OpError(f"{op['op']}: L{op['rule']} is retired (disabled)")
        if op["op"] == "edit":
            rule["text"] = op["text"]
        elif op["op"] == "agree":
            rule["strength"] = int(rule.get("strength", 1)) + 1
        elif op["op"] == "remove":
            rule["strength"] = max(0, int(rule.get("strength", 1)) - 1)
            if rule["strength"] == 0:
                rule["enabled"] = False
    before, after = count_active(snapshot), count_active(result)
    if after > max_active and after > before:
        raise GateError(
            f"the domain would hold {after} active learned rules (limit {max_active}); "
            "consolidate or retire rules before adding more"
        )
    return result


def _ref(rule: dict, source: str = "learned") -> str:
    if rule.get("id") is None:
        return "new"
    return f"{'U' if source == 'user' else 'L'}{rule['id']}"


def snapshot_diff(before: list[dict], after: list[dict], *, source: str = "learned") -> list[dict]:
    """Diff lines: {"sign", "ref", "text", "old"?, "note"?}. sign: + added, - removed/retired,
    ~ reworded, ^ strengthened, v weakened, = re-enabled."""
    lines: list[dict] = []
    old = {r["id"]: r for r in before if r.get("id") is not None}
    seen: set = set()
    for r in after:
        rid = r.get("id")
        prev = old.get(rid) if rid is not None else None
        if prev is None:
            lines.append({"sign": "+", "ref": _ref(r, source), "text": r["text"]})
            continue
        seen.add(rid)
        was_on, is_on = prev.get("enabled", True), r.get("enabled", True)
        s0, s1 = int(prev.get("strength", 1)), int(r.get("strength", 1))
        if prev["text"] != r["text"]:
            lines.append({"sign": "~", "ref": _ref(r, source), "text": r["text"], "old": prev["text"]})
        if was_on and not is_on:
            lines.append({"sign": "-", "ref": _ref(r, source), "text": r["text"], "note": f"retired (strength {s0} → {s1})" if s0 != s1 else "disabled"})
        elif not was_on and is_on:
            lines.append({"sign": "=", "ref": _ref(r, source), "text": r["text"], "note": "re-enabled"})
        elif s1 > s0:
            lines.append({"sign": "^", "ref": _ref(r, source), "text": r["text"], "note": f"strength {s0} → {s1}"})
        elif s1 < s0:
            lines.append({"sign": "v", "ref": _ref(r, source), "text": r["text"], "note": f"strength {s0} → {s1}"})
    for rid, r in old.items():
        if rid not in seen:
            lines.append({"sign": "-", "ref": _ref(r, source), "text": r["text"], "note": "deleted"})
    return lines


def diff_text(lines: list[dict]) -> str:
    out = []
    for line in lines:
        if line["sign"] == "~":
            out.append(f"~ {line['ref']}: {line['old']!r} -> {line['text']!r}")
        else:
            note = f" ({line['note']})" if line.get("note") else ""
            out.append(f"{line['sign']} {line['ref']}: {line['text']}{note}")
    return "\n".join(out)


def same_rules(a: list[dict], b: list[dict]) -> bool:
    def key(rules):
        return sorted((r.get("id") or 0, r["text"], int(r.get("strength", 1)), bool(r.get("enabled", True))) for r in rules)

    return key(a) == key(b)
