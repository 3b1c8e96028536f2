"""The offline provider: a deterministic `complete(system, prompt) -> str` for every pass.

No network, no randomness: the same input always gives the same output, so tests and the demo can
run the whole loop. It reads the JSON payload each pass embeds in its prompt and answers in the
exact format the pass asks for. It is a heuristic, not a model: it extracts imperative sentences
("do not ...", "always ...") from corrections and operator feedback, turns an operator's edit into a
wording lesson, folds near-duplicate lessons into `agree` ops, and keeps decision-like lines of a
session as notes.
"""
from __future__ import annotations

import difflib
import json
import re

from .prompts import MARK_DISTILL, MARK_LEARN, MARK_REFLECT, MAX_LESSON_CHARS, read_payload

_IMPERATIVE = re.compile(
    r"\b(do not|don't|dont|never|always|avoid|prefer|stop|must not|mustn't|must|should not|shouldn't|should|please)\b",
    re.I,
)
_REASON = re.compile(r"^\s*(?:reason|because|why)\b\s*[:=\-]?\s*(.+)$", re.I)
_FEEDBACK_LINE = re.compile(r"^\s*(?:operator|user|human|feedback|correction|lesson|reviewer)\s*:\s*(.+)$", re.I)
_NOTE_LINE = re.compile(
    r"\b(decided|decision|remember|note|todo|to do|agreed|prefers?|deadline|learned|always|never|must)\b", re.I
)
_WORD = re.compile(r"[a-z0-9]+")


def make_complete():
    """Factory named by the LEARNING_COMPLETE setting's default."""
    return complete


def complete(system: str, prompt: str) -> str:
    if MARK_REFLECT in system:
        return json.dumps(_reflect(read_payload(prompt)))
    if MARK_LEARN in system:
        return json.dumps(_learn(read_payload(prompt)))
    if MARK_DISTILL in system:
        return json.dumps(_distill(read_payload(prompt)))
    return json.dumps({"error": "offline provider: unknown pass"})


# --- reflect ---------------------------------------------------------------------------------

def _clauses(text: str) -> list[str]:
    parts = re.split(r"[;\n]|(?<=[.!?])\s+(?=[A-Z])", text)
    return [p.strip(" \t-*•.") for p in parts if p.strip(" \t-*•.")]


def _imperative(clause: str) -> str | None:
    m = _IMPERATIVE.search(clause)
    if not m:
        return None
    word = m.group(1).lower()
    rest = clause[m.end():].strip(" ,:")
    if not rest:
        return None
    if word in ("must not", "mustn't", "should not", "shouldn't", "don't", "dont", "do not"):
        lesson = "Do not " + rest
    elif word in ("must", "should", "please"):
        lesson = rest[0].upper() + rest[1:]
    else:
        lesson = word.capitalize() + " " + rest
    return lesson.rstrip(" .") + "."


def _lessons_from_text(text: str) -> list[str]:
    clauses = _clauses(text)
    reason = next((m.group(1).strip().rstrip(".") for c in clauses if (m := _REASON.match(c))), "")
    lessons = []
    for clause in clauses:
        if _REASON.match(clause):
            continue
        lesson = _imperative(clause)
        if lesson and lesson not in lessons:
            lessons.append(lesson)
    if reason and lessons:
        lessons[0] = f"{lessons[0][:-1]} (reason: {reason})."
    return [lesson[:MAX_LESSON_CHARS] for lesson in lessons[:3]]


def _reflect(payload: dict) -> dict:
    kind = payload.get("kind")
    if kind == "correction":
        text = payload.get("text", "")
        lessons = _lessons_from_text(text)
        if not lessons:
            summary = " ".join(text.split())[:300]
            lessons = [f"Follow the operator's correction: {summary}."] if summary else []
    elif kind == "outbox":
        lessons = _outbox_lessons(payload.get("original", ""), payload.get("edited", ""))
    else:  # session: only the operator's own words in it teach anything
        feedback = [m.group(1) for line in payload.get("text", "").splitlines() if (m := _FEEDBACK_LINE.match(line))]
        lessons = _lessons_from_text("\n".join(feedback))
    return {"lessons": [{"text": lesson} for lesson in lessons]}


