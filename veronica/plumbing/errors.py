"""Errors every verb raises. Views map them to HTTP 400/404/409, tools to readable tool errors."""
from __future__ import annotations

import math


class VeronicaError(Exception):
    """Bad input or an illegal move. `field` names what was wrong, when one field was."""

    status = 400

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def as_dict(self) -> dict:
        out = {"error": self.message}
        if self.field:
            out["field"] = self.field
        return out


class NotFound(VeronicaError):
    status = 404


class Conflict(VeronicaError):
    """The move is legal in general but not in the current state (busy member, lost race, ...)."""

    status = 409


class RecipientError(VeronicaError):
    """Unknown or ambiguous send target; the message names the candidates."""


class IllegalTransition(Conflict):
    pass


def storable(value):
    """A JSON-like value with every string (keys too) made storable: NUL and unpaired surrogates become
    U+FFFD, a NaN or an Infinity (Python's json reads them) becomes null. For what a model or a tool
    produced, which is kept rather than refused (text_problem is for input that can be refused): on
    PostgreSQL one NUL in a reply failed the whole step, every retry of it, and parked the member."""
    if isinstance(value, str):
        if "\x00" in value:
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
        return None  # NaN and Infinity: Python's json reads them, PostgreSQL's json has no word for them
    return value


def text_problem(value: str) -> str:
    """Why a string cannot be stored as text, or "" when it can. PostgreSQL refuses NUL in text and
    jsonb and a lone surrogate is not encodable as UTF-8; SQLite takes the first, so the check must
    be ours for both databases to answer the same."""
    if "\x00" in value:
        return f"contains a NUL character (at position {value.index(chr(0))})"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid Unicode text (an unpaired surrogate at position {exc.start})"
    return ""


MAX_JSON_DEPTH = 32  # the deepest parsed JSON a request may nest; no endpoint or webhook needs more than 3


def check_tree(data: object, *, root: str = "", max_depth: int = MAX_JSON_DEPTH, what: str = "the request body") -> None:
    """Walk parsed JSON without recursion: depth within max_depth, every string (key or value)
    storable text. The error names the path of the offending field, e.g. `rule_domains[2]`."""
    stack: list[tuple[object, str, int]] = [(data, root, 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > max_depth:
            raise VeronicaError(f"{what} nests deeper than {max_depth} levels", field=root or "json")
        if isinstance(node, dict):
            for key, value in node.items():
                child = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and text_problem(key):
                    raise VeronicaError(f"a key in {path or what} {text_problem(key)}", field=path or "json")
                stack.append((value, child, depth + 1))
        elif isinstance(node, list):
            stack.extend((value, f"{path}[{i}]", depth + 1) for i, value in enumerate(node))
        elif isinstance(node, str) and text_problem(node):
            raise VeronicaError(f"{path or what} {text_problem(node)}", field=path or "json")


def require_text(value: object, field: str, *, max_len: int, allow_empty: bool = False) -> str:
    """The one validator for free text: type, storable characters, emptiness and a length limit
    that the error names."""
    if not isinstance(value, str):
        raise VeronicaError(f"{field} must be a string", field=field)
    problem = text_problem(value)
    if problem:
        raise VeronicaError(f"{field} {problem}", field=field)
    text = value.strip()
    if not text and not allow_empty:
        raise VeronicaError(f"{field} must not be empty", field=field)
    if len(value) > max_len:
        raise VeronicaError(f"{field} is {len(value)} characters; the limit is {max_len}", field=field)
    return value if allow_empty else text


INT_RANGE = (-2**31, 2**31 - 1)  # an IntegerField on PostgreSQL


def check_int(value: object, field: str, *, minimum: int = INT_RANGE[0], maximum: int = INT_RANGE[1]) -> int:
    """The one validator for whole numbers: an int (never a bool) within the limits the error names."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise VeronicaError(f"{field} must be an integer", field=field)
    if not minimum <= value <= maximum:
        raise VeronicaError(f"{field} is {value}; it must be from {minimum} to {maximum}", field=field)
    return value


def column_limit(model: type, name: str) -> int:
    """A CharField's max_length, so a verb's limit is the column's and cannot drift from it."""
    return model._meta.get_field(name).max_length
