"""The unit of the forage log: one recorded tool call (pure Python, no ORM).

A call keeps only what mining and replay need: the tool name, its arguments (each value as its
canonical JSON text, sorted by key, so the same call always has the same shape and ``false``
stays ``false``), whether the tool mutates state, a short hash of its output, an estimate of the
output's size in tokens (chars / 4), and the output's *refs*: the short scalar leaves of a JSON
output with their paths (``(("reservations", 0), '"JG7FMM"')``), so a later step can be bound to
a value an earlier output listed.

Text from the host is made storable first: a lone surrogate (which no database accepts) becomes
U+FFFD. A call with an argument longer than ``MAX_LITERAL_CHARS`` is *oversized*: it is kept only
as a barrier (like a mutating call), so a huge literal never becomes a route, a script or a header.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

Args = tuple[tuple[str, str], ...]
Shape = tuple[str, tuple[str, ...]]
Path = tuple[str | int, ...]
Refs = tuple[tuple[Path, str], ...]

MAX_LITERAL_CHARS = 2000     # an argument longer than this makes the call a barrier
MAX_REF_VALUE_CHARS = 200    # output leaves longer than this are not kept as refs
MAX_REFS = 400               # leaves kept per output (first ones in document order)
MAX_REF_DEPTH = 8
MAX_PARSE_CHARS = 1_000_000  # outputs longer than this are not parsed for refs
SHOWN_VALUE_CHARS = 200      # a value shown in a header or a script is cut here
MIN_CHARS = 3                # a shorter string is never specific (see specific())
MIN_DIGITS = 3               # ... nor a number with fewer digits
MAX_TEXT_WORDS = 60          # specific words kept per plain-text output (the first ones)
TEXT_WORD_CHARS = 20_000     # a plain-text output is read for its words in this first part only
_SEP = "\\s\"'`()\\[\\]{}<>,;"  # what ends a word of a text (as evidence reads a reply's words)
# the words that may be specific: with a digit, a capital, "/" or "." (or any non-ASCII letter) in
# them; matched from a word's start, possessively (linear time: the rest are skipped in C)
_MARK = "0-9A-Z/.\u0080-\U0010ffff"
_CANDIDATES = re.compile(f"(?<![^{_SEP}])[^{_SEP}{_MARK}]*+[{_MARK}][^{_SEP}]*+")


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (valid UTF-8 everywhere)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        # via UTF-16: a split pair is joined back, a lone half becomes one U+FFFD
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def clean_json(value: Any) -> Any:
    """A JSON value with every string (keys included) made storable."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return clean_text(str(value))


def storable(value: Any) -> Any:
    """A JSON value as a database can keep it: PostgreSQL refuses NUL in text and in jsonb and an
    unpaired surrogate is not UTF-8, so each (keys included) becomes U+FFFD; its json has no NaN or
    Infinity (which Python's json reads from a tool's output), so they become null. Only for what is
    kept, never for what is replayed."""
    if isinstance(value, str):
        value = value.replace("\x00", "\ufffd")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # via UTF-16: a split pair is joined, a lone half becomes U+FFFD
            value = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return value
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def flatten_value(value: Any) -> str:
    """One argument value as canonical JSON text (``"x"`` for a string, ``false``, ``[1,2]``)."""
    try:
        return json.dumps(clean_json(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # (nested deeper than Python recurses: kept as text)
        return json.dumps(clean_text(str(value)[:MAX_LITERAL_CHARS + 1]), ensure_ascii=False)


def decode_value(text: str) -> Any:
    """The JSON value back from :func:`flatten_value`'s text."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def flatten_args(args: Mapping[str, Any] | None) -> Args:
    """Arguments as a sorted tuple of (key, canonical JSON text) pairs."""
    if not args:
        return ()
    return tuple(sorted((clean_text(str(k)), flatten_value(v)) for k, v in args.items()))


def args_json(args: Args | Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Flattened arguments back to a dict of JSON values (what the host's tool receives)."""
    return {k: decode_value(v) for k, v in args}


def estimate_tokens(text: str | None) -> int:
    """The usual rough estimate: one token per four characters (rounded up)."""
    if not text:
        return 0
    return (len(text) + 3) // 4


def output_hash(text: str | None) -> str:
    """A short, stable fingerprint of a tool output."""
    return hashlib.sha256((text or "").encode("utf-8", "surrogatepass")).hexdigest()[:16]


def specific(value: Any) -> str | None:
    """The value as text when it is specific enough not to turn up by chance, else None: a string
    of at least ``MIN_CHARS`` characters with a digit or a capital letter in it (an id, a flight
    number, a date, a person's name; ``economy`` or ``active`` are vocabulary), a path or a file,
    domain or e-mail name (``inventory/api.py``), or a number with at least ``MIN_DIGITS`` digits."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        text = str(value)
        return text if sum(ch.isdigit() for ch in text) >= MIN_DIGITS else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if len(text) < MIN_CHARS or len(text) > 200:
        return None
    if any(ch.isdigit() for ch in text) or any(ch.isupper() for ch in text):
        return text
    if len(text) >= 5 and ("/" in text or "." in text.strip(".")) and " " not in text:
        return text  # a path, a file or domain name, an address
    return None


def iter_text_words(text: str, chars: int = TEXT_WORD_CHARS) -> Iterable[str]:
    """The specific words of a plain text (its first ``chars`` characters), in order, repeats
    included. A capitalised word that opens a sentence (``The``, ``Error:``) is grammar, not a
    name: it is left out unless it has a digit or another capital."""
    text = text[:chars]
    for m in _CANDIDATES.finditer(text):  # (a word of lowercase letters alone is never specific: skipped in C)
        word = specific(m.group().strip(".:!?"))
        if word is None:
            continue
        if word[:1].isupper() and word[1:].islower() and not any(ch.isdigit() for ch in word):
            j = m.start() - 1
            while j >= 0 and text[j] in " \t":
                j -= 1
            if j < 0 or text[j] in ".:!?\n\r":
                continue
        yield word


def text_words(text: str | None) -> tuple[str, ...]:
    """A plain-text output's specific words (see :func:`iter_text_words`), each once, the first
    ``MAX_TEXT_WORDS``; a JSON output's leaves are its refs instead (:func:`output_refs`)."""
    out: dict[str, None] = {}
    for word in iter_text_words(text or ""):
        out[word] = None
        if len(out) >= MAX_TEXT_WORDS:
            break
    return tuple(out)


def is_json(text: str | None) -> bool:
    """The output is a JSON object or array (its words are keys and leaves, not prose)."""
    if not text or len(text) > MAX_PARSE_CHARS or text.lstrip()[:1] not in ("{", "["):
        return False
    try:
        json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def output_refs(text: str | None) -> Refs:
    """The short scalar leaves of a JSON output, with their paths, in document order."""
    if not text or len(text) > MAX_PARSE_CHARS:
        return ()
    head = text.lstrip()[:1]
    if head not in ("{", "["):
        return ()
    try:
        data = json.loads(text)
    except (TypeError, ValueError, RecursionError):  # an output nested thousands deep has no refs; its call is still recorded
        return ()
    out: list[tuple[Path, str]] = []

    def walk(node: Any, path: Path) -> None:
        if len(out) >= MAX_REFS or len(path) > MAX_REF_DEPTH:
            return
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, path + (clean_text(str(k)),))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + (i,))
        elif isinstance(node, (str, int, float)) and not isinstance(node, bool):
            if isinstance(node, str) and not node:
                return
            value = flatten_value(node)
            if len(value) <= MAX_REF_VALUE_CHARS:
                out.append((path, value))

    walk(data, ())
    return tuple(out)


