"""Robust extraction of the JSON a pass asks the model for (pure, no ORM).

Models wrap JSON in prose, code fences, or trail it with commentary. We accept the first JSON object
that decodes, wherever it sits; anything else is a ParseError, and the pass records it and changes
nothing."""
from __future__ import annotations

import json
import re

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n(.*?)```", re.S)


class ParseError(ValueError):
    pass


def storable(value: object) -> object:
    """A decoded JSON value with every string (keys too) as a database keeps it: NUL and lone
    surrogates (which a model's "\\u0000" or "\\ud800" escape decodes to) become U+FFFD. Without it one
    such reply crashed the whole pass on PostgreSQL, and every retry of it. (The host's
    veronica.plumbing.errors.storable does the same; learning imports nothing from the host.)"""
    if isinstance(value, str):
        value = value.replace("\x00", "\ufffd")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # via UTF-16: a split pair is joined, a lone half becomes U+FFFD
            value = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return value
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value


def extract_json_object(text: object) -> dict:
    if not isinstance(text, str):
        raise ParseError(f"model output is {type(text).__name__}, expected text")
    stripped = storable(text).strip()  # a raw NUL inside a JSON string would not even decode
    if not stripped:
        raise ParseError("model output is empty")
    candidates = [m.group(1) for m in _FENCE.finditer(stripped)] + [stripped]
    decoder = json.JSONDecoder()
    for candidate in candidates:
        candidate = candidate.strip()
        try:
            value = json.loads(candidate)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return storable(value)
        # scan for an embedded object: try every '{' until one decodes to a dict
        for match in re.finditer(r"\{", candidate):
            try:
                value, _end = decoder.raw_decode(candidate, match.start())
            except ValueError:
                continue
            if isinstance(value, dict):
                return storable(value)
    preview = stripped[:120].replace("\n", " ")
    raise ParseError(f"no JSON object found in model output: {preview!r}")


def unstorable(value: str) -> str:
    """Why a person's text cannot be stored (NUL, a lone surrogate), or "": refused, not rewritten.
    (What a model wrote is made storable() before it gets here.)"""
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode text (an unpaired surrogate)"
    return ""


def clean_text(value: object, *, field: str, max_chars: int, single_line: bool = True) -> str:
    """A model- or person-supplied text, whitespace-normalised and bounded."""
    if not isinstance(value, str):
        raise ParseError(f"{field} must be a string, got {type(value).__name__}")
    if unstorable(value):
        raise ParseError(f"{field} {unstorable(value)}")
    text = " ".join(value.split()) if single_line else value.strip()
    if not text:
        raise ParseError(f"{field} is empty")
    if len(text) > max_chars:
        raise ParseError(f"{field} is {len(text)} characters; the limit is {max_chars}")
    return text
