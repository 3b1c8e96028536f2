"""Routes, scripts and the replayer (pure logic, no database)."""
from __future__ import annotations

import pytest

from waggle.miner import MineConfig, mine
from waggle.recorder import DEFAULT_CAPACITY, Recorder
from waggle.replay import Replayer, find_plan, plan_key, run_steps
from waggle.route import Route, RouteFormatError, Step, TraceIndex, choose_trigger, render_script
from waggle.trace import Call, estimate_tokens, flatten_args
from waggle_helpers import FakeExec


def C(tool, mutates=False, **args):
    return Call.make(tool, args, mutates=mutates, output="x")


def mined_route(modules=("m1", "m2", "m3")) -> Route:
    trace = []
    for i, m in enumerate(modules):
        trace += [C("list_dir", path=m), C("grep", path=m, pattern="TODO"), C("read_file", path=m),
                  C("stat", path="setup.cfg"), C(f"noise{i}")]
    cand = mine(trace, MineConfig(min_len=4, max_len=4, k=3))[0]
    return Route.from_candidate(cand)


# --- recorder / trace ---------------------------------------------------------------------------
def test_recorder_is_a_bounded_ring():
    rec = Recorder(3)
    for i in range(5):
        rec.record(C(f"t{i}"))
    assert [c.tool for c in rec.recent()] == ["t2", "t3", "t4"]
    assert [c.tool for c in rec.recent(2)] == ["t3", "t4"]
    assert rec.last_seq == 5
    assert Recorder(0).capacity == DEFAULT_CAPACITY == 200
    assert Recorder(-4).capacity == 200


def test_call_flattening_and_estimates():
    call = Call.make("grep", {"b": 2, "a": "x", "c": {"z": 1, "y": [True]}}, output="abcdefghi")
    assert call.args == (("a", '"x"'), ("b", "2"), ("c", '{"y":[true],"z":1}'))  # canonical JSON text
    assert call.shape == ("grep", ("a", "b", "c"))
    assert call.est_tokens == 3 == estimate_tokens("abcdefghi")  # chars / 4, rounded up
    assert len(call.out_hash) == 16 and call.out_hash != Call.make("grep", {}, output="other").out_hash
    assert flatten_args(None) == ()


# --- routes ---------------------------------------------------------------------------------------
def test_route_from_candidate_json_roundtrip_and_stable_name():
    route = mined_route()
    assert [s.tool for s in route.steps] == ["list_dir", "grep", "read_file", "stat"]
    assert route.params == ("path",)
    assert route.steps[3].literals == (("path", '"setup.cfg"'),)
    again = Route.from_json(route.to_json(), name=route.name)
    assert again == route and again.examples == route.examples
    # same route shape (other values for the parameter) -> same name; other literal -> other name
    assert mined_route(("a", "b", "c")).name == route.name
    assert route.name.startswith("list_dir.grep.read_file.stat-")
    other = Route(steps=route.steps[:3] + (Step("stat", (("path", '"other.cfg"'),)),), params=route.params)
    assert other.stable_name() != route.name


@pytest.mark.parametrize("bad", [
    {}, {"steps": []}, {"steps": [{"args": {}}]}, "not json",
    {"steps": [{"tool": "a", "args": {"p": "1"}, "params": {"p": "x"}}]},
    {"steps": [{"tool": "a", "params": {"p": "x"}}], "params": ["y"]},
    {"steps": [{"tool": "a"}], "trigger": 1},
])
def test_unreadable_routes_are_rejected(bad):
    with pytest.raises(RouteFormatError):
        Route.from_json(bad)


def test_script_is_readable():
    route = mined_route()
    script = render_script(route)
    assert f"# waggle {route.name}" in script
    assert "1. list_dir(path={path})" in script
    assert '4. stat(path="setup.cfg")' in script
    assert "parameters: {path}" in script
    assert "remaining 2 run automatically" in script
    assert render_script(Route(steps=())) is None


def test_determined_tail():
    route = mined_route()
    assert route.determined_at(2) and route.replayable(2)
    unbound = Route(steps=(Step("a", binds=(("p", "x"),)), Step("b"), Step("c", binds=(("p", "y"),))),
                    params=("x", "y"), name="u")
    assert not unbound.determined_at(2) and not unbound.replayable(2)


def test_choose_trigger_uses_confidence():
    route = mined_route()
    trace = []
    for m in ("a", "b", "c"):
        trace += [C("list_dir", path=m), C("grep", path=m, pattern="TODO"), C("read_file", path=m),
                  C("stat", path="setup.cfg"), None]  # one session each (a session never repeats a step)
    # the first two steps are often followed by something else: at 2 steps the confidence is 3/6
    for m in ("d", "e", "f"):
        trace += [C("list_dir", path=m), C("grep", path=m, pattern="TODO"), C("wc", path=m), None]
    # at 3 steps, three clean contexts: Wilson lower bound (z=1) 3/4
    chosen = choose_trigger(route, TraceIndex(trace), min_prefix=2, min_confidence=0.7)
    assert chosen is not None and chosen.trigger == 3 and chosen.confidence == pytest.approx(0.75)
    assert chosen.contexts == 3
    assert choose_trigger(route, TraceIndex(trace), min_prefix=2, min_confidence=0.8) is None  # too few
    assert choose_trigger(route, TraceIndex(trace), min_prefix=2, min_confidence=0.2).trigger == 2
    assert choose_trigger(route, TraceIndex(trace[-12:]), min_prefix=2, min_confidence=0.2) is None


