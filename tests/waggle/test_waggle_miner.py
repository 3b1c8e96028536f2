"""The miner (pure): rules, closedness, parameters, scaling bound, and a property test against a
brute-force reference."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from waggle.miner import MineConfig, mine, mine_segments, segments_to_trace
from waggle.trace import Call


def C(tool, mutates=False, **args):
    return Call.make(tool, args, mutates=mutates, output=f"{tool}{args}")


def shapes(cands):
    return {tuple(c.tool for c in cand.steps): cand.count for cand in cands}


def test_finds_repeated_contiguous_route():
    trace = []
    for i in range(3):
        trace += [C("a", p="x"), C("b", q="y"), C("c"), C(f"noise{i}")]
    cands = mine(trace, MineConfig(min_len=2, max_len=5, k=3))
    assert cands, "a route repeated 3 times must be found"
    top = cands[0]
    assert [c.tool for c in top.steps] == ["a", "b", "c"]
    assert top.count == 3 and top.score == 9
    assert top.params == ()  # all values equal across occurrences: all literal


def test_below_k_is_not_reported():
    trace = [C("a"), C("b"), C("x1"), C("a"), C("b"), C("x2")]
    assert mine(trace, MineConfig(min_len=2, max_len=4, k=3)) == []
    assert shapes(mine(trace, MineConfig(min_len=2, max_len=4, k=2))) == {("a", "b"): 2}


def test_a_mutator_inside_a_window_blocks_it():
    trace = []
    for i in range(4):
        trace += [C("a"), C("write", mutates=True), C("b"), C(f"n{i}")]
    found = shapes(mine(trace, MineConfig(min_len=2, max_len=4, k=3)))
    assert ("a", "write", "b") not in found
    assert not any("write" in s for s in found)
    assert ("a", "b") not in found  # never adjacent without the mutator in between
    # the same trace without the mutator does have the route
    clean = [c for c in trace if not c.mutates]
    assert ("a", "b") in shapes(mine(clean, MineConfig(min_len=2, max_len=4, k=3)))


def test_barrier_between_segments():
    # "a" ends one session, "b" starts the next: never a route across sessions
    segs = [[C("x1"), C("a")], [C("b"), C("y1")]] * 4
    found = shapes(mine_segments(segs, MineConfig(min_len=2, max_len=3, k=2)))
    assert ("a", "b") not in found
    assert None in segments_to_trace(segs)


def test_overlapping_occurrences_are_counted_once():
    # "a a a a a": the route (a, a) occurs at 4 positions but only 2 times without overlap
    trace = [C("a")] * 5
    cands = mine(trace, MineConfig(min_len=2, max_len=2, k=2))
    assert shapes(cands) == {("a", "a"): 2}
    assert cands[0].starts == (0, 2)
    # and "a b a b a": (a, b, a) overlaps itself: one occurrence only -> below k=2
    trace = [C("a"), C("b"), C("a"), C("b"), C("a")]
    assert ("a", "b", "a") not in shapes(mine(trace, MineConfig(min_len=3, max_len=3, k=2)))


def test_varying_values_become_params_and_equal_ones_share_a_param():
    trace = []
    for i, mod in enumerate(["m1", "m2", "m3"]):
        trace += [C("grep", path=mod, pattern="TODO"), C("read", path=mod, mode="r"), C("log", rev=str(i)),
                  C(f"noise{i}")]
    cand = mine(trace, MineConfig(min_len=3, max_len=3, k=3))[0]
    by_name = {p.name: p for p in cand.params}
    assert set(by_name) == {"path", "rev"}
    assert by_name["path"].positions == ((0, "path"), (1, "path"))  # bound together
    assert by_name["path"].values == ('"m1"', '"m2"', '"m3"')  # canonical JSON text
    assert by_name["rev"].positions == ((2, "rev"),)
    assert cand.param_at(0, "pattern") is None  # "TODO" every time: literal
    assert cand.param_at(1, "mode") is None


def test_closed_routes_only():
    route = [C("a"), C("b"), C("c"), C("d"), C("e"), C("f")]
    trace = []
    for i in range(5):
        trace += route + [C(f"noise{i}")]
    cands = mine(trace, MineConfig(min_len=2, max_len=8, k=3))
    assert shapes(cands) == {("a", "b", "c", "d", "e", "f"): 5}  # not dozens of its pieces
    # a piece that recurs more often than the whole is a different route and is kept
    trace += [C("b"), C("c"), C("z1"), C("b"), C("c"), C("z2")]
    found = shapes(mine(trace, MineConfig(min_len=2, max_len=8, k=3)))
    assert found[("a", "b", "c", "d", "e", "f")] == 5
    assert found[("b", "c")] == 7
    assert ("c", "d") not in found


def test_ranked_by_length_times_count():
    trace = []
    for i in range(6):
        trace += [C("p"), C("q"), C(f"n{i}")]
    for i in range(3):
        trace += [C("a"), C("b"), C("c"), C("d"), C("e"), C(f"m{i}")]
    cands = mine(trace, MineConfig(min_len=2, max_len=6, k=3))
    assert [c.score for c in cands] == sorted((c.score for c in cands), reverse=True)
    assert [c.tool for c in cands[0].steps] == ["a", "b", "c", "d", "e"]  # 5x3 beats 2x6


def test_work_is_linear_in_windows():
    # every window of every allowed length is keyed at most once: O(n x lengths), no pair scan
    import random

    rng = random.Random(3)
    trace = [C(f"t{rng.randrange(6)}", v=str(rng.randrange(3))) for _ in range(5000)]
    cfg = MineConfig(min_len=2, max_len=6, k=3)
    stats: dict = {}
    mine(trace, cfg, stats=stats)
    assert 0 < stats["windows"] <= len(trace) * (cfg.max_len - cfg.min_len + 1)


def test_config_is_clamped():
    cfg = MineConfig(min_len=0, max_len=-3, k=0).normalized()
    assert (cfg.min_len, cfg.max_len, cfg.k) == (2, 2, 2)


# ----------------------------------------------------------------------------------------------
# property test against a brute-force reference
# ----------------------------------------------------------------------------------------------
def brute_force(trace, cfg):
    """Straightforward reference: every window, max non-overlapping count by dynamic programming,
    closedness by comparing every pair of routes."""
    cfg = cfg.normalized()
    occ: dict[tuple, list[int]] = {}
    for length in range(cfg.min_len, cfg.max_len + 1):
        for i in range(len(trace) - length + 1):
            win = trace[i:i + length]
            if any(c is None or c.mutates for c in win):
                continue
            occ.setdefault(tuple(c.shape for c in win), []).append(i)

    def max_disjoint(starts, length):
        best = [0] * (len(starts) + 1)
        for j in range(len(starts) - 1, -1, -1):
            nxt = next((t for t in range(j + 1, len(starts)) if starts[t] >= starts[j] + length), len(starts))
            best[j] = max(best[j + 1], 1 + best[nxt])
        return best[0]

    counts = {s: max_disjoint(st, len(s)) for s, st in occ.items()}
    counts = {s: c for s, c in counts.items() if c >= cfg.k}

    def contains(big, small):
        return any(big[i:i + len(small)] == small for i in range(len(big) - len(small) + 1))

    return {s: c for s, c in counts.items()
            if not any(len(t) > len(s) and ct == c and contains(t, s) for t, ct in counts.items())}


call_st = st.builds(
    lambda tool, keys, vals, mut: Call.make(tool, {k: v for k, v in zip(keys, vals)}, mutates=mut),
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from([(), ("p",), ("p",), ("p", "q")]),
    st.lists(st.sampled_from(["x", "y"]), min_size=2, max_size=2),
    st.sampled_from([False] * 15 + [True]),  # a few calls mutate
)
item_st = st.one_of(*([call_st] * 15), st.none())  # and a few session barriers


@st.composite
def trace_st(draw):
    """Random calls with a few copies of a random motif planted in them, so routes do repeat,
    overlap, nest and get broken by mutators and barriers."""
    motif = draw(st.lists(call_st, min_size=2, max_size=6))
    trace = draw(st.lists(item_st, max_size=40))
    for _ in range(draw(st.integers(0, 5))):
        at = draw(st.integers(0, len(trace)))
        trace[at:at] = motif
    return trace


cfg_st = st.builds(lambda lo, extra, k: MineConfig(min_len=lo, max_len=lo + extra, k=k),
                   st.integers(2, 3), st.integers(0, 4), st.integers(2, 3))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=trace_st(), cfg=cfg_st)
def test_miner_matches_brute_force(trace, cfg):
    cands = mine(trace, cfg)
    got = {cand.shape: cand.count for cand in cands}
    event("routes found" if cands else "no route")
    assert got == brute_force(trace, cfg)
    assert len(got) == len(cands)  # one candidate per route
    assert [c.score for c in cands] == sorted((c.score for c in cands), reverse=True)
    for cand in cands:
        n = cand.length
        # the chosen occurrences are real, non-overlapping and as many as the count
        assert len(cand.starts) == cand.count
        assert all(b >= a + n for a, b in zip(cand.starts, cand.starts[1:]))
        for s in cand.starts:
            window = trace[s:s + n]
            assert all(c is not None and not c.mutates for c in window)
            assert tuple(c.shape for c in window) == cand.shape
        # parameters: exactly the positions whose value varies; grouped when always equal
        varying = {}
        for j in range(n):
            for key, _ in cand.steps[j].args:
                values = tuple(trace[s + j].arg_dict[key] for s in cand.starts)
                if len(set(values)) > 1:
                    varying[(j, key)] = values
        in_params = {pos: p.name for p in cand.params for pos in p.positions}
        assert set(in_params) == set(varying)
        for a in varying:
            for b in varying:
                assert (in_params[a] == in_params[b]) == (varying[a] == varying[b])
        assert len({p.name for p in cand.params}) == len(cand.params)


# ----------------------------------------------------------------------------------------------
# parameter binding from earlier outputs, against a brute-force reference
# ----------------------------------------------------------------------------------------------
VALUES = ["u", "v", "w", "x"]


@st.composite
def output_trace_st(draw):
    """Sessions of ``list`` (its output lists ids) then ``get`` calls whose id is sometimes an
    element of that list (at some index), sometimes not."""
    trace = []
    for _ in range(draw(st.integers(3, 7))):
        ids = draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=4))
        other = draw(st.sampled_from(VALUES))
        out = json.dumps({"items": ids, "owner": other, "meta": {"first": ids[0]}})
        trace.append(Call.make("list", {"q": draw(st.sampled_from(["a", "b"]))}, output=out))
        for _ in range(draw(st.integers(1, 3))):
            pick = draw(st.one_of(st.sampled_from(ids), st.sampled_from(VALUES)))
            trace.append(Call.make("get", {"id": pick}, output=json.dumps({"id": pick})))
        trace.append(None)
    return trace


def reference_sources(trace, cand, param):
    """Every (step, path) whose output leaf equalled the parameter's first value, with the number
    of chosen occurrences where it did."""
    j, key = min(param.positions)
    hits = {}
    for s in cand.starts:
        value = trace[s + j].arg_dict[key]
        found = {(i, path) for i in range(j) for path, v in trace[s + i].refs if v == value}
        for src in found:
            hits[src] = hits.get(src, 0) + 1
    return hits


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=output_trace_st())
def test_output_refs_match_brute_force(trace):
    from waggle.route import derive_refs

    for cand in mine(trace, MineConfig(min_len=2, max_len=4, k=2)):
        refs = derive_refs(cand)
        for p in cand.params:
            j, _ = min(p.positions)
            hits = reference_sources(trace, cand, p) if j > 0 else {}
            best = max(hits.values(), default=0)
            if best >= 2 and best * 2 > len(cand.starts):
                src = refs[p.name]
                rank = lambda s: (hits[s], s[0], -len(s[1]))  # noqa: E731
                assert rank(src) == max(rank(s) for s in hits)  # the most frequent, latest, shortest
            else:
                assert p.name not in refs
        for name in refs:  # a ref is only ever made for a real parameter
            assert name in {p.name for p in cand.params}
