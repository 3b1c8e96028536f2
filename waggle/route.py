"""A stored route (a waggle's body) and its human-readable script (pure Python, no ORM).

A route is a list of steps. Each step names a tool and gives every argument one of:

* a literal JSON value (the same in every occurrence; its type is kept: ``false`` stays false),
* a parameter name (a value first seen as an argument of an earlier step, or given on demand),
* a *ref*: the value at a JSON path in an earlier step's output (``get_user_details`` lists
  ``reservations``; ``get_reservation_details(reservation_id=<step 1 output>.reservations[2])``).
  The miner learns a ref when, in the occurrences it mined, the argument equalled that output leaf.

The last step may *fan out* (``each``): it repeats for the element its ref names and every later
element of the same list (``reservations[2]``, ``[3]``, ...), up to a cap. The miner marks a step so
only when the occurrences walked that list element after element.

Routes are stored as JSON (``Route.to_json`` / ``Route.from_json``); the name of a mined route is
derived from its content, so the same route always gets the same name.

Confidence: a route may fire only after the prefix that triggers it was seen in at least
``min_contexts`` distinct contexts (different argument values: near-copies of one task count
once) and the Wilson lower bound of "replayed steps the agent then made itself" over those
sightings reaches ``min_confidence``; each replayed step (and each fan-out element) seen in
enough contexts must reach it on its own too, so a route replays only its predictable steps (see
``choose_trigger``). The sightings come from a pair index (the positions of
each pair of consecutive call shapes), so judging a route never scans the whole trace.

Every alignment (leading steps matched) is judged that way on its own sightings: ``reach`` says
how many tail positions replay there, and ``evidence`` keeps each position's mined tally, which
the live ledger extends (a position the model keeps redoing stops being replayed). A step whose
referenced output value is missing ends the tail, so a route is judged on every context its
trigger occurs in, not only on those long enough to hold all of it. What the learning episodes
told (a literal their messages named or the trigger's outputs held, parameters the messages named
in an order) must hold again for the route to fire (``Route.told``, see :mod:`waggle.told`).

One file past 500 lines on purpose: a route's steps, its script (printed and parsed back) and its
replay-time resolution are one grammar; the printer and the parser must change together.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Collection, Mapping, Sequence

from waggle.miner import Candidate
from waggle.shape import TokenShape
from waggle.told import Told, ToldTally
from waggle.trace import Call, Path, decode_value, flatten_value, shown

ROUTE_FORMAT = 2
_NAME_SAFE = re.compile(r"[^A-Za-z0-9_.]+")
DEFAULT_FANOUT_CAP = 8

Source = tuple[int, Path]  # (earlier step index, path in that step's output)
ConcreteStep = tuple[str, tuple[tuple[str, str], ...]]


class RouteFormatError(ValueError):
    """A stored route that cannot be read back."""


def wilson_lower(successes: float, n: float, z: float) -> float:
    """Wilson score lower bound of a proportion (0 when there is no evidence)."""
    if n <= 0:
        return 0.0
    p = min(1.0, max(0.0, successes / n))
    z2 = z * z
    centre = p + z2 / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, (centre - margin) / (1 + z2 / n))


def wilson_upper(successes: float, n: float, z: float) -> float:
    """Wilson score upper bound of a proportion (1 when there is no evidence)."""
    if n <= 0:
        return 1.0
    p = min(1.0, max(0.0, successes / n))
    z2 = z * z
    centre = p + z2 / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return min(1.0, (centre + margin) / (1 + z2 / n))


def mined_prior(data: Any, min_contexts: int) -> tuple[float, float]:
    """What vouched for a stored route (its JSON) beyond the bar when it was mined, as evidence
    the live ledger adds to: (its distinct contexts past ``min_contexts``, as many times its
    lower bound of use). A route stored on the bare minimum has nothing to spare (its first live
    miss may demote it); one that 18 contexts vouched for is not buried by one early miss."""
    if not isinstance(data, Mapping):
        return 0.0, 0.0
    try:
        n = max(0, int(data.get("contexts") or 0) - max(0, int(min_contexts)))
        share = min(1.0, max(0.0, float(data.get("confidence") or 0.0)))
    except (TypeError, ValueError):
        return 0.0, 0.0
    return float(n), n * share


def _last_index(path: Path) -> int | None:
    """Position of the last list index in a path (where a fan-out iterates), or None."""
    for i in range(len(path) - 1, -1, -1):
        if isinstance(path[i], int):
            return i
    return None


def _path_text(path: Path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path) or "."


@dataclass(frozen=True)
class Step:
    """One step: a tool, its literal arguments (key -> JSON text), its parameter-bound arguments
    (key -> param), its output-bound arguments (key -> (step, path)) and whether it fans out."""

    tool: str
    literals: tuple[tuple[str, str], ...] = ()
    binds: tuple[tuple[str, str], ...] = ()
    refs: tuple[tuple[str, Source], ...] = ()
    each: bool = False

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(sorted([k for k, _ in self.literals] + [k for k, _ in self.binds] + [k for k, _ in self.refs]))

    @property
    def shape(self) -> tuple[str, tuple[str, ...]]:
        return (self.tool, self.keys)

    @property
    def param_names(self) -> set[str]:
        return {p for _, p in self.binds}

    @property
    def ref_sources(self) -> set[int]:
        return {src for _, (src, _) in self.refs}

    def match(self, call: Call, binding: Mapping[str, str], prior: Sequence[Call] = ()) -> dict[str, str] | None:
        """The binding extended by this call, or None if the call is not this step. ``prior`` are
        the calls matched to the earlier steps (their outputs resolve refs)."""
        if call.barrier or call.tool != self.tool:
            return None
        args = call.arg_dict
        if tuple(sorted(args)) != self.keys:
            return None
        for key, value in self.literals:
            if args[key] != value:
                return None
        for key, (src, path) in self.refs:
            if src >= len(prior) or prior[src].ref_map().get(path) != args[key]:
                return None
        out = dict(binding)
        for key, name in self.binds:
            value = args[key]
            if out.setdefault(name, value) != value:
                return None
        return out

    def concretes(self, binding: Mapping[str, str], prior: Sequence[Call], cap: int = DEFAULT_FANOUT_CAP
                  ) -> list[ConcreteStep] | None:
        """The concrete calls of this step (several when it fans out), or None when a parameter
        or a referenced output value is missing."""
        base: dict[str, str] = dict(self.literals)
        for key, name in self.binds:
            if name not in binding:
                return None
            base[key] = binding[name]
        fan_key = None
        for key, (src, path) in self.refs:
            if src >= len(prior):
                return None
            value = prior[src].ref_map().get(path)
            if value is None:
                return None
            base[key] = value
            if self.each:
                fan_key = (key, src, path)
        if fan_key is None:
            return [(self.tool, tuple(sorted(base.items())))]
        key, src, path = fan_key
        at = _last_index(path)
        if at is None:
            return [(self.tool, tuple(sorted(base.items())))]
        refs = prior[src].ref_map()
        out = []
        i = int(path[at])
        while len(out) < max(1, cap):
            value = refs.get(path[:at] + (i,) + path[at + 1:])
            if value is None:
                break
            args = dict(base)
            args[key] = value
            out.append((self.tool, tuple(sorted(args.items()))))
            i += 1
        return out

    def concrete(self, binding: Mapping[str, str], prior: Sequence[Call] = ()) -> ConcreteStep | None:
        """The first concrete call of this step (see :meth:`concretes`)."""
        got = self.concretes(binding, prior, cap=1)
        return got[0] if got else None

    def describe(self) -> str:
        parts = [f"{k}={shown(v)}" for k, v in self.literals]
        parts += [f"{k}={{{p}}}" for k, p in self.binds]
        for k, (src, path) in self.refs:
            if self.each and (at := _last_index(path)) is not None:
                tail = path[:at] + ("*",) + path[at + 1:]
                text = "".join("[*]" if p == "*" else (f"[{p}]" if isinstance(p, int) else f".{p}") for p in tail)
                parts.append(f"{k}={{step {src + 1} output{text} from [{path[at]}]}}")
            else:
                parts.append(f"{k}={{step {src + 1} output{_path_text(path)}}}")
        parts.sort()
        prefix = "for each: " if self.each else ""
        return f"{prefix}{self.tool}({', '.join(parts)})"


@dataclass(frozen=True)
class Route:
    """A replayable route. ``examples`` (param -> a value seen), ``count``, ``trigger``,
    ``confidence`` and ``contexts`` are informative and not part of the route's identity."""

    steps: tuple[Step, ...]
    params: tuple[str, ...] = ()
    name: str = ""
    scope: str = "space"
    examples: Mapping[str, str] = field(default_factory=dict, compare=False)
    count: int = field(default=0, compare=False)
    trigger: int = field(default=0, compare=False)  # leading steps needed before a replay (0: min_prefix)
    confidence: float = field(default=0.0, compare=False)  # lower bound: replayed steps the agent made itself
    contexts: int = field(default=0, compare=False)  # distinct contexts the trigger was seen in when judged
    cap: int = field(default=0, compare=False)  # calls the fan-out step may make (learned; 0: the config's cap)
    # alignment m (leading steps matched) -> tail positions replayed there, each judged on its own
    # evidence at that alignment (learned; empty: routes stored before, the whole tail)
    reach: Mapping[int, int] = field(default_factory=dict, compare=False)
    # (alignment, tail position) -> (contexts offered it, contexts where the agent made it), as mined
    evidence: Mapping[tuple[int, int], tuple[int, int]] = field(default_factory=dict, compare=False)
    # an inbound route (see waggle.inbound): these parameters are heard, i.e. bound to a token of
    # the message that woke the member; part of the route's identity
    heard: tuple[str, ...] = ()
    # each heard parameter's learned token shape, and the shapes of the space's other heard
    # arguments (a token of theirs pending makes the message ambiguous); learned, not identity
    shapes: Mapping[str, Any] = field(default_factory=dict, compare=False)
    rivals: tuple = field(default=(), compare=False)
    # a joined inbound route: the heard value must also stand in an earlier output of the session
    # at this place, (tool, path with list indexes as "*") (the id the user names *and* the one
    # the user's own record lists); learned, not identity; empty: the message alone decides
    source: tuple = field(default=(), compare=False)
    # what the learning episodes told (literals their messages named or the trigger's outputs
    # held, parameters named in an order): the route fires only where that holds (waggle.told)
    told: Told = field(default_factory=Told, compare=False)

    def __len__(self) -> int:
        return len(self.steps)

    # -- identity ------------------------------------------------------------------------------
    def canonical(self) -> dict[str, Any]:
        steps = []
        for s in self.steps:
            item: dict[str, Any] = {"tool": s.tool, "args": {k: decode_value(v) for k, v in s.literals},
                                    "params": dict(s.binds)}
            if s.refs:
                item["refs"] = {k: [src, list(path)] for k, (src, path) in s.refs}
            if s.each:
                item["each"] = True
            steps.append(item)
        out: dict[str, Any] = {"steps": steps, "params": list(self.params)}
        if self.heard:
            out["heard"] = list(self.heard)
        return out

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
        """True when every parameter and output ref used by steps[m:] is given by steps[:m]."""
        bound: set[str] = set()
        for s in self.steps[:m]:
            bound |= s.param_names
        return all(s.param_names <= bound and all(src < m for src in s.ref_sources) for s in self.steps[m:])

    def replayable(self, min_prefix: int) -> bool:
        """True when some prefix of at least ``min_prefix`` (>= 2) steps fully determines a
        non-empty tail."""
        m0 = max(2, int(min_prefix))
        return any(self.determined_at(m) for m in range(m0, len(self.steps)))

    def with_trigger(self, trigger: int, confidence: float, contexts: int = 0, cap: int = 0,
                     reach: Mapping[int, int] | None = None,
                     evidence: Mapping[tuple[int, int], tuple[int, int]] | None = None,
                     told: Told | None = None) -> "Route":
        return replace(self, trigger=trigger, confidence=confidence, contexts=contexts, cap=cap,
                       reach=dict(reach or {}), evidence=dict(evidence or {}), told=told or Told())

    def reach_at(self, m: int) -> int | None:
        """Tail positions to replay when the first ``m`` steps matched: None for a route without
        learned reach (its whole tail), 0 where the evidence at that alignment did not pass."""
        if not self.reach:
            return None
        return self.reach.get(m, 0)

    @property
    def fans_out(self) -> bool:
        return bool(self.steps) and self.steps[-1].each

    def fanout_cap(self, limit: int) -> int:
        """Calls the fan-out step may make: the route's learned cap, never above ``limit``."""
        return max(1, min(self.cap, limit) if self.cap else limit)

    def bind_all(self, values: Mapping[str, str]) -> list[tuple[str, dict[str, str]]]:
        """Every step as (tool, args) with ``values`` for the parameters (all must be present).
        Only for routes without output refs (those are run step by step: replay.run_route)."""
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
        data["examples"] = {k: decode_value(v) for k, v in self.examples.items()}
        data["count"] = self.count
        data["trigger"] = self.trigger
        data["confidence"] = round(self.confidence, 4)
        data["contexts"] = self.contexts
        data["cap"] = self.cap
        if self.heard:
            data["shapes"] = {k: v.to_json() for k, v in sorted(self.shapes.items())}
            data["rivals"] = [r.to_json() for r in self.rivals]
            if self.source:
                data["source"] = [self.source[0], list(self.source[1])]
        if self.reach:
            data["reach"] = {str(m): r for m, r in sorted(self.reach.items())}
        if self.evidence:
            data["evidence"] = {f"{m}:{pos}": list(v) for (m, pos), v in sorted(self.evidence.items())}
        if self.told:
            data["told"] = self.told.to_json()
        return data

    @classmethod
    def from_json(cls, data: Any, *, name: str = "", scope: str = "space") -> "Route":
        try:
            if isinstance(data, str):
                data = json.loads(data)
            typed = int(data.get("format") or 1) >= 2  # format 1 stored every value as a string
            lit = (lambda v: flatten_value(v)) if typed else (lambda v: flatten_value(str(v)))
            steps = []
            for raw in data["steps"]:
                tool = raw["tool"]
                if not isinstance(tool, str) or not tool:
                    raise RouteFormatError("step without a tool")
                lits = tuple(sorted((str(k), lit(v)) for k, v in (raw.get("args") or {}).items()))
                binds = tuple(sorted((str(k), str(v)) for k, v in (raw.get("params") or {}).items()))
                refs = []
                for k, (src, path) in (raw.get("refs") or {}).items():
                    src = int(src)
                    if src < 0 or src >= len(steps):
                        raise RouteFormatError("an output ref must name an earlier step")
                    refs.append((str(k), (src, tuple(p if isinstance(p, int) else str(p) for p in path))))
                keys = [k for k, _ in lits] + [k for k, _ in binds] + [k for k, _ in refs]
                if len(keys) != len(set(keys)):
                    raise RouteFormatError("an argument is given twice (literal, parameter or ref)")
                each = bool(raw.get("each"))
                if each and len(refs) != 1:
                    raise RouteFormatError("a fan-out step needs exactly one output ref")
                steps.append(Step(tool=tool, literals=lits, binds=binds, refs=tuple(sorted(refs)), each=each))
            if not steps:
                raise RouteFormatError("route without steps")
            if any(s.each for s in steps[:-1]):
                raise RouteFormatError("only the last step may fan out")
            used = set().union(*(s.param_names for s in steps))
            params = tuple(str(p) for p in data.get("params") or sorted(used))
            if set(params) != used:
                raise RouteFormatError("parameter list does not match the steps")
            examples = {str(k): lit(v) for k, v in (data.get("examples") or {}).items()}
            trigger = int(data.get("trigger") or 0)
            if trigger < 0 or trigger >= len(steps):
                raise RouteFormatError("trigger must leave at least one step to replay")
            reach = {int(m): max(0, int(r)) for m, r in (data.get("reach") or {}).items()}
            if any(m < 1 or m >= len(steps) for m in reach):
                raise RouteFormatError("reach must name alignments that leave a step to replay")
            evidence = {}
            for key, (offered, used) in (data.get("evidence") or {}).items():
                m, pos = (int(x) for x in str(key).split(":"))
                evidence[(m, pos)] = (int(offered), int(used))
            return cls(steps=tuple(steps), params=params, name=name, scope=scope, examples=examples,
                       count=int(data.get("count") or 0), trigger=trigger,
                       confidence=float(data.get("confidence") or 0.0), contexts=int(data.get("contexts") or 0),
                       cap=max(0, int(data.get("cap") or 0)), reach=reach, evidence=evidence,
                       told=Told.from_json(data.get("told")), **_heard_from_json(data, params, steps))
        except RouteFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RouteFormatError(f"unreadable route: {exc}") from exc

    @classmethod
    def from_candidate(cls, cand: Candidate, *, scope: str = "space") -> "Route":
        """The route a mined candidate stands for, named by its content: varying arguments become
        parameters, or output refs where an earlier output held the value (see derive_refs)."""
        refs = derive_refs(cand)
        param_at = {pos: p.name for p in cand.params if p.name not in refs for pos in p.positions}
        ref_at = {pos: refs[p.name] for p in cand.params if p.name in refs for pos in p.positions}
        steps = []
        for j, call in enumerate(cand.steps):
            lits, binds, srcs = [], [], []
            for key, value in call.args:
                if (j, key) in ref_at:
                    srcs.append((key, ref_at[(j, key)]))
                elif (pname := param_at.get((j, key))) is not None:
                    binds.append((key, pname))
                else:
                    lits.append((key, value))
            steps.append(Step(tool=call.tool, literals=tuple(lits), binds=tuple(binds), refs=tuple(srcs)))
        steps = _mark_fanout(steps)
        params = tuple(p.name for p in cand.params if p.name not in refs)
        examples = {p.name: p.values[-1] for p in cand.params if p.values and p.name not in refs}
        route = cls(steps=tuple(steps), params=params, scope=scope, examples=examples, count=cand.count)
        return replace(route, name=route.stable_name())


