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


def extract_json_object(text: object) -> dict:
    if not isinstance(text, str):
        raise ParseError(f"model output is {type(text).__name__}, expected text")
    stripped = text.strip()
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
            return value
        # scan for an embedded object: try every '{' until one decodes to a dict
        for match in re.finditer(r"\{", candidate):
            try:
                value, _end = decoder.raw_decode(candidate, match.start())
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    preview = stripped[:120].replace("\n", " ")
    raise ParseError(f"no JSON object found in model output: {preview!r}")


def clean_text(value: object, *, field: str, max_chars: int, single_line: bool = True) -> str:
    """A model- or person-supplied text, whitespace-normalised and bounded."""
    if not isinstance(value, str):
        raise ParseError(f"{field} must be a string, got {type(value).__name__}")
    text = " ".join(value.split()) if single_line else value.strip()
    if not text:
        raise ParseError(f"{field} is empty")
    if len(text) > max_chars:
        raise ParseError(f"{field} is {len(text)} characters; the limit is {max_chars}")
    return text
