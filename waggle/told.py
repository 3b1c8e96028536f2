"""What the episodes told: route values a message named or an output showed (pure Python, no ORM).

Agents take many values straight from the message that woke them ("how is MSFT doing?", "the
distance from Rivermist to San Francisco") or from what a call returned (the stocks a watchlist
listed). A route mined from such episodes learned those values, not constants of the work:

* a literal of the replayed tail that the learning messages named (``get_stock_info(symbol="MSFT")``
  after messages naming MSFT) is *named*: the route replays it only when the current message
  names it too (a message about NVDA gets no MSFT);
* a literal of the replayed tail that the trigger's outputs held in the learning contexts (a
  watchlist listing QUAS, then ``get_stock_info(symbol="QUAS")``) is *held*: the route replays it
  only when the current trigger's outputs hold it too (another watchlist gets no QUAS);
* parameters the learning messages named in one order (the first city looked up is the one the
  message named first) are *ordered*: the route does not fire when the current message names them
  the other way round (the lookups went one way, the distance is wanted the other way).

"The message" is every message the agent received since its last call (a user who names the
start in one message and the destination in the next told both). Learned per distinct context
at the route's trigger (see ``route.choose_trigger``): a literal is named when every context that
had a message named it (one that read it unprompted shows a constant of the work), held when more than half of the contexts held it in
the trigger's outputs; an order of two parameters holds when more than half of the contexts that
named both named them in that order (at least two contexts each). A value counts only when it is
a string with a letter (a number names and matches too much by chance); a message names it when
it has all its words (letters and digits, case folded). A route whose values came from neither
has nothing told and fires as before.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Collection, Iterable, Mapping, Sequence

from waggle.trace import decode_value, shown

Words = tuple[str, ...]
_WORD = re.compile(r"\w+")
MIN_CONTEXTS = 2  # contexts a named literal or an order must stand on


def words_of(texts: Iterable[str]) -> Words:
    """A message's words (from its tokens), case folded, in order."""
    return tuple(w for t in texts for w in _WORD.findall(t.casefold()))


def _wordy(value: str) -> str | None:
    """The string a JSON text holds when it has a letter, else None."""
    v = decode_value(value)
    return v if isinstance(v, str) and any(ch.isalpha() for ch in v) else None


def named_at(value: str, words: Sequence[str], first: Mapping[str, int] | None = None) -> int | None:
    """Where the message (its ``words``) names ``value`` (a JSON text): the place of the value's
    first word when every word of it is in the message, else None."""
    v = _wordy(value)
    if v is None:
        return None
    mine = _WORD.findall(v.casefold())
    if not mine:
        return None
    first = first if first is not None else _first_places(words)
    if any(w not in first for w in mine):
        return None
    return first[mine[0]]


def _first_places(words: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, w in enumerate(words):
        out.setdefault(w, i)
    return out


@dataclass(frozen=True)
class Told:
    """What a route learned its episodes told: literals to be named, literals to be held by the
    trigger's outputs, parameter pairs (a, b) the messages named a first."""

    named: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    order: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.named or self.held or self.order)

    def allows(self, binding: Mapping[str, str], tail: Iterable[tuple[str, Iterable[tuple[str, str]]]],
               words: Sequence[str], shown: Collection[str] = ()) -> bool:
        """May a plan (its parameter ``binding`` and concrete ``tail``) fire after a message of
        ``words``, its trigger's outputs holding the values ``shown`` (JSON texts)? Every named
        literal the tail passes must be named, every held one shown; no ordered pair may be named
        the other way round."""
        first = _first_places(words)
        passed = {v for _, args in tail for _, v in args}
        if any(named_at(v, words, first) is None for v in self.named if v in passed):
            return False
        if any(v not in shown for v in self.held if v in passed):
            return False
        for a, b in self.order:
            pa, pb = (named_at(binding[p], words, first) if p in binding else None for p in (a, b))
            if pa is not None and pb is not None and pb < pa:
                return False
        return True

    def describe(self) -> list[str]:
        """One line per condition, for the route's script."""
        out = [f"replays {shown(v)} only when the message names it" for v in self.named]
        out += [f"replays {shown(v)} only when the trigger's outputs hold it" for v in self.held]
        out += [f"does not fire when the message names {{{b}}} before {{{a}}}" for a, b in self.order]
        return out

    def to_json(self) -> dict[str, Any]:
        return {"named": list(self.named), "held": list(self.held), "order": [list(p) for p in self.order]}

    @classmethod
    def from_json(cls, data: Any) -> "Told":
        """Read back (anything unreadable: nothing told)."""
        if not isinstance(data, Mapping):
            return cls()
        named = tuple(str(v) for v in data.get("named") or ())
        held = tuple(str(v) for v in data.get("held") or ())
        order = tuple((str(p[0]), str(p[1])) for p in data.get("order") or () if isinstance(p, list) and len(p) == 2)
        return cls(named=named, held=held, order=order)


class ToldTally:
    """Per distinct context at one alignment: what its message named and its trigger's outputs
    held (see the module docstring)."""

    def __init__(self) -> None:
        self.contexts = 0
        self.messages = 0
        self.named: Counter = Counter()
        self.held: Counter = Counter()
        self.before: Counter = Counter()  # (a, b) -> contexts whose message named a before b

    def add(self, words: Sequence[str], literals: Iterable[str], binding: Mapping[str, str],
            params: Sequence[str], shown: Collection[str] = ()) -> None:
        literals = {v for v in literals if _wordy(v) is not None}
        self.contexts += 1
        self.held.update(v for v in literals if v in shown)
        if not words:
            return  # no message: nothing named
        first = _first_places(words)
        self.messages += 1
        for value in literals:
            if named_at(value, words, first) is not None:
                self.named[value] += 1
        places = [(at, p) for p in params if p in binding and (at := named_at(binding[p], words, first)) is not None]
        for i, (pa, a) in enumerate(places):
            for pb, b in places[i + 1:]:
                if pa != pb:
                    self.before[(a, b) if pa < pb else (b, a)] += 1

    def told(self) -> Told:
        # named only when every context with a message named it: a context that read the literal
        # unprompted shows the work reads it whatever the message says (a file every task opens)
        named = tuple(sorted(v for v, n in self.named.items() if n >= MIN_CONTEXTS and n == self.messages))
        held = tuple(sorted(v for v, n in self.held.items() if n >= MIN_CONTEXTS and 2 * n > self.contexts))
        order = tuple(sorted(pair for pair, n in self.before.items()
                             if n >= MIN_CONTEXTS and 2 * n > n + self.before.get((pair[1], pair[0]), 0)))
        return Told(named=named, held=held, order=order)