def derive_refs(cand: Candidate) -> dict[str, Source]:
    """Parameters whose value, in most chosen occurrences (more than half, and at least two), was a
    leaf of an earlier step's output: param name -> (step, path). The most frequent source wins;
    ties go to the latest step, then the shortest path."""
    trace, starts = cand.trace, cand.starts
    if not trace or not starts:
        return {}
    out: dict[str, Source] = {}
    for p in cand.params:
        j, key = min(p.positions)
        if j == 0:
            continue
        counts: Counter = Counter()
        for s in starts:
            call = trace[s + j]
            if call is None:
                continue
            value = call.arg_dict.get(key)
            found = set()
            for i in range(j):
                prev = trace[s + i]
                if prev is None:
                    continue
                for path, v in prev.refs:
                    if v == value:
                        found.add((i, path))
            counts.update(found)
        if not counts:
            continue
        (src, path), hits = max(counts.items(), key=lambda kv: (kv[1], kv[0][0], -len(kv[0][1])))
        if hits >= 2 and hits * 2 > len(starts):
            out[p.name] = (src, path)
    return out


def _mark_fanout(steps: list[Step]) -> list[Step]:
    """Mark the last step as a fan-out when it ends a run of >= 2 steps that walked one list
    element after element (same tool and literals, one ref each, consecutive indexes)."""
    if len(steps) < 3:
        return steps
    last = steps[-1]
    if len(last.refs) != 1 or last.binds:
        return steps
    key, (src, path) = last.refs[0]
    at = _last_index(path)
    if at is None:
        return steps
    prev = steps[-2]
    if (prev.tool != last.tool or prev.literals != last.literals or prev.binds or len(prev.refs) != 1):
        return steps
    pkey, (psrc, ppath) = prev.refs[0]
    if (pkey != key or psrc != src or len(ppath) != len(path) or ppath[:at] != path[:at]
            or ppath[at + 1:] != path[at + 1:] or ppath[at] != path[at] - 1):
        return steps
    return steps[:-1] + [replace(last, each=True)]


