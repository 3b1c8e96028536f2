"""A stored route (a waggle's body) and its human-readable script (pure Python, no ORM).

A route is a list of steps. Each step names a tool and gives every argument either a literal value
or a parameter name. Routes are stored as JSON (``Route.to_json`` / ``Route.from_json``); the name
of a mined route is derived from its content, so the same route always gets the same name.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from waggle.miner import Candidate
from waggle.trace import Call

ROUTE_FORMAT = 1
_NAME_SAFE = re.compile(r"[^A-Za-z0-9_.]+")


class RouteFormatError(ValueError):
    """A stored route that cannot be read back."""


@dataclass(frozen=True)
class Step:
    """One step: a tool, its literal arguments and its parameter-bound arguments (key -> param)."""

    tool: str
    literals: tuple[tuple[str, str], ...] = ()
    binds: tuple[tuple[str, str], ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(sorted([k for k, _ in self.literals] + [k for k, _ in self.binds]))

    @property
    def param_names(self) -> set[str]:
        return {p for _, p in self.binds}

    def match(self, call: Call, binding: Mapping[str, str]) -> dict[str, str] | None:
        """The binding extended by this call, or None if the call is not this step."""
        if call.mutates or call.tool != self.tool:
            return None
        args = call.arg_dict
        if tuple(sorted(args)) != self.keys:
            return None
        for key, value in self.literals:
            if args[key] != value:
                return None
        out = dict(binding)
        for key, name in self.binds:
            value = args[key]
            if out.setdefault(name, value) != value:
                return None
        return out

    def concrete(self, binding: Mapping[str, str]) -> tuple[str, tuple[tuple[str, str], ...]] | None:
        """(tool, sorted args) with parameters filled in, or None if one is unbound."""
        args = dict(self.literals)
        for key, name in self.binds:
            if name not in binding:
                return None
            args[key] = binding[name]
        return (self.tool, tuple(sorted(args.items())))

    def describe(self) -> str:
        parts = [f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in self.literals]
        parts += [f"{k}={{{p}}}" for k, p in self.binds]
        parts.sort()
        return f"{self.tool}({', '.join(parts)})"


@dataclass(frozen=True)
class Route:
    """A replayable route. ``examples`` (param -> a value seen) and ``count`` are informative and
    not part of the route's identity."""

    steps: tuple[Step, ...]
    params: tuple[str, ...] = ()
    name: str = ""
    scope: str = "space"
    examples: Mapping[str, str] = field(default_factory=dict, compare=False)
    count: int = field(default=0, compare=False)
    trigger: int = field(default=0, compare=False)  # leading steps needed before a replay (0: min_prefix)
    confidence: float = field(default=0.0, compare=False)  # share of trigger sightings followed by the tail

    def __len__(self) -> int:
        return len(self.steps)

    # -- identity ------------------------------------------------------------------------------
    def canonical(self) -> dict[str, Any]:
        return {
            "steps": [{"tool": s.tool, "args": dict(s.literals), "params": dict(s.binds)} for s in self.steps],
            "params": list(self.params),
        }

    def content_hash(self) -> str:
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()

    def stable_name(self) -> str:
        """``tool1.tool2...-<hash>``: readable, and the same for the same route content."""
        tools = [(_NAME_SAFE.sub("_", s.tool) or "tool") for s in self.steps]
        label = ".".join(tools)
        if len(label) > 80:
            label = label[:80].rstrip("._")
        return f"{label}-{self.content_hash()[:10]}"

    # -- replay helpers ------------------------------------------------------------------------
    def determined_at(self, m: int) -> bool:
        """True when every parameter used by steps[m:] is bound by steps[:m]."""
        bound: set[str] = set()
        for s in self.steps[:m]:
            bound |= s.param_names
        return all(s.param_names <= bound for s in self.steps[m:])

    def replayable(self, min_prefix: int) -> bool:
        """True when some prefix of at least ``min_prefix`` (>= 2) steps fully determines a
        non-empty tail."""
        m0 = max(2, int(min_prefix))
        return any(self.determined_at(m) for m in range(m0, len(self.steps)))

    def with_trigger(self, trigger: int, confidence: float) -> "Route":
        return replace(self, trigger=trigger, confidence=confidence)

    def bind_all(self, values: Mapping[str, str]) -> list[tuple[str, dict[str, str]]]:
        """Every step as (tool, args) with ``values`` for the parameters (all must be present)."""
        out = []
        for s in self.steps:
            conc = s.concrete(values)
            if conc is None:
                missing = sorted(s.param_names - set(values))
                raise KeyError(missing[0] if missing else "?")
            out.append((conc[0], dict(conc[1])))
        return out

    # -- storage -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = self.canonical()
        data["format"] = ROUTE_FORMAT
        data["examples"] = dict(self.examples)
        data["count"] = self.count
        data["trigger"] = self.trigger
        data["confidence"] = round(self.confidence, 4)
        return data

    @classmethod
    def from_json(cls, data: Any, *, name: str = "", scope: str = "space") -> "Route":
        try:
            if isinstance(data, str):
                data = json.loads(data)
            steps = []
            for raw in data["steps"]:
                tool = raw["tool"]
                if not isinstance(tool, str) or not tool:
                    raise RouteFormatError("step without a tool")
                lits = tuple(sorted((str(k), str(v)) for k, v in (raw.get("args") or {}).items()))
                binds = tuple(sorted((str(k), str(v)) for k, v in (raw.get("params") or {}).items()))
                if {k for k, _ in lits} & {k for k, _ in binds}:
                    raise RouteFormatError("an argument is both literal and a parameter")
                steps.append(Step(tool=tool, literals=lits, binds=binds))
            if not steps:
                raise RouteFormatError("route without steps")
            used = set().union(*(s.param_names for s in steps))
            params = tuple(str(p) for p in data.get("params") or sorted(used))
            if set(params) != used:
                raise RouteFormatError("parameter list does not match the steps")
            examples = {str(k): str(v) for k, v in (data.get("examples") or {}).items()}
            trigger = int(data.get("trigger") or 0)
            if trigger < 0 or trigger >= len(steps):
                raise RouteFormatError("trigger must leave at least one step to replay")
            return cls(steps=tuple(steps), params=params, name=name, scope=scope, examples=examples,
                       count=int(data.get("count") or 0), trigger=trigger,
                       confidence=float(data.get("confidence") or 0.0))
        except RouteFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RouteFormatError(f"unreadable route: {exc}") from exc

    @classmethod
    def from_candidate(cls, cand: Candidate, *, scope: str = "space") -> "Route":
        """The route a mined candidate stands for, named by its content."""
        param_at = {pos: p.name for p in cand.params for pos in p.positions}
        steps = []
        for j, call in enumerate(cand.steps):
            lits, binds = [], []
            for key, value in call.args:
                pname = param_at.get((j, key))
                if pname is None:
                    lits.append((key, value))
                else:
                    binds.append((key, pname))
            steps.append(Step(tool=call.tool, literals=tuple(lits), binds=tuple(binds)))
        params = tuple(p.name for p in cand.params)
        examples = {p.name: p.values[-1] for p in cand.params if p.values}
        route = cls(steps=tuple(steps), params=params, scope=scope, examples=examples, count=cand.count)
        return cls(steps=route.steps, params=params, name=route.stable_name(), scope=scope,
                   examples=examples, count=cand.count)