# --- replayer -----------------------------------------------------------------------------------
def test_fires_after_two_matching_steps_with_bound_tail():
    route = mined_route()
    recent = [C("noise"), C("list_dir", path="new"), C("grep", path="new", pattern="TODO")]
    plan = find_plan(recent, [route], min_prefix=2)
    assert plan is not None and plan.matched == 2
    assert plan.tail == (("read_file", (("path", '"new"'),)), ("stat", (("path", '"setup.cfg"'),)))
    assert plan.key == plan_key(route.name, plan.tail)


def test_min_prefix_is_clamped_to_two():
    route = mined_route()
    assert find_plan([C("list_dir", path="new")], [route], min_prefix=1) is None
    assert find_plan([C("list_dir", path="new")], [route], min_prefix=0) is None
    recent = [C("list_dir", path="new"), C("grep", path="new", pattern="TODO")]
    assert find_plan(recent, [route], min_prefix=3) is None
    assert find_plan(recent + [C("read_file", path="new")], [route], min_prefix=3).matched == 3


def test_no_fire_on_mismatch_literal_or_inconsistent_binding():
    route = mined_route()
    assert find_plan([C("list_dir", path="a"), C("grep", path="a", pattern="FIXME")], [route]) is None
    assert find_plan([C("list_dir", path="a"), C("grep", path="b", pattern="TODO")], [route]) is None
    assert find_plan([C("list_dir", path="a"), C("grep", path="a", pattern="TODO", extra="1")], [route]) is None
    # a mutating call as the trigger never fires
    assert find_plan([C("list_dir", path="a"), C("grep", True, path="a", pattern="TODO")], [route]) is None


def test_unbound_tail_never_fires():
    unbound = Route(steps=(Step("a", binds=(("p", "x"),)), Step("b", binds=(("p", "x"),)),
                           Step("c", binds=(("p", "y"),))), params=("x", "y"), name="u")
    recent = [C("a", p="1"), C("b", p="1")]
    assert find_plan(recent, [unbound]) is None
    out = Replayer([unbound]).follow(recent, FakeExec())
    assert out is None


def test_route_trigger_length_is_respected():
    route = Route.from_json(mined_route().to_json() | {"trigger": 3}, name="r")
    two = [C("list_dir", path="n"), C("grep", path="n", pattern="TODO")]
    assert find_plan(two, [route]) is None
    plan = find_plan(two + [C("read_file", path="n")], [route])
    assert plan is not None and [t for t, _ in plan.tail] == ["stat"]


def test_disagreeing_routes_do_not_fire_and_agreeing_ones_run_the_longest():
    a = Route(steps=(Step("x"), Step("y"), Step("z1")), name="a")
    b = Route(steps=(Step("x"), Step("y"), Step("z2")), name="b")
    assert find_plan([C("x"), C("y")], [a, b]) is None
    assert find_plan([C("x"), C("y")], [a]).route.name == "a"
    longer = Route(steps=(Step("x"), Step("y"), Step("z1"), Step("w")), name="c")
    plan = find_plan([C("x"), C("y")], [a, longer])
    assert plan.route.name == "c" and len(plan.tail) == 2
    assert find_plan([C("x"), C("y"), C("z1")], [a, longer]).tail == (("w", ()),)
    # one step further, the longer one agrees with neither: nothing fires
    assert find_plan([C("x"), C("y")], [a, longer, b]) is None


def test_once_per_concrete_plan():
    route = mined_route()
    rep = Replayer([route])
    exe = FakeExec()
    recent = [C("list_dir", path="n"), C("grep", path="n", pattern="TODO")]
    first = rep.follow(recent, exe)
    assert first is not None and first.ok
    assert rep.follow(recent, exe) is None  # same plan: not again
    other = [C("list_dir", path="o"), C("grep", path="o", pattern="TODO")]
    assert rep.follow(other, exe).ok  # another binding is another plan
    assert exe.calls == [("read_file", {"path": "n"}), ("stat", {"path": "setup.cfg"}),
                         ("read_file", {"path": "o"}), ("stat", {"path": "setup.cfg"})]


def test_block_format_and_estimate_label():
    tail = (("read_file", (("path", '"n"'),)), ("stat", (("path", '"s"'),)))
    out = run_steps("r1", tail, FakeExec(answers={"read_file": "hello", "stat": "size 3"}))
    assert out.ok
    lines = out.block.splitlines()
    # the block rides in every later request: no route name, no estimate (both the ledger's)
    assert lines[0] == "[waggle: replayed 2 steps]"
    assert 'step 1/2: read_file(path="n")' in lines[1]
    assert "hello" in out.block and "size 3" in out.block
    assert lines[-1] == "[waggle: end]"
    assert out.yield_tokens > 0


def test_exec_error_or_empty_output_is_a_failure_without_block():
    tail = (("read_file", (("path", '"n"'),)), ("stat", ()))
    boom = run_steps("r", tail, FakeExec(fail_on={"stat"}))
    assert not boom.ok and boom.block is None and "stat" in boom.error and "exploded" in boom.error
    empty = run_steps("r", tail, FakeExec(empty_on={"read_file"}))
    assert not empty.ok and empty.block is None and "no output" in empty.error
    weird = run_steps("r", tail, lambda t, a: None)
    assert not weird.ok