def _heard_from_json(data: Mapping, params: tuple[str, ...], steps: Sequence[Step]) -> dict[str, Any]:
    """The inbound part of a stored route (none for a plain route)."""
    heard = tuple(str(p) for p in data.get("heard") or ())
    if not heard:
        return {}
    if len(steps) != 1 or not set(heard) <= set(params):
        raise RouteFormatError("an inbound route has one step whose heard arguments are parameters")
    shapes = {str(k): TokenShape.from_json(v) for k, v in (data.get("shapes") or {}).items()}
    if set(shapes) != set(heard):
        raise RouteFormatError("every heard parameter needs a token shape")
    rivals = tuple(TokenShape.from_json(v) for v in data.get("rivals") or ())
    out = {"heard": heard, "shapes": shapes, "rivals": rivals}
    if data.get("source"):
        tool, path = data["source"]
        if not isinstance(tool, str) or not tool or not isinstance(path, list):
            raise RouteFormatError("a joined inbound route's source is [tool, path]")
        out["source"] = (tool, tuple(p if isinstance(p, int) else str(p) for p in path))
    return out


def render_script(route: Route, *, min_prefix: int = 2) -> str | None:
    """The human-readable script of a route, or None when the route cannot be crystallized
    (no steps, or a step without a tool). Values are cut for display, so a script stays small."""
    if not route.steps or any(not s.tool for s in route.steps):
        return None
    lines = [f"# waggle {route.name}", f"# scope: {route.scope}"]
    meta = [f"{len(route.steps)} read-only steps"]
    if route.count:
        meta.append(f"seen {route.count}x when mined")
    lines.append("# " + ", ".join(meta))
    if route.params:
        shown_params = []
        for p in route.params:
            ex = route.examples.get(p)
            shown_params.append(f"{{{p}}} (e.g. {shown(ex)})" if ex is not None else f"{{{p}}}")
        lines.append("# parameters: " + ", ".join(shown_params))
    else:
        lines.append("# parameters: none")
    if route.heard:
        conf = (f" (lower bound {route.confidence:.0%} of replays used, over {route.contexts} distinct values)"
                if route.confidence else "")
        for p in route.heard:
            lines.append(f"# {{{p}}}: {route.shapes[p].describe()}")
        if route.source:
            where = route.source[0] + "".join("[]" if p == "*" else (f"[{p}]" if isinstance(p, int) else f".{p}")
                                              for p in route.source[1])
            lines.append("# replay: when an inbound message brings the only pending value of that shape that an "
                         f"earlier output also listed ({where}), the step runs before the model asks{conf}")
        else:
            lines.append("# replay: when an inbound message brings the only pending value of that shape, the step "
                         f"runs before the model asks{conf}")
        lines.append("")
        lines.append(f"1. {route.steps[0].describe()}")
        return "\n".join(lines) + "\n"
    m0 = max(2, int(min_prefix), route.trigger)
    trigger = next((m for m in range(m0, len(route.steps)) if route.determined_at(m)), None)
    if trigger is None:
        lines.append("# replay: on demand only (its later steps need values the first steps do not give)")
    else:
        conf = ""
        if route.confidence:
            conf = (f" (lower bound {route.confidence:.0%} of replayed steps used, "
                    f"over {route.contexts} distinct contexts)")
        lines.append(f"# replay: after the first {trigger} steps, the remaining {len(route.steps) - trigger} "
                     f"run automatically{conf}")
        if route.reach:  # each alignment replays only as far as its own evidence carries
            stretches = ", ".join(f"after {m} steps the next {r}" for m, r in sorted(route.reach.items()))
            lines.append(f"# calls replayed (a fan-out counts each element): {stretches}")
        lines += [f"# {line}" for line in route.told.describe()]
    lines.append("")
    for i, s in enumerate(route.steps, 1):
        lines.append(f"{i}. {s.describe()}")
    return "\n".join(lines) + "\n"


