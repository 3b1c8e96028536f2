"""What a replayed step returned that the model could only have learned from it (pure Python).

The ledger books a replayed step *used* only when the model's later calls or text draw on its
output: name an id, a value, a name that the output brought and nothing else in the session had
(not the step's own arguments, not an earlier output, not a message). A step whose output brought
nothing new cannot show that it was used, and is booked unused when the run ends.

A value counts as evidence when it is specific enough not to turn up by chance
(:func:`waggle.trace.specific`): a string of at least ``MIN_CHARS`` characters with a digit or a
capital letter in it (an id, a flight number, a date, a person's name; ``economy`` or ``active``
are vocabulary, not evidence), a path or a file, domain or e-mail name (``inventory/api.py``), or
a number with at least ``MIN_DIGITS`` digits; of a plain-text output, its words that are (a
capitalised word opening a sentence is grammar, not a name: ``The``, ``Error:``). It is found in
a reply when it stands there as a whole word (case-insensitive): ``JG7FMM`` in "your reservation
JG7FMM is", not in "XJG7FMMX". A reply writes for a reader, not a parser: an ISO date is also
found as the reader reads it ("May 17", "17 May", "May 17th"), a number also with thousands
separators ("1,227") or cents ("1227.00"), a float with a zero fraction as a whole number (980.0 as
"980"), a longer fraction rounded to cents (10.566880000000001 as "10.57"); a number is never found
inside a longer one ("980" is not in "980.05"). A JSON output's evidence is its leaves only: one
whose leaves are all true, false or null brought no value to name (its keys are not values).
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from waggle.trace import MIN_DIGITS, Call, decode_value, is_json, iter_text_words, output_refs, specific  # (specific: used here and by speech)

MAX_VALUES = 60          # evidence values kept per replayed step (the first, in document order)
MAX_TEXT_CHARS = 200_000  # a reply longer than this is searched in its first part only


def values_of(call: Call) -> set[str]:
    """Every value a recorded call carries: its arguments and its output's leaves (a message: its
    words). Not a plain-text output's words (``call.words``): a text's words are many and loose (a
    file names what other tools report too), and counting them as known made the judge book
    reads the model used unused, every value they share with a later replay being struck out."""
    out: set[str] = set()
    for _, v in call.args:
        out.update(_leaves(decode_value(v)))
    for _, v in call.refs:
        d = decode_value(v)
        if isinstance(d, (str, int, float)) and not isinstance(d, bool):
            out.add(str(d).strip())
    return out


def _leaves(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield str(value).strip()


def step_evidence(args: dict, output: str, known: set[str]) -> list[str]:
    """The values of a replayed step's output that could show the model drew on it: specific, and
    neither among its own arguments nor ``known`` (what the session held before the replay)."""
    own = set(_leaves(args))
    refs = output_refs(output)
    if refs:
        raw: Iterable[Any] = (decode_value(v) for _, v in refs)
    elif is_json(output):  # JSON with no scalar leaf ({"canDrive": false}): its keys are not values it brought
        raw = ()
    else:  # plain text: its words (as the ring keeps them: waggle.trace.text_words)
        raw = iter_text_words(output or "", MAX_TEXT_CHARS)
    out: list[str] = []
    seen: set[str] = set()
    pool: set[str] | None = None
    for value in raw:
        text = specific(value)
        if text is None or text in seen or text in own or text in known:
            continue
        if _ISO_DATE.match(text):
            pool = pool if pool is not None else {k.lower().strip(".,") for k in known if len(k) <= 12}
            if _words_known(text, pool):
                continue
        seen.add(text)
        out.append(text)
        if len(out) >= MAX_VALUES:
            break
    return out


def block_evidence(steps: list[tuple[dict, str]], known: set[str]) -> list[list[str]]:
    """:func:`step_evidence` of each step of one replayed block (``(args, output)``), less the
    values two of its steps brought: a reply naming one (an airport two replayed reservations both
    fly through) names neither step in particular, and would book a step the model skipped used."""
    each = [step_evidence(args, out, known) for args, out in steps]
    if len(each) < 2:
        return each
    seen: dict[str, int] = {}
    for values in each:
        for v in values:
            seen[v] = seen.get(v, 0) + 1
    return [[v for v in values if seen[v] == 1] for values in each]


def reply_text(text: str | None, calls: Iterable[tuple[str, dict]]) -> str:
    """What a reply says, for :func:`drawn`: its text and every value of its calls' arguments."""
    parts = [(text or "")[:MAX_TEXT_CHARS]]
    for _, args in calls:
        parts.extend(_leaves(args if isinstance(args, dict) else {}))
    return "\n".join(parts)


MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december"]
_ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:[T ][\d:.]+Z?)?$")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?$")


def forms(value: str) -> list[str]:
    """How a reply may write ``value``: itself, and for an ISO date or a number the usual ways a
    person reads them (see the module docstring)."""
    out = [value]
    date = _ISO_DATE.match(value)
    if date and 1 <= int(date.group(2)) <= 12 and len(value) <= 10:  # (a timestamp is written as it is)
        for m, day in _month_day(value):
            out += [f"{m} {day}", f"{day} {m}", f"{m} {day}{_ordinal(int(day))}"]
    elif _NUMBER.match(value) and not value.startswith("0"):
        whole, _, cents = value.partition(".")
        grouped = f"{int(whole):,}"
        if grouped != whole:
            out.append(grouped)
        if not cents:
            out += [f"{whole}.00", f"{grouped}.00"] if grouped != whole else [f"{whole}.00"]
        elif not cents.strip("0"):  # a float with nothing after the point: 980.0 is written 980
            if sum(ch.isdigit() for ch in whole) >= MIN_DIGITS:  # (10.0 as "10" is too common to tell)
                out += [whole] + ([grouped] if grouped != whole else [])
        elif len(cents) > 2:  # a computed float is written rounded: 10.566880000000001 as 10.57
            rounded = f"{float(value):.2f}"
            if sum(ch.isdigit() for ch in rounded) >= MIN_DIGITS and rounded != value:
                out.append(rounded)
    return out


def _month_day(value: str) -> list[tuple[str, str]]:
    date = _ISO_DATE.match(value)
    if not date or not 1 <= int(date.group(2)) <= 12:
        return []
    month, day = MONTHS[int(date.group(2)) - 1], str(int(date.group(3)))
    return [(m, day) for m in dict.fromkeys((month, month[:3]))]


def _ordinal(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def _words_known(value: str, pool: set[str]) -> bool:
    """A date whose month and day were both said (as words) before: not new to the model."""
    return any(m in pool and day in pool for m, day in _month_day(value))


def _names(lower: str, v: str) -> bool:
    numeric = v[:1].isdigit()
    start = lower.find(v)
    while start >= 0:
        end = start + len(v)
        before = lower[start - 1] if start else " "
        after = lower[end] if end < len(lower) else " "
        # (a number is not named inside a longer one: 980 is not in 980.05 nor in 1.980)
        inside = numeric and ((after == "." and lower[end + 1:end + 2].isdigit())
                              or (before == "." and lower[start - 2:start - 1].isdigit()))
        if not before.isalnum() and not after.isalnum() and not inside:
            return True
        start = lower.find(v, start + 1)
    return False


def drawn(values: Iterable[str], said: str, exclude: set[str] = frozenset()) -> str | None:
    """The first of ``values`` (not in ``exclude``: learned since from elsewhere) the reply ``said``
    names as a whole word (in one of its :func:`forms`), or None."""
    if not said:
        return None
    lower = said.lower()
    pool: set[str] | None = None
    for value in values:
        if value in exclude:
            continue
        if exclude and _ISO_DATE.match(value):
            pool = pool if pool is not None else {k.lower().strip(".,") for k in exclude if len(k) <= 12}
            if _words_known(value, pool):
                continue
        if any(_names(lower, f.lower()) for f in forms(value)):
            return value
    return None
