"""What a heard value looks like (TokenShape) and the character classes it is learned from. Moved out of
waggle.inbound so waggle.route can read a stored inbound route's shapes without importing inbound back."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


def _cls(ch: str) -> str:
    if ch.isdigit():
        return "9"
    if ch.isupper():
        return "A"
    if ch.islower() or ch.isalpha():
        return "a"
    return ch


def classes(value: str) -> frozenset[str]:
    return frozenset(_cls(ch) for ch in value)


@dataclass(frozen=True)
class TokenShape:
    """What a heard value looks like: classes every value had, classes any had, length range."""

    required: frozenset[str]
    allowed: frozenset[str]
    lo: int
    hi: int

    @classmethod
    def learn(cls, values: Iterable[str]) -> "TokenShape | None":
        vals = [v for v in values if isinstance(v, str) and v]
        if not vals:
            return None
        sets = [classes(v) for v in vals]
        lo, hi = min(map(len, vals)), max(map(len, vals))
        # a length that varied (names: mia_li_3668, mohamed_hernandez_5188) is not a property of
        # the values: the next one is as likely a little shorter or longer than those seen; a
        # length every value had (a 6-character code) is kept exactly
        spread = hi - lo
        return cls(required=frozenset.intersection(*sets), allowed=frozenset.union(*sets),
                   lo=max(1, lo - spread), hi=hi + spread)

    def fits(self, token: str) -> bool:
        if not (self.lo <= len(token) <= self.hi):
            return False
        got = classes(token)
        return self.required <= got <= self.allowed

    def to_json(self) -> dict[str, Any]:
        return {"required": "".join(sorted(self.required)), "allowed": "".join(sorted(self.allowed)),
                "lo": self.lo, "hi": self.hi}

    @classmethod
    def from_json(cls, data: Any) -> "TokenShape":
        return cls(required=frozenset(str(data["required"])), allowed=frozenset(str(data["allowed"])),
                   lo=int(data["lo"]), hi=int(data["hi"]))

    def describe(self) -> str:
        names = {"A": "upper", "a": "lower", "9": "digits"}
        req = ", ".join(names.get(c, repr(c)) for c in sorted(self.required)) or "anything"
        extra = sorted(self.allowed - self.required)
        more = f", may have {', '.join(names.get(c, repr(c)) for c in extra)}" if extra else ""
        size = f"{self.lo}" if self.lo == self.hi else f"{self.lo}-{self.hi}"
        return f"a token with {req}{more}, {size} chars"