def steps_summary(route: Route) -> list[str]:
    return [s.describe() for s in route.steps]


class TraceIndex:
    """Positions of each pair of consecutive call shapes in a trace, so a route's sightings are
    found without scanning the trace (or every call of its first tool). ``sessions`` gives the
    session of each position (default: a new session after every ``None`` barrier); ``words`` the
    words of each episode's message (see waggle.told); ``wakes`` each position's wake (one per
    message received: a brief sent every day is one episode, as a context, but each day a wake of
    its own, whose calls are not made by an earlier day's; default: its episode)."""

    def __init__(self, calls: Sequence[Call | None], sessions: Sequence[int] | None = None,
                 episodes: Sequence | None = None, words: Mapping[Any, Sequence[str]] | None = None,
                 wakes: Sequence | None = None) -> None:
        self.calls = calls
        self.words = words or {}
        # each position's episode: the inbound message that started it (what a wake brought)
        self.episodes = episodes if episodes is not None and len(episodes) == len(calls) else [""] * len(calls)
        self.wakes = wakes if wakes is not None and len(wakes) == len(calls) else self.episodes
        if sessions is None:
            sessions, current = [], 0
            for c in calls:
                current += c is None
                sessions.append(current)
        self.sessions = sessions
        self.by_pair: dict[tuple, list[int]] = {}
        prev = None
        for i, c in enumerate(calls):
            shape = None if c is None or c.barrier else c.shape
            if prev is not None and shape is not None:
                self.by_pair.setdefault((prev, shape), []).append(i - 1)
            prev = shape
        self.work = 0  # sightings examined, for tests pinning the cost


