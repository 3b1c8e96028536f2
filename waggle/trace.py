"""The unit of the forage log: one recorded tool call (pure Python, no ORM).

A call keeps only what mining and replay need: the tool name, its arguments flattened to strings
(sorted by key, so the same call always has the same shape), whether the tool mutates state, a
short hash of its output and an estimate of the output's size in tokens (chars / 4).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

Args = tuple[tuple[str, str], ...]
Shape = tuple[str, tuple[str, ...]]


def flatten_value(value: Any) -> str:
    """One argument value as a string: strings stay as they are, anything else is compact JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def flatten_args(args: Mapping[str, Any] | None) -> Args:
    """Arguments as a sorted tuple of (key, string value) pairs."""
    if not args:
        return ()
    return tuple(sorted((str(k), flatten_value(v)) for k, v in args.items()))


def estimate_tokens(text: str | None) -> int:
    """The usual rough estimate: one token per four characters (rounded up)."""
    if not text:
        return 0
    return (len(text) + 3) // 4


def output_hash(text: str | None) -> str:
    """A short, stable fingerprint of a tool output."""
    return hashlib.sha256((text or "").encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Call:
    """One recorded tool invocation."""

    tool: str
    args: Args = ()
    mutates: bool = False
    out_hash: str = ""
    est_tokens: int = 0

    @classmethod
    def make(cls, tool: str, args: Mapping[str, Any] | None = None, *, mutates: bool = False,
             output: str | None = None) -> "Call":
        """Build a call from raw host data (arguments of any JSON type, raw output text)."""
        return cls(tool=str(tool), args=flatten_args(args), mutates=bool(mutates),
                   out_hash=output_hash(output), est_tokens=estimate_tokens(output))

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


def describe_call(tool: str, args: Mapping[str, str]) -> str:
    """A one-line human rendering: ``tool(key="value", ...)``."""
    inner = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(args.items()))
    return f"{tool}({inner})"
