"""How much any replay of list walks could save on a trace file, knowing the answers in advance.

    .venv/bin/python bench/replay_ceiling.py [--traces PATH] [--precision 85]

A *walk*: a read-only call whose JSON output holds a list, then (next in call order) calls of one
tool whose one argument takes that list's elements in order (``get_user_details`` then
``get_reservation_details`` for ``reservations[0]``, ``[1]``, ...). A replay may fire once the
first call and at least one element were made by the model (two matched steps: waggle's
``min_prefix``), and again after every element the model makes itself past a replay.

The oracle picks, for each kind of walk (first tool, list, walking tool) and each number k of
elements walked so far, how many further elements to replay (0, 1, 2, 3 or the rest), choosing
the policies that save the most round trips with at least ``--precision`` % of all replayed steps
used, *on the very traces it is scored on* (in-sample: no held-out estimate can do better with
routes of this family; kinds seen fewer than 3 times are left out). It also counts the read-only calls
whose every argument value appeared in an earlier argument or output of the session: the most any
route of any family could replay. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter
from pathlib import Path

from replay_eval import DEFAULT_TRACES, calls_of, load, tool_kinds

CHOICES = (0, 1, 2, 3, 99)  # elements replayed at one decision (99: the rest of the list)
DECISIONS = 7               # decisions k = 1..7 (k >= 7 shares the last one)


def lists_in(node, path=()):
    """(path, [scalar elements]) for every list of scalars in a JSON value (and for each scalar
    field of a list of records)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from lists_in(v, path + (k,))
    elif isinstance(node, list):
        if node and all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in node):
            yield path, node
        if node and all(isinstance(x, dict) for x in node):  # a list of records: one list per field
            for key in set.intersection(*(set(x) for x in node)):
                column = [x[key] for x in node]
                if all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in column):
                    yield path + ("*", key), column
        for i, v in enumerate(node):
            yield from lists_in(v, path + (i,))


def leaves(node, out: set) -> None:
    if isinstance(node, dict):
        for v in node.values():
            leaves(v, out)
    elif isinstance(node, list):
        for v in node:
            leaves(v, out)
    else:
        out.add(json.dumps(node))


def parse(text: str):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def walks(calls: list[tuple[dict, str]], mutating: set[str]) -> list[tuple[tuple, int, int]]:
    """(kind, list length, elements walked in order) for each walk that starts with >= 1 element;
    the kind is (first tool, list path with indexes as *, walking tool): what a route tells apart."""
    found = []
    for i, (call, out) in enumerate(calls):
        if call["name"] in mutating:
            continue
        data = parse(out)
        best = None
        for path, items in lists_in(data):
            j, p, tool = i + 1, 0, None
            while j < len(calls) and p < len(items):
                nxt = calls[j][0]
                args = nxt["args"] if isinstance(nxt["args"], dict) else {}
                if (nxt["name"] not in mutating and (tool is None or nxt["name"] == tool)
                        and items[p] in args.values()):  # (only a read-only call can be replayed)
                    tool = nxt["name"]
                    p += 1
                    j += 1
                else:
                    break
            if p and (best is None or p > best[2]):
                kind = (call["name"], tuple("*" if isinstance(x, int) else x for x in path), tool)
                best = (kind, len(items), p)
        if best:
            found.append(best)
    return found


def simulate(policy: tuple[int, ...], length: int, walked: int) -> tuple[int, int]:
    """(used, missed) replayed steps of one walk under ``policy``."""
    used = missed = 0
    k = 1  # the first element was made by the model
    while k < length:
        r = policy[min(k, DECISIONS) - 1]
        if r == 0:
            if walked > k:
                k += 1
                continue
            break
        end = min(k + r, length)
        u = max(0, min(end, walked) - k)
        used += u
        missed += end - k - u
        if walked > end:
            k = end + 1  # the model made the next element itself: decide again
        else:
            break
    return used, missed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", default=str(DEFAULT_TRACES))
    ap.add_argument("--precision", type=float, default=85.0)
    ap.add_argument("--mutating", action="append", default=[])
    args = ap.parse_args()
    path = Path(args.traces)
    traces = load(path)
    mutating = tool_kinds(path, args.mutating)
    read_only = determined = 0
    found: Counter = Counter()
    for t in traces:
        calls = list(calls_of(t))
        seen: set = set()
        for call, out in calls:
            argv = call["args"] if isinstance(call["args"], dict) else {}
            if call["name"] not in mutating:
                read_only += 1
                vals = [json.dumps(v) for v in argv.values()]
                determined += bool(vals) and all(v in seen for v in vals)
            seen |= {json.dumps(v) for v in argv.values()}
            leaves(parse(out), seen)
        found.update(walks(calls, mutating))
    kinds: dict[tuple, Counter] = {}
    for (kind, length, walked), n in found.items():
        kinds.setdefault(kind, Counter())[(length, walked)] += n
    # per kind of walk (a route tells kinds apart), every policy's (used, missed); then the best
    # mix over kinds with the precision target met overall (a knapsack over missed steps)
    best_by_missed: dict[int, int] = {0: 0}
    for kind, walks_of in kinds.items():
        if sum(walks_of.values()) < 3:
            continue  # seen fewer than 3 times: no route with 3 distinct contexts can learn it
        frontier: dict[int, int] = {}
        for policy in itertools.product(CHOICES, repeat=DECISIONS):
            used = missed = 0
            for (length, walked), n in walks_of.items():
                u, m = simulate(policy, length, walked)
                used += n * u
                missed += n * m
            frontier[missed] = max(frontier.get(missed, 0), used)
        merged: dict[int, int] = {}
        for m0, u0 in best_by_missed.items():
            for m1, u1 in frontier.items():
                merged[m0 + m1] = max(merged.get(m0 + m1, 0), u0 + u1)
        best_by_missed = merged
    feasible = [(u, m) for m, u in best_by_missed.items() if u and 100 * u >= args.precision * (u + m)]
    used, missed = max(feasible, default=(0, 0))
    everything = [simulate((99,) * DECISIONS, length, walked) for (_, length, walked), n in found.items()
                  for _ in range(n)]
    all_used, all_missed = sum(u for u, _ in everything), sum(m for _, m in everything)
    print(json.dumps({
        "read_only_calls": read_only,
        "args_all_seen_before": determined,
        "walks": sum(found.values()),
        "walk_kinds": len(kinds),
        "walk_steps_after_the_first": sum(n * (w - 1) for (_, _, w), n in found.items()),
        "replay_rest_saved_pct": round(100 * all_used / max(1, read_only), 2),
        "replay_rest_precision_pct": round(100 * all_used / max(1, all_used + all_missed), 2),
        "ceiling_saved_pct": round(100 * used / max(1, read_only), 2),
        "ceiling_precision_pct": round(100 * used / max(1, used + missed), 2) if used else 100.0,
    }))


if __name__ == "__main__":
    main()
