"""What each pass asks the model, and how its answer is read (pure, no ORM).

Every prompt carries its input as one fenced JSON payload, so real models and the offline
provider read the same thing, and every answer is a JSON object validated here. Anything that
does not validate raises ParseError / OpError: the pass records it and changes nothing."""
from __future__ import annotations

import json
import re

from .ops import MAX_OPS_PER_PROPOSAL, normalize_ops
from .parsing import ParseError, clean_text, extract_json_object

MARK_REFLECT = "[learning-pass:reflect]"
MARK_LEARN = "[learning-pass:learn]"
MARK_DISTILL = "[learning-pass:distill]"

MAX_LESSON_CHARS = 400
MAX_LESSONS = 5
MAX_NOTES = 3
MAX_NOTE_CHARS = 8000
NOTE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")

REFLECT_SYSTEM = f"""{MARK_REFLECT}
You are the reflection pass of a rules store that helps a team of AI agents improve from review.
You read ONE item of past work: a member's session transcript, a message to the operator that the
operator edited before accepting it (original and edited versions), or an operator correction (an
approval denial with its reason, or a direct correction).
Extract the lessons it teaches: short, general, imperative rules the agents should follow next time
(one sentence each, at most {MAX_LESSON_CHARS} characters), e.g. "Do not run destructive shell
commands such as rm -rf." Keep a stated reason in the lesson. Only extract what the item supports;
most transcripts teach nothing, and then the list is empty. At most {MAX_LESSONS} lessons.
Answer with JSON only:
{{"lessons": [{{"text": "...", "domain": "<the one item domain it belongs to; default: the first>"}}]}}"""

LEARN_SYSTEM = f"""{MARK_LEARN}
You maintain the LEARNED rules of one domain of a rules store used in AI agents' system prompts.
You receive: the operator's user rules (IMMUTABLE: never change, weaken, repeat or contradict them;
you cannot address them), the current learned rules with ids like "L12" and a strength count, and
new reflections. Propose SMALL operations on the learned rules only, never a rewrite of the set:
- {{"op": "add", "text": "..."}}: a lesson no rule covers yet;
- {{"op": "edit", "rule": "L12", "text": "..."}}: reword one learned rule (same meaning, sharper);
- {{"op": "agree", "rule": "L12"}}: a reflection confirms a rule (strength +1);
- {{"op": "remove", "rule": "L12"}}: a reflection contradicts a rule (strength -1; at 0 it retires).
Prefer agree over add when a rule already covers the lesson. At most one op per rule, at most
{MAX_OPS_PER_PROPOSAL} ops. The domain may hold at most `max_active_rules` active learned rules; do
not grow it past that. Return an empty list if nothing should change.
Each reflection has a ref like "R3". Give each op the reflections it covers ("from": ["R3", "R7"]),
and list under "covered" the reflections an existing rule already covers (no op needed). A
reflection you neither cite nor list waits for the next pass.
Answer with JSON only:
{{"operations": [...], "covered": ["R5"], "rationale": "one or two sentences"}}"""

DISTILL_SYSTEM = f"""{MARK_DISTILL}
You turn one finished session of an AI agent into durable notes for that agent's memory files:
facts, decisions, preferences and open threads worth knowing in later sessions; not a summary of
the transcript. At most {MAX_NOTES} notes; an empty list when nothing is durable. A note name is a
short file name (letters, digits, - _ .), its content is markdown.
Answer with JSON only:
{{"notes": [{{"name": "kebab-case-name", "content": "markdown"}}]}}"""