def refs_from_json(data: Any) -> Refs:
    """Refs read back from storage (a list of ``[path, value]``); anything unreadable is dropped."""
    out = []
    for item in data or ():
        try:
            path, value = item
            out.append((tuple(p if isinstance(p, int) else str(p) for p in path), str(value)))
        except (TypeError, ValueError):
            continue
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Call:
    """One recorded tool invocation."""

    tool: str
    args: Args = ()
    mutates: bool = False
    out_hash: str = ""
    est_tokens: int = 0
    refs: Refs = ()
    oversized: bool = False
    words: tuple[str, ...] = field(default=(), compare=False)  # a plain-text output's (see text_words)

    @classmethod
    def make(cls, tool: str, args: Mapping[str, Any] | None = None, *, mutates: bool = False,
             output: str | None = None) -> "Call":
        """Build a call from raw host data (arguments of any JSON type, raw output text)."""
        flat = flatten_args(args)
        # A NUL cannot be stored as it is (see storable()): such a call is kept only as a barrier.
        oversized = any(len(v) > MAX_LITERAL_CHARS or "\\u0000" in v or "\x00" in k for k, v in flat)
        refs = () if mutates else output_refs(output)
        words = () if mutates or refs or is_json(output) else text_words(clean_text(output or ""))
        return cls(tool=clean_text(str(tool)), args=flat, mutates=bool(mutates), out_hash=output_hash(output),
                   est_tokens=estimate_tokens(output), refs=refs, oversized=oversized, words=words)

    @property
    def barrier(self) -> bool:
        """No route may contain this call (it changes state, or carries a huge literal)."""
        return self.mutates or self.oversized

    @property
    def shape(self) -> Shape:
        """What must be equal for two calls to be the same step: tool and argument keys."""
        return (self.tool, tuple(k for k, _ in self.args))

    @property
    def arg_dict(self) -> dict[str, str]:
        return dict(self.args)

    def invocation(self) -> tuple[str, Args]:
        """What the call did (tool and argument values), ignoring its result."""
        return (self.tool, self.args)

    def ref_map(self) -> dict[Path, str]:
        return dict(self.refs)


def shown(text: str, limit: int = SHOWN_VALUE_CHARS) -> str:
    """A value's JSON text cut for display (headers, scripts), saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…({len(text)} chars)"


def describe_call(tool: str, args: Mapping[str, str]) -> str:
    """A one-line human rendering: ``tool(key="value", flag=false, ...)`` (values as JSON text)."""
    inner = ", ".join(f"{k}={shown(v)}" for k, v in sorted(args.items()))
    return f"{tool}({inner})"