def tail_of(route: Route, window: Sequence[Call], cap: int, made: Collection = (), limit: int | None = None,
            positions: list[int] | None = None) -> tuple[dict[str, str], list[ConcreteStep]] | None:
    """Match ``route`` against ``window`` (its first len(window) steps); return the binding and the
    concrete tail (steps already made inside the window, or in ``made``, are left out), or None.
    ``limit`` keeps only the first tail positions (route steps, then fan-out elements); the
    position of each returned step is appended to ``positions`` when given.

    A step whose output value is missing (the user lists 3 reservations, the route names a 5th)
    ends the tail there: the positions that can be formed stand on their own. So a long route is
    judged on every context where its trigger occurs, not only on those whose lists happened to be
    long enough (its own mined occurrences, a biased sample), and it replays what it can form."""
    binding: dict[str, str] = {}
    for j, (step, call) in enumerate(zip(route.steps, window)):
        got = step.match(call, binding, window[:j])
        if got is None:
            return None
        binding = got
    made = {c.invocation() for c in window} | set(made)
    tail: list[ConcreteStep] = []
    pos = 0
    for step in route.steps[len(window):]:
        conc = step.concretes(binding, window, cap)
        if not conc:
            if pos == 0:
                return None
            break
        for c in conc:
            if limit is not None and pos >= limit:
                return binding, tail
            if c not in made:
                tail.append(c)
                if positions is not None:
                    positions.append(pos)
            pos += 1
    return binding, tail