def clip(text: str, limit: int) -> str:
    """Keep head and tail of a long text: the start says what the work was, the end how it went."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + f"\n[... {len(text) - 2 * half} characters elided ...]\n" + text[-half:]


def payload_prompt(title: str, payload: dict) -> str:
    return f"{title}\n```json\n{json.dumps(payload, ensure_ascii=False, indent=1)}\n```"


def read_payload(prompt: str) -> dict:
    m = re.search(r"```json\n(.*)\n```", prompt, re.S)
    if not m:
        raise ParseError("prompt carries no JSON payload")
    return json.loads(m.group(1))


# --- reflect ---------------------------------------------------------------------------------

def reflect_prompt(kind: str, key: str, domains: list[str], *, member: str = "", text: str = "",
                   original: str = "", edited: str = "", max_chars: int = 20000) -> str:
    payload: dict = {"kind": kind, "key": key, "domains": domains}
    if kind == "outbox":
        payload["original"] = clip(original, max_chars // 2)
        payload["edited"] = clip(edited, max_chars // 2)
    else:
        if member:
            payload["member"] = member
        payload["text"] = clip(text, max_chars)
    return payload_prompt("Item to reflect on:", payload)


def parse_reflect(raw: str, domains: list[str]) -> list[tuple[str, str]]:
    """-> [(domain, lesson)]; a lesson without a (valid) domain goes to the item's first domain, and
    each lesson to one domain only."""
    data = extract_json_object(raw)
    lessons = data.get("lessons")
    if not isinstance(lessons, list):
        raise ParseError("reflect output has no 'lessons' list")
    if len(lessons) > MAX_LESSONS:
        lessons = lessons[:MAX_LESSONS]
    out: list[tuple[str, str]] = []
    for i, lesson in enumerate(lessons):
        domain = None
        if isinstance(lesson, dict):
            domain = lesson.get("domain")
            lesson = lesson.get("text", lesson.get("lesson"))
        text = clean_text(lesson, field=f"lesson {i + 1}", max_chars=MAX_LESSON_CHARS)
        # one lesson, one domain: the one it names, else the item's first (a lesson copied into each of
        # a member's domains became as many identical proposals)
        target = domain if isinstance(domain, str) and domain in domains else (domains[0] if domains else None)
        if target is not None and all(t != text for _, t in out):
            out.append((target, text))
    return out


# --- learn -----------------------------------------------------------------------------------

def learn_prompt(domain: str, user_rules: list[dict], learned: list[dict], reflections: list[dict], *,
                 max_active: int) -> str:
    payload = {
        "domain": domain,
        "max_active_rules": max_active,
        "active_learned_rules": sum(1 for r in learned if r.get("enabled", True)),
        "user_rules": [{"ref": f"U{r['id']}", "text": r["text"]} for r in user_rules],
        "learned_rules": [
            {"ref": f"L{r['id']}", "text": r["text"], "strength": r["strength"]}
            for r in learned if r.get("enabled", True)
        ],
        "reflections": [{"ref": f"R{i + 1}", "kind": r["kind"], "text": r["text"]} for i, r in enumerate(reflections)],
    }
    return payload_prompt(f"Consolidate new reflections into the learned rules of domain {domain!r}:", payload)


def parse_learn(raw: str) -> tuple[list[dict], str]:
    ops, rationale, _ = parse_learn_covering(raw)
    return ops, rationale


_REFLECTION_REF = re.compile(r"^\s*R?\s*(\d+)\s*$", re.I)


def parse_learn_covering(raw: str) -> tuple[list[dict], str, set[int] | None]:
    """-> (ops, rationale, the indexes of the reflections the answer covers: cited by an op's
    "from" or listed under "covered"; None when it cites none at all)."""
    data = extract_json_object(raw)
    if "operations" not in data and "ops" not in data:
        raise ParseError("learn output has no 'operations' list")
    ops = normalize_ops(data)
    rationale = data.get("rationale", "")
    rationale = " ".join(rationale.split())[:2000] if isinstance(rationale, str) else ""
    cited: list = list(data.get("covered") or []) if isinstance(data.get("covered"), list) else []
    for op in data.get("operations", data.get("ops")) or []:
        if isinstance(op, dict) and isinstance(op.get("from"), list):
            cited.extend(op["from"])
    covered = set()
    for ref in cited:
        m = _REFLECTION_REF.match(str(ref)) if isinstance(ref, (str, int)) and not isinstance(ref, bool) else None
        if m:
            covered.add(int(m.group(1)) - 1)
    has_citations = "covered" in data or any(isinstance(op, dict) and "from" in op
                                             for op in data.get("operations", data.get("ops")) or [])
    return ops, rationale, covered if has_citations else None


# --- distill ---------------------------------------------------------------------------------

def distill_prompt(key: str, member: str, text: str, *, max_chars: int = 20000) -> str:
    return payload_prompt("Session to distill:", {"session": key, "member": member, "text": clip(text, max_chars)})


def parse_distill(raw: str) -> list[tuple[str, str]]:
    data = extract_json_object(raw)
    notes = data.get("notes")
    if not isinstance(notes, list):
        raise ParseError("distill output has no 'notes' list")
    if len(notes) > MAX_NOTES:
        raise ParseError(f"distill output has {len(notes)} notes; the limit is {MAX_NOTES}")
    out = []
    for i, note in enumerate(notes):
        if not isinstance(note, dict):
            raise ParseError(f"note {i + 1} is not an object")
        name = note.get("name")
        if not isinstance(name, str) or not NOTE_NAME.match(name.strip()) or ".." in name:
            raise ParseError(f"note {i + 1} has a bad name {name!r} (letters, digits, - _ . ; at most 80)")
        content = clean_text(note.get("content"), field=f"note {i + 1} content", max_chars=MAX_NOTE_CHARS,
                             single_line=False)
        out.append((name.strip(), content))
    return out