def render_script(route: Route, *, min_prefix: int = 2) -> str | None:
    """The human-readable script of a route, or None when the route cannot be crystallized
    (no steps, or a step without a tool)."""
    if not route.steps or any(not s.tool for s in route.steps):
        return None
    lines = [f"# waggle {route.name}", f"# scope: {route.scope}"]
    meta = [f"{len(route.steps)} read-only steps"]
    if route.count:
        meta.append(f"seen {route.count}x when mined")
    lines.append("# " + ", ".join(meta))
    if route.params:
        shown = []
        for p in route.params:
            ex = route.examples.get(p)
            shown.append(f"{{{p}}} (e.g. {json.dumps(ex, ensure_ascii=False)})" if ex is not None else f"{{{p}}}")
        lines.append("# parameters: " + ", ".join(shown))
    else:
        lines.append("# parameters: none")
    m0 = max(2, int(min_prefix), route.trigger)
    trigger = next((m for m in range(m0, len(route.steps)) if route.determined_at(m)), None)
    if trigger is None:
        lines.append("# replay: on demand only (its later steps need values the first steps do not give)")
    else:
        conf = f" (when mined, {route.confidence:.0%} of these starts went on this way)" if route.confidence else ""
        lines.append(f"# replay: after the first {trigger} steps, the remaining {len(route.steps) - trigger} "
                     f"run automatically{conf}")
    lines.append("")
    for i, s in enumerate(route.steps, 1):
        lines.append(f"{i}. {s.describe()}")
    return "\n".join(lines) + "\n"


def steps_summary(route: Route) -> list[str]:
    return [s.describe() for s in route.steps]


class TraceIndex:
    """Positions of each tool in a trace, so a route's starts are found without a full scan."""

    def __init__(self, calls: Sequence[Call | None]) -> None:
        self.calls = calls
        self.by_tool: dict[str, list[int]] = {}
        for i, c in enumerate(calls):
            if c is not None and not c.mutates:
                self.by_tool.setdefault(c.tool, []).append(i)


def prefix_confidence(route: Route, index: TraceIndex, m: int) -> tuple[int, int]:
    """In the trace: how often the first ``m`` steps occur (``seen``), and how often they are
    followed by exactly the tail they determine (``followed``)."""
    calls = index.calls
    n = len(calls)
    seen = followed = 0
    first = route.steps[0]
    for p in index.by_tool.get(first.tool, ()):
        if p + m > n:
            break
        binding: dict[str, str] | None = {}
        for step, call in zip(route.steps[:m], calls[p:p + m]):
            if call is None:
                binding = None
                break
            binding = step.match(call, binding)
            if binding is None:
                break
        if binding is None:
            continue
        seen += 1
        end = p + len(route.steps)
        if end > n:
            continue
        ok = True
        for step, call in zip(route.steps[m:], calls[p + m:end]):
            conc = step.concrete(binding)
            if call is None or call.mutates or conc is None or (call.tool, call.args) != conc:
                ok = False
                break
        followed += ok
    return seen, followed


def choose_trigger(route: Route, index: TraceIndex, min_prefix: int, min_confidence: float) -> Route | None:
    """The route with the shortest trigger (>= min_prefix leading steps, tail fully determined)
    that, in the mined trace, was followed by the rest of the route at least ``min_confidence``
    of the time; None when there is none."""
    m0 = max(2, int(min_prefix))
    for m in range(m0, len(route.steps)):
        if not route.determined_at(m):
            continue
        seen, followed = prefix_confidence(route, index, m)
        if seen and followed / seen >= min_confidence:
            return route.with_trigger(m, followed / seen)
    return None