def used_steps(tail: Sequence[ConcreteStep], calls: Sequence[Call | None], start: int) -> int:
    """How many of ``tail`` the agent made itself from ``start`` on, before its first call that is
    none of them (a barrier or the end of the session ends the run)."""
    return sum(used_flags(tail, calls, start))


def used_flags(tail: Sequence[ConcreteStep], calls: Sequence[Call | None], start: int) -> list[bool]:
    """For each step of ``tail``: did the agent make it itself from ``start`` on, before its first
    call that is none of them (see :func:`used_steps`)."""
    remaining = Counter(tail)
    made: Counter = Counter()
    for c in calls[start:]:
        if c is None or c.barrier:
            break
        inv = c.invocation()
        if remaining.get(inv, 0) <= 0:
            break
        remaining[inv] -= 1
        made[inv] += 1
    flags = []
    for step in tail:
        flags.append(made.get(step, 0) > 0)
        if flags[-1]:
            made[step] -= 1
    return flags


HISTORY = 200  # earlier calls of the session a replay leaves out when already made (the ring's size)


def context_of(route: Route, window: Sequence[Call], session: int, episode: Any = "") -> tuple:
    """What makes two sightings of a prefix different evidence: what differs between them, never
    the session they came from. The values at its varying positions (parameters and refs); a prefix
    of literals only differs by what its calls returned (their outputs' content) and by the
    episode it served (the inbound message that started it: two tasks orienting in one workspace
    are two contexts). Near-copies of one task (the same message, the same ids, the same outputs)
    are one context however often, and in however many sessions, they recur; so are copies whose
    outputs were only padded (see :class:`Contexts`). (``session`` is kept for callers; it decides
    nothing.)"""
    values = tuple(window[j].arg_dict.get(k) for j, s in enumerate(route.steps[:len(window)])
                   for k in [k for k, _ in s.binds] + [k for k, _ in s.refs])
    return values if values else ("content", episode) + tuple(c.out_hash for c in window)