def _outbox_lessons(original: str, edited: str) -> list[str]:
    a, b = original.split(), edited.split()
    if a == b:
        return []
    if len(b) < 0.7 * len(a):
        return [f"Keep messages to the operator short (about {len(b)} words, not {len(a)})."]
    lessons: list[str] = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "replace" and i2 - i1 <= 8 and j2 - j1 <= 8:
            lessons.append(f"When writing to the operator, say \"{' '.join(b[j1:j2])}\" rather than \"{' '.join(a[i1:i2])}\".")
            break
        if tag == "delete" and i2 - i1 <= 8 and not lessons:
            lessons.append(f"When writing to the operator, leave out \"{' '.join(a[i1:i2])}\".")
            break
    if not lessons:
        lessons.append("Match the operator's edited wording when writing to the operator.")
    return [lesson[:MAX_LESSON_CHARS] for lesson in lessons]


# --- learn -----------------------------------------------------------------------------------

_STOP = {"the", "a", "an", "to", "of", "and", "or", "in", "on", "for", "with", "is", "it", "be"}


def _words(text: str) -> set[str]:
    core = re.sub(r"\((?:reason|because)\b.*?\)", "", text.lower())  # a stated reason is not the rule
    return {w for w in _WORD.findall(core) if w not in _STOP}


def _similar(a: str, b: str) -> bool:
    """Same lesson: mostly the same words (Jaccard), or one is the other plus detail."""
    wa, wb = _words(a), _words(b)
    if not wa or not wb:
        return a.strip().lower() == b.strip().lower()
    common = len(wa & wb)
    return common / len(wa | wb) >= 0.6 or (min(len(wa), len(wb)) >= 3 and common / min(len(wa), len(wb)) >= 0.9)


def _learn(payload: dict) -> dict:
    learned = payload.get("learned_rules", [])
    users = [r["text"] for r in payload.get("user_rules", [])]
    ops: list[dict] = []
    covered: list[str] = []  # reflections a user rule or an earlier op of this answer already covers
    by_rule: dict[str, dict] = {}
    added: list[tuple[str, dict]] = []
    for i, reflection in enumerate(payload.get("reflections", [])):
        text, ref = reflection.get("text", ""), reflection.get("ref", f"R{i + 1}")
        if not text or any(_similar(text, u) for u in users):
            covered.append(ref)
            continue
        match = next((r for r in learned if _similar(text, r["text"])), None)
        if match is not None:
            if match["ref"] in by_rule:
                by_rule[match["ref"]]["from"].append(ref)
            elif len(ops) < 12:
                by_rule[match["ref"]] = {"op": "agree", "rule": match["ref"], "from": [ref]}
                ops.append(by_rule[match["ref"]])
            continue
        same = next((op for a, op in added if _similar(text, a)), None)
        if same is not None:
            same["from"].append(ref)
            continue
        if len(ops) < 12:  # a proposal holds at most 12 ops: the rest wait for the next pass
            op = {"op": "add", "text": text, "from": [ref]}
            added.append((text, op))
            ops.append(op)
    n_add = sum(1 for o in ops if o["op"] == "add")
    return {"operations": ops, "covered": covered,
            "rationale": f"offline: {n_add} new lesson(s), {len(ops) - n_add} confirmation(s)."}


# --- distill ---------------------------------------------------------------------------------

def _distill(payload: dict) -> dict:
    lines = [" ".join(line.split()) for line in payload.get("text", "").splitlines()]
    lines = [line for line in lines if line]
    keep = [line for line in lines if _NOTE_LINE.search(line)][:10]
    if not keep:
        return {"notes": []}
    key = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(payload.get("session", "session"))).strip("-.")[:60] or "session"
    content = f"# Notes from session {payload.get('session', '')}\n\n" + "\n".join(f"- {line[:300]}" for line in keep)
    return {"notes": [{"name": f"session-{key}", "content": content}]}
