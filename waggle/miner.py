"""Route miner: repeated contiguous read-only routes in a call trace (pure Python, no ORM).

Definitions used throughout waggle:

* A call's *shape* is ``(tool, sorted argument keys)``; a window's shape is the sequence of its
  calls' shapes. Two windows are occurrences of the same route when their shapes are equal.
* A window that holds a mutating call (or crosses a barrier: ``None`` in the trace, used between
  sessions) is never considered.
* The *count* of a route is its largest number of **non-overlapping** occurrences. For windows of
  one length the leftmost-first greedy choice is optimal, and those chosen occurrences are the
  ones the parameters are derived from.
* An argument position whose value is the same in every chosen occurrence stays a literal; one
  whose value varies becomes a parameter. Varying positions whose values are equal to each other
  in every occurrence are the *same* parameter (that is how a later step is bound to an earlier
  one, e.g. ``grep(path=P)`` then ``read_file(path=P)``).
* Only *closed* routes are reported: a route is dropped when a longer mined route containing it
  has the same count (it would only be a piece of that route).

Complexity: every window of every allowed length is keyed once (a tuple of at most ``max_len``
small ints), and a window of length L+1 is only looked at when its length-L prefix was frequent
(a longer route can never recur more often than its prefix). That is
O(n x (max_len - min_len + 1)) dictionary operations at worst; there is no scan over pairs of
windows. Closedness only compares a frequent route with its one-step-longer frequent extensions,
which is equivalent to comparing it with every longer route (counts only shrink as a route grows).
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Sequence

from waggle.trace import Call, Shape

Position = tuple[int, str]  # (step index inside the route, argument key)


@dataclass(frozen=True)
class MineConfig:
    """Bounds of the search. ``min_len``/``max_len`` cap route length (min_len is at least 2: one
    call is not a route), ``k`` is the minimum number of non-overlapping occurrences (at least 2)."""

    min_len: int = 2
    max_len: int = 8
    k: int = 3

    def normalized(self) -> "MineConfig":
        min_len = max(2, int(self.min_len))
        max_len = max(min_len, int(self.max_len))
        return MineConfig(min_len=min_len, max_len=max_len, k=max(2, int(self.k)))


@dataclass(frozen=True)
class Param:
    """A varying argument position (or several positions that always carry the same value)."""

    name: str
    positions: tuple[Position, ...]
    values: tuple[str, ...] = ()  # the value in each chosen occurrence (examples)

    @property
    def first_step(self) -> int:
        return min(step for step, _ in self.positions)


@dataclass(frozen=True)
class Candidate:
    """A detected reusable route: representative steps (the first chosen occurrence), count of
    non-overlapping occurrences and their start indexes in the trace. ``params`` is derived from
    the chosen occurrences on first use (most candidates of a sweep are never looked at)."""

    steps: tuple[Call, ...]
    count: int
    starts: tuple[int, ...]
    trace: Sequence[Call | None] = field(default=(), repr=False, compare=False)

    @cached_property
    def params(self) -> tuple[Param, ...]:
        return derive_params(self.trace, self.starts, len(self.steps))

    @property
    def length(self) -> int:
        return len(self.steps)

    @property
    def score(self) -> int:
        return self.length * self.count

    @property
    def shape(self) -> tuple[Shape, ...]:
        return tuple(c.shape for c in self.steps)

    def param_at(self, step: int, key: str) -> Param | None:
        for p in self.params:
            if (step, key) in p.positions:
                return p
        return None


def segments_to_trace(segments: Iterable[Sequence[Call]]) -> list[Call | None]:
    """Join several traces (e.g. one per session) with barriers so no route spans two of them."""
    trace: list[Call | None] = []
    for seg in segments:
        if trace:
            trace.append(None)
        trace.extend(seg)
    return trace


def greedy_non_overlapping(positions: Sequence[int], length: int) -> list[int]:
    """Leftmost-first choice of non-overlapping windows (optimal for equal-length windows).
    ``positions`` must be ascending."""
    chosen: list[int] = []
    free_from = -1
    for p in positions:
        if p >= free_from:
            chosen.append(p)
            free_from = p + length
    return chosen


def derive_params(calls: Sequence[Call | None], starts: Sequence[int], length: int) -> tuple[Param, ...]:
    """Turn varying argument positions across the occurrences at ``starts`` into parameters."""
    first = starts[0]
    rep = calls[first:first + length]
    positions = [(j, key) for j, c in enumerate(rep) for key, _ in c.args]  # type: ignore[union-attr]
    if not positions:
        return ()
    rows = [tuple(v for c in calls[s:s + length] for _, v in c.args) for s in starts]  # type: ignore[union-attr]
    groups: dict[tuple[str, ...], list[Position]] = {}
    n = len(rows)
    for pos, col in zip(positions, zip(*rows)):
        if col.count(col[0]) == n:
            continue  # the same value every time: a literal
        groups.setdefault(col, []).append(pos)
    params: list[Param] = []
    used: dict[str, int] = {}
    for values, positions in sorted(groups.items(), key=lambda kv: kv[1][0]):
        base = positions[0][1] or "arg"
        used[base] = used.get(base, 0) + 1
        name = base if used[base] == 1 else f"{base}{used[base]}"
        params.append(Param(name=name, positions=tuple(positions), values=values))
    # a key name may collide with a suffixed one ("path2" as a real key): make names unique
    seen: set[str] = set()
    out = []
    for p in params:
        name = p.name
        suffix = 1
        while name in seen:
            suffix += 1
            name = f"{p.name}_{suffix}"
        seen.add(name)
        out.append(p if name == p.name else Param(name=name, positions=p.positions, values=p.values))
    return tuple(out)


def mine(calls: Sequence[Call | None], cfg: MineConfig | None = None, *, limit: int | None = None,
         stats: dict | None = None) -> list[Candidate]:
    """Closed repeated read-only routes in ``calls``, best first (length x count, then longer,
    then earlier). ``None`` entries are barriers (like a mutating call). ``limit`` keeps only the
    best routes; ``stats``, when given, receives the number of windows keyed (``windows``), of
    frequent routes (``frequent``) and of closed ones (``closed``)."""
    # Mining allocates many small lists and no reference cycles; the cyclic GC would only re-scan
    # them over and over (a superlinear cost on long traces), so it is paused while mining.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _mine(calls, cfg, limit, stats)
    finally:
        if gc_was_enabled:
            gc.enable()


def _mine(calls: Sequence[Call | None], cfg: MineConfig | None, limit: int | None,
          stats: dict | None) -> list[Candidate]:
    cfg = (cfg or MineConfig()).normalized()
    n = len(calls)
    if n < cfg.min_len:
        return []

    intern: dict[Shape, int] = {}
    id_list: list[int] = []
    for c in calls:
        if c is None or c.barrier:
            id_list.append(-1)
        else:
            id_list.append(intern.setdefault(c.shape, len(intern)))
    ids = tuple(id_list)

    # free[i]: how many barrier-free calls start at i (a window [i, i+L) is allowed iff free[i] >= L)
    free = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        free[i] = free[i + 1] + 1 if ids[i] >= 0 else 0

    k = cfg.k
    windows = 0
    levels: dict[int, dict[tuple[int, ...], list[int]]] = {}
    alive = [i for i in range(n) if free[i] >= cfg.min_len]
    for length in range(cfg.min_len, cfg.max_len + 1):
        groups: dict[tuple[int, ...], list[int]] = {}
        setdefault = groups.setdefault
        for i in alive:
            setdefault(ids[i:i + length], []).append(i)
        windows += len(alive)
        frequent: dict[tuple[int, ...], list[int]] = {}
        next_alive: list[int] = []
        for key, pos in groups.items():
            if len(pos) < k:
                continue
            chosen = greedy_non_overlapping(pos, length)
            if len(chosen) >= k:
                frequent[key] = chosen
                next_alive.extend([p for p in pos if free[p] > length])
        if not frequent:
            break
        levels[length] = frequent
        next_alive.sort()
        alive = next_alive

    # closedness: drop a route whose one-step-longer extension has the same count
    not_closed: set[tuple[int, ...]] = set()
    for length, frequent in levels.items():
        shorter = levels.get(length - 1)
        if not shorter:
            continue
        for key, chosen in frequent.items():
            c = len(chosen)
            for sub in (key[:-1], key[1:]):
                sub_chosen = shorter.get(sub)
                if sub_chosen is not None and len(sub_chosen) == c:
                    not_closed.add(sub)

    ranked = [(-length * len(chosen), -length, chosen[0], length, chosen)
              for length, frequent in levels.items()
              for key, chosen in frequent.items() if key not in not_closed]
    ranked.sort(key=lambda t: t[:3])
    if stats is not None:
        stats["windows"] = windows
        stats["frequent"] = sum(len(f) for f in levels.values())
        stats["closed"] = len(ranked)
    if limit is not None:
        ranked = ranked[: max(0, limit)]
    out: list[Candidate] = []
    for _, _, first, length, chosen in ranked:
        steps = tuple(calls[first:first + length])  # type: ignore[arg-type]
        out.append(Candidate(steps=steps, count=len(chosen), starts=tuple(chosen), trace=calls))
    return out


def mine_segments(segments: Iterable[Sequence[Call]], cfg: MineConfig | None = None, *,
                  limit: int | None = None) -> list[Candidate]:
    """:func:`mine` over several independent traces (start indexes refer to the joined trace)."""
    return mine(segments_to_trace(segments), cfg, limit=limit)