def _padded_alike(a: frozenset, b: frozenset) -> bool:
    """One output's values all stand in the other's: the same content, one of them padded (more
    entries, a longer list, another layout). An output with no values proves nothing alike."""
    return bool(a) and bool(b) and (a <= b or b <= a)


class Contexts:
    """The distinct contexts among a prefix's sightings (see :func:`context_of`).

    Equal keys are one context. A literal-only prefix is also the context of an earlier sighting
    of the same episode when each of its calls returned the same values give or take padding (one
    output's leaf values are a subset of the other's): a task copied with padded outputs (a
    longer listing around the same entries) does not vouch for its route again, while a fixed
    brief whose calls return other values (a daily run on new data) is a new context each time.
    A sighting is compared with at most ``MAX_COMPARED`` earlier ones (the newest) of its episode,
    so judging a route stays linear in its sightings; past that it counts as new."""

    MAX_COMPARED = 64

    def __init__(self) -> None:
        self.keys: set = set()
        self.content: dict[Any, list[tuple]] = {}  # episode -> earlier outputs (hash, values) per call

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, route: Route, window: Sequence[Call], episode: Any = "") -> bool:
        """Count the sighting ``window``; True when it is a new context."""
        key = context_of(route, window, 0, episode)
        if key in self.keys:
            return False
        if key[:1] == ("content",):
            outputs = tuple((c.out_hash, frozenset(v for _, v in c.refs)) for c in window)
            earlier = self.content.setdefault(episode, [])
            for other in earlier[-self.MAX_COMPARED:]:
                if all(x[0] == y[0] or _padded_alike(x[1], y[1]) for x, y in zip(outputs, other)):
                    return False
            earlier.append(outputs)
        self.keys.add(key)
        return True


def _made_before(index: TraceIndex, p: int) -> set:
    """The episode's calls (at most HISTORY) before position ``p``: what an earlier episode of a
    long-lived session made (another wake's orientation, the same brief's yesterday) does not
    count as made for this one."""
    out = set()
    wake = index.wakes[p]
    for i in range(p - 1, max(0, p - HISTORY) - 1, -1):
        c = index.calls[i]
        if c is None or index.wakes[i] != wake:
            break
        out.add(c.invocation())
    return out


def prefix_evidence(route: Route, index: TraceIndex, m: int, cap: int = DEFAULT_FANOUT_CAP) -> tuple[int, int, int]:
    """In the trace, over distinct contexts where the first ``m`` steps occur: (contexts, tail
    steps a replay would have offered, of those the agent made itself). Only the first sighting of
    each context (see :func:`context_of`) counts, so repeats cannot vouch for a route."""
    return prefix_evidence_by_cap(route, index, m, (cap,))[cap][:3]


def prefix_evidence_by_cap(route: Route, index: TraceIndex, m: int, caps: Sequence[int]
                           ) -> dict[int, tuple[int, int, int, float]]:
    """:func:`prefix_evidence` for several fan-out caps in one pass over the sightings:
    cap -> (contexts, steps offered, steps used, sum over contexts of the share used)."""
    tallies, _ = _sightings(route, index, m, max(caps), caps)
    return tallies


def _sightings(route: Route, index: TraceIndex, m: int, top: int, caps: Sequence[int], told: ToldTally | None = None
               ) -> tuple[dict[int, tuple[int, int, int, float]], list[tuple[int, int]]]:
    calls = index.calls
    n = len(calls)
    seen = Contexts()
    tallies = {c: [0, 0, 0.0] for c in caps}
    per: list[list[int]] = []
    if len(route.steps) < 2:
        return {c: (0, 0, 0, 0.0) for c in caps}, []
    key = (route.steps[0].shape, route.steps[1].shape)
    for p in index.by_pair.get(key, ()):
        if p + m > n:
            break
        index.work += 1
        window = calls[p:p + m]
        if any(c is None for c in window):
            continue
        got = tail_of(route, window, top, _made_before(index, p))  # type: ignore[arg-type]
        if got is None or not got[1]:
            continue
        if not seen.add(route, window, index.episodes[p]):  # type: ignore[arg-type]
            continue
        binding, tail = got
        if told is not None:  # the message the agent acted on when it went on: its last call's episode
            told.add(index.words.get(index.episodes[p + m - 1], ()),
                     [v for s in route.steps[m:] for _, v in s.literals], binding, route.params,
                     {v for c in window for _, v in c.refs})
        flags = dict(zip(tail, used_flags(tail, calls, p + m)))
        pos = 0  # positions by route step (and list element), not by place in this tail
        for step in route.steps[m:]:
            formed = step.concretes(binding, window, top)
            if not formed:
                break  # (the tail ended here: see tail_of)
            for conc in formed:
                while len(per) <= pos:
                    per.append([0, 0])
                if conc in flags:  # (a step the session had already made is not offered)
                    per[pos][0] += 1
                    per[pos][1] += flags[conc]
                pos += 1
        fixed = len(tail) - _fanned(route, m, tail)
        for c in caps:
            part = tail[:fixed + c] if route.fans_out else tail
            used = used_steps(part, calls, p + m)
            tallies[c][0] += len(part)
            tallies[c][1] += used
            tallies[c][2] += used / len(part)
    return ({c: (len(seen), off, used, share) for c, (off, used, share) in tallies.items()},
            [(a, b) for a, b in per])


