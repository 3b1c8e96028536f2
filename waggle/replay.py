"""Replayer: follow a stored route once its first steps have been walked (pure Python, no ORM).

When the newest calls match the first ``m >= min_prefix`` (>= 2) steps of a route and every
parameter of the remaining steps is bound by a value seen in those ``m`` calls, the remaining steps
form a concrete *plan*. The host runs the plan's steps through its own ``exec`` (same safety checks
and truncation as a model-driven call) and the outputs are folded into the triggering tool result
as one marked block.

Conservatism beyond the prefix length: a route may carry its own, longer trigger (chosen when it
was mined: the shortest prefix that was followed by the rest of the route often enough). All routes that match the current calls are compared. If
two of them predict different continuations (neither is a prefix of the other) nothing fires, and
when they agree the longest prediction runs; a route that has just been walked to its end
counts as predicting "nothing more". Each alignment replays only its learned ``reach``. A plan (route + parameter values) fires at most once per
session: the caller passes the keys of plans already fired.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

from waggle.route import DEFAULT_FANOUT_CAP, ConcreteStep, Route, tail_of
from waggle.trace import Call, args_json, describe_call, estimate_tokens

ExecFn = Callable[[str, dict[str, Any]], str]


def clamp_prefix(min_prefix: int | None) -> int:
    try:
        return max(2, int(min_prefix or 2))
    except (TypeError, ValueError):
        return 2


def plan_key(route_name: str, tail: Sequence[ConcreteStep]) -> str:
    """Identity of a concrete plan: the route and the calls it would make."""
    blob = json.dumps([route_name, [[t, list(map(list, a))] for t, a in tail]], separators=(",", ":"),
                      ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:40]


@dataclass(frozen=True)
class Plan:
    route: Route
    matched: int  # how many leading steps the recent calls matched
    binding: Mapping[str, str]
    tail: tuple[ConcreteStep, ...]
    key: str = ""
    positions: tuple[int, ...] = ()  # each tail step's position in the route's tail at ``matched``

    @property
    def steps(self) -> int:
        return len(self.tail)


def _alignments(route: Route, recent: Sequence[Call], min_prefix: int, cap: int = DEFAULT_FANOUT_CAP,
                made: Collection = ()) -> Plan | None:
    """The longest alignment of ``route`` with the end of ``recent`` (m >= min_prefix and >= the
    route's own trigger length, m <= len); a full match (or a tail the window already made)
    yields a plan with an empty tail. None when the route does not match or its tail is not fully
    determined."""
    top = min(len(route.steps), len(recent))
    lower = max(min_prefix, route.trigger)
    for m in range(top, lower - 1, -1):
        if m < len(route.steps) and not route.determined_at(m):
            continue
        limit = route.reach_at(m) if m < len(route.steps) else None
        if limit == 0:
            continue  # the evidence at this alignment did not vouch for any step
        positions: list[int] = []
        got = tail_of(route, recent[-m:], route.fanout_cap(cap) if limit is None else max(1, cap), made, limit,
                      positions)
        if got is None:
            continue
        binding, tail = got
        return Plan(route=route, matched=m, binding=binding, tail=tuple(tail), key=plan_key(route.name, tail),
                    positions=tuple(positions))
    return None


ReachesOut = Callable[[str], bool]
"""reaches_out(tool) -> True when the tool reaches outside the space (the network, an MCP server not
declared closed-world). A value taken from a tool's output never becomes its argument without the model."""


def guarded(route: Route, reaches_out: ReachesOut | None) -> Route:
    """The route as far as it may replay: up to (not including) its first step that would pass a
    value from an earlier output to a tool that reaches outside the space. ``reaches_out`` None:
    the host said no tool does."""
    if reaches_out is None:
        return route
    for i, step in enumerate(route.steps):
        if step.refs and reaches_out(step.tool):
            return replace(route, steps=route.steps[:i])
    return route


def _is_prefix(a: Sequence[ConcreteStep], b: Sequence[ConcreteStep]) -> bool:
    return len(a) <= len(b) and tuple(b[: len(a)]) == tuple(a)


def find_plan(recent: Sequence[Call], routes: Iterable[Route], min_prefix: int = 2,
              fired: Collection[str] = (), cap: int = DEFAULT_FANOUT_CAP,
              reaches_out: ReachesOut | None = None) -> Plan | None:
    """The plan to run now, or None. ``recent`` is the session's calls, oldest first; the last one
    is the call that just completed. ``cap`` bounds the calls one fan-out step makes. A route
    replays only up to its first step that would pass an output's value to a tool that reaches
    outside the space (see :func:`guarded`)."""
    m0 = clamp_prefix(min_prefix)
    if len(recent) < m0 or recent[-1].barrier:
        return None
    last_tool = recent[-1].tool
    made = {c.invocation() for c in recent}  # a step the session already made is never replayed
    matches: list[Plan] = []
    for route in routes:
        route = guarded(route, reaches_out)
        if len(route.steps) < m0 or not any(s.tool == last_tool for s in route.steps[m0 - 1:]):
            continue
        plan = _alignments(route, recent, m0, cap, made)
        if plan is not None:
            matches.append(plan)
    if not matches:
        return None
    matches.sort(key=lambda p: (-len(p.tail), p.route.name))
    longest = matches[0]
    for other in matches[1:]:
        if not _is_prefix(other.tail, longest.tail):
            return None  # the routes disagree on what comes next
    if not longest.tail or longest.key in fired:
        return None
    return longest


@dataclass
class Outcome:
    """What running a plan gave: a block to fold into the tool result, or a failure."""

    ok: bool
    block: str | None = None
    yield_tokens: int = 0
    error: str = ""
    outputs: list[str] = field(default_factory=list)


def estimate_yield(tail: Sequence[ConcreteStep], outputs: Sequence[str]) -> int:
    """Estimated tokens saved by not making these round trips through the model: the calls it
    would have written plus the results it would have read, at chars / 4. An estimate only."""
    total = 0
    for (tool, args), out in zip(tail, outputs):
        total += estimate_tokens(describe_call(tool, dict(args))) + estimate_tokens(out)
    return total


BLOCK_END = "[waggle: end]"


REPLAYED = "replayed"  # the verb of a replay no one asked for (follow, inbound)


def format_block(name: str, tail: Sequence[ConcreteStep], outputs: Sequence[str], *, verb: str = REPLAYED) -> str:
    """The block the model reads: a header, each step's call and output, an end mark. It rides in
    every later request of the run, so it carries nothing the model does not need: no yield
    estimate (the ledger's) and, on a replay, no route name (the ledger and the fired plan keep
    it; the step lines say what was called); a waggle the model ran by name is named."""
    n = len(tail)
    count = f"{n} step{'s' if n != 1 else ''}"
    parts = [f"[waggle: {REPLAYED} {count}]" if verb == REPLAYED else f"[waggle: {verb} {name} \u2014 {count}]"]
    for i, ((tool, args), out) in enumerate(zip(tail, outputs), 1):
        parts.append(f"--- step {i}/{n}: {describe_call(tool, dict(args))}")
        parts.append(out.rstrip("\n"))
    parts.append(BLOCK_END)
    return "\n".join(parts)


def run_steps(name: str, tail: Sequence[ConcreteStep], exec: ExecFn, *, verb: str = REPLAYED) -> Outcome:
    """Run the steps in order through ``exec``. Any exception or empty output is a failure and
    yields no block. Never raises."""
    outputs: list[str] = []
    for i, (tool, args) in enumerate(tail, 1):
        try:
            out = exec(tool, args_json(args))
        except Exception as exc:  # noqa: BLE001 - a tool error is a divergence, not a crash
            return Outcome(ok=False, error=f"step {i} ({tool}) failed: {type(exc).__name__}: {exc}", outputs=outputs)
        if not isinstance(out, str) or not out.strip():
            return Outcome(ok=False, error=f"step {i} ({tool}) returned no output", outputs=outputs)
        outputs.append(out)
    y = estimate_yield(tail, outputs)
    return Outcome(ok=True, block=format_block(name, tail, outputs, verb=verb), yield_tokens=y, outputs=outputs)


def run_route(route: Route, params: Mapping[str, str], exec: ExecFn, *, cap: int = DEFAULT_FANOUT_CAP,
              verb: str = "ran waggle", reaches_out: ReachesOut | None = None) -> tuple[list[ConcreteStep], Outcome]:
    """Run a whole route on demand, step by step: output refs (and fan-outs) resolve against the
    outputs of the steps already run. ``params`` are JSON texts. A step that would pass an output's
    value to a tool reaching outside the space is refused (the model makes that call itself, having
    read the value). Never raises."""
    done: list[Call] = []
    tail: list[ConcreteStep] = []
    outputs: list[str] = []
    for i, step in enumerate(route.steps, 1):
        if step.refs and reaches_out is not None and reaches_out(step.tool):
            return tail, Outcome(ok=False, error=f"step {i} ({step.tool}) would take a value from an earlier step's "
                                 "output to a tool that reaches outside the space; read the output and make that "
                                 "call yourself", outputs=outputs)
        conc = step.concretes(params, done, cap)
        if conc is None:
            return tail, Outcome(ok=False, error=f"step {i} ({step.tool}) needs a value no earlier step gave",
                                 outputs=outputs)
        first_output = None
        for tool, args in conc:
            got = run_steps(route.name, [(tool, args)], exec, verb=verb)
            if not got.ok:
                return tail, Outcome(ok=False, error=f"step {i}: {got.error}", outputs=outputs)
            tail.append((tool, args))
            outputs.append(got.outputs[0])
            first_output = got.outputs[0] if first_output is None else first_output
        # a later ref to a fan-out step reads its first element's output
        done.append(Call.make(step.tool, args_json(conc[0][1]) if conc else {}, output=first_output or ""))
    y = estimate_yield(tail, outputs)
    return tail, Outcome(ok=True, block=format_block(route.name, tail, outputs, verb=verb), yield_tokens=y,
                         outputs=outputs)


class Replayer:
    """Convenience wrapper holding routes and the fired-plan set of one session (in memory; the
    service keeps the fired set in the database instead)."""

    def __init__(self, routes: Iterable[Route], min_prefix: int = 2, cap: int = DEFAULT_FANOUT_CAP) -> None:
        self.routes = list(routes)
        self.min_prefix = clamp_prefix(min_prefix)
        self.cap = cap
        self.fired: set[str] = set()

    def plan(self, recent: Sequence[Call]) -> Plan | None:
        return find_plan(recent, self.routes, self.min_prefix, self.fired, self.cap)

    def follow(self, recent: Sequence[Call], exec: ExecFn) -> Outcome | None:
        plan = self.plan(recent)
        if plan is None:
            return None
        self.fired.add(plan.key)
        return run_steps(plan.route.name, plan.tail, exec)
