"""A small deterministic TOML writer for exported manifests: the stdlib reads TOML but cannot write it.

Covers what a manifest holds: strings, integers, finite floats, booleans, lists of those, tables of
those (one level, written as [table]) and arrays of tables ([[name]], their nested tables inline).
Keys keep the order given; the caller sorts. Every string is a basic string with escapes, so any
text (quotes, backslashes, newlines, control characters, emoji) reads back exactly.
"""
from __future__ import annotations

import math
import re

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    return key if _BARE.match(key) else _string(key)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write {value!r} to a manifest")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    raise TypeError(f"cannot write a {type(value).__name__} to a manifest")


def _is_table_array(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def dumps(data: dict) -> str:
    """Plain keys first, then [tables], then [[arrays of tables]]: the order TOML needs."""
    lines: list[str] = []
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    arrays = {k: v for k, v in data.items() if _is_table_array(v)}
    for key, value in data.items():
        if key not in tables and key not in arrays:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, table in tables.items():
        lines += ["", f"[{_key(key)}]"] + [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    for key, items in arrays.items():
        for item in items:
            lines += ["", f"[[{_key(key)}]]"] + [f"{_key(k)} = {_value(v)}" for k, v in item.items()]
    return "\n".join(lines).lstrip("\n") + "\n"