def _fanned(route: Route, m: int, tail: Sequence[ConcreteStep]) -> int:
    """How many calls at the end of ``tail`` the fan-out step made."""
    if not route.fans_out:
        return 0
    return max(0, len(tail) - (len(route.steps) - m - 1))


def choose_trigger(route: Route, index: TraceIndex, min_prefix: int, min_confidence: float, *,
                   z: float = 1.0, min_contexts: int = 3, cap: int = DEFAULT_FANOUT_CAP) -> Route | None:
    """The route with the shortest trigger (>= min_prefix leading steps, tail fully determined)
    seen in at least ``min_contexts`` distinct contexts where the Wilson lower bound (``z``) of the
    share of replayed steps the agent made itself, over contexts, is at least ``min_confidence``;
    None when none does.

    Every replayed step must also be predictable on its own: a step offered in at least
    ``min_contexts`` contexts must reach ``min_confidence`` with its own lower bound of "the agent
    made it" (a strong first step cannot carry a coin-flip second one). A fan-out replays only the
    leading list elements that were offered in ``min_contexts`` contexts and pass that bound (its
    learned cap, at most ``cap``): agents stop somewhere in a list, the later elements are the
    likelier misses, and an element seen too rarely is not known to be predictable.

    Every longer alignment is judged the same way on its own sightings and kept in the route's
    ``reach`` (m -> tail positions replayed there): when the agent walks on past a replay, what
    follows is replayed only as far as the evidence at that point carries (a list walked element
    by element gets its predictable stretches replayed, not its coin flips)."""
    m0 = max(2, int(min_prefix))
    reach: dict[int, int] = {}
    evidence: dict[tuple[int, int], tuple[int, int]] = {}
    first: tuple[int, float, int, int] | None = None
    told = Told()
    for m in range(m0, len(route.steps)):
        tally = ToldTally()
        got = _judge_alignment(route, index, m, min_confidence, z, min_contexts, max(1, cap), tally)
        if got is None:
            continue
        lower, contexts, elements, per = got
        fixed = len(route.steps) - m - (1 if route.fans_out else 0)
        reach[m] = fixed + elements
        evidence.update({(m, pos): per[pos] for pos in range(min(reach[m], len(per)))})
        if first is None:
            first = (m, lower, contexts, elements if route.fans_out else 0)
            told = tally.told()
    if first is None:
        return None
    m, lower, contexts, c = first
    return route.with_trigger(m, lower, contexts, c, reach, evidence, told)


def _judge_alignment(route: Route, index: TraceIndex, m: int, min_confidence: float, z: float,
                     min_contexts: int, top: int, told: ToldTally | None = None
                     ) -> tuple[float, int, int, list[tuple[int, int]]] | None:
    """At alignment ``m``: (lower bound of the share used, contexts, fan-out elements replayed,
    per tail position (offered, used)), or None when nothing may be replayed there (see
    :func:`choose_trigger`)."""
    if not route.determined_at(m):
        return None
    caps = list(range(1, top + 1)) if route.fans_out else [top]
    evidence, per = _sightings(route, index, m, top, caps, told)
    contexts = evidence[top][0]
    if contexts < max(1, min_contexts):
        return None
    enough = [offered >= max(1, min_contexts) for offered, _ in per]
    sure = [ok and wilson_lower(used, offered, z) >= min_confidence for ok, (offered, used) in zip(enough, per)]
    fixed = len(route.steps) - m - (1 if route.fans_out else 0)
    if any(ok and not good for ok, good in zip(enough[:fixed], sure[:fixed])):
        return None  # a fixed step shown to be unpredictable (thinner evidence: the overall bound)
    if route.fans_out:
        elements = 0
        while fixed + elements < len(sure) and sure[fixed + elements]:
            elements += 1
        caps = list(range(1, elements + 1))
    for c in reversed(caps):
        # the unit of evidence is the context, not the step: one context's steps stand or fall
        # together (an agent that stops early misses every later step)
        lower = wilson_lower(evidence[c][3], contexts, z)
        if lower >= min_confidence:
            return lower, contexts, c if route.fans_out else 0, per
    return None
