"""Only predictable steps are replayed: every step of a route's tail, and every element of a
fan-out, must itself pass the lower bound of "the agent made it" (a strong first step cannot
carry a coin-flip second one; agents stop somewhere in a list)."""
from __future__ import annotations

import json

from waggle.route import Route, Step, TraceIndex, choose_trigger
from waggle.trace import Call


def user(u: str, ids: list[str]) -> Call:
    return Call.make("get_user", {"user_id": u}, output=json.dumps({"reservations": ids}))


def res(rid: str) -> Call:
    return Call.make("get_res", {"rid": rid}, output=json.dumps({"id": rid}))


def sessions(walks: list[tuple[int, int]]) -> list[Call | None]:
    """One session per walk (a distinct user): the user lists ``size`` ids, the agent fetches the
    first ``fetched`` of them, then answers (a barrier)."""
    trace: list[Call | None] = []
    for n, (size, fetched) in enumerate(walks):
        ids = [f"R{n}x{j}" for j in range(size)]
        trace += [user(f"u{n}", ids)] + [res(r) for r in ids[:fetched]]
        trace.append(Call.make("answer", {}, mutates=True))
        trace.append(None)
    return trace


def ref(j: int) -> tuple:
    return (("rid", (0, ("reservations", j))),)


WALK = (Step("get_user", binds=(("user_id", "u"),)), Step("get_res", refs=ref(0)), Step("get_res", refs=ref(1)))


def test_a_fan_out_replays_only_the_list_elements_that_are_predictable():
    # 20 users with 6 reservations: all fetch the first 5, half of them the 6th as well
    walks = [(6, 5)] * 10 + [(6, 6)] * 10
    route = Route(steps=WALK + (Step("get_res", refs=ref(2), each=True),), params=("u",), name="walk")
    chosen = choose_trigger(route, TraceIndex(sessions(walks)), 2, 0.75, cap=8)
    assert chosen is not None and chosen.trigger == 2
    # after user + first reservation: the second (fixed step) and elements 2, 3, 4 are always
    # fetched, element 5 half the time: not replayed, though the share over the whole tail
    # (5.5 of 6 steps on average) would pass
    assert chosen.cap == 3


def test_a_fixed_step_that_is_a_coin_flip_blocks_its_trigger():
    # after user + first reservation, everyone fetches the second; only half go on to the third
    walks = [(3, 2)] * 10 + [(3, 3)] * 10
    route = Route(steps=WALK + (Step("get_res", refs=ref(2)),), params=("u",), name="fixed")
    assert choose_trigger(route, TraceIndex(sessions(walks)), 2, 0.6) is None
    # the same route where the third is always fetched fires after the first two steps
    chosen = choose_trigger(route, TraceIndex(sessions([(3, 3)] * 20)), 2, 0.6)
    assert chosen is not None and chosen.trigger == 2


def test_an_element_seen_in_too_few_contexts_is_not_replayed():
    # long lists are rare: only two users had a 4th reservation (both fetched it)
    walks = [(3, 3)] * 8 + [(4, 4)] * 2
    route = Route(steps=WALK + (Step("get_res", refs=ref(2), each=True),), params=("u",), name="rare")
    chosen = choose_trigger(route, TraceIndex(sessions(walks)), 2, 0.75, min_contexts=3)
    assert chosen is not None and chosen.cap == 1


def test_a_walk_past_a_replay_is_judged_again_at_each_alignment():
    # 20 users with 5 reservations: everyone fetches the first three, only half go on to the
    # fourth, and whoever fetched the fourth also fetches the fifth
    walks = [(5, 3)] * 10 + [(5, 5)] * 10
    steps = WALK + (Step("get_res", refs=ref(2)), Step("get_res", refs=ref(3)), Step("get_res", refs=ref(4)))
    route = Route(steps=steps, params=("u",), name="walk5")
    chosen = choose_trigger(route, TraceIndex(sessions(walks)), 2, 0.6)
    # fixed steps: nothing after user + one, two or three (the coin-flip fourth blocks every tail
    # holding it); after user + four (the model went on by itself): the fifth
    assert chosen is not None and chosen.trigger == 5 and chosen.reach == {5: 1}
    fan = Route(steps=WALK + (Step("get_res", refs=ref(2), each=True),), params=("u",), name="walkfan")
    chosen = choose_trigger(fan, TraceIndex(sessions(walks)), 2, 0.6)
    assert chosen is not None and chosen.reach == {2: 2, 3: 1}
    from waggle.replay import find_plan

    ids = ["a", "b", "c", "d", "e"]
    calls = [user("new", ids)] + [res(r) for r in ids]
    assert [dict(a)["rid"] for _, a in find_plan(calls[:2], [chosen]).tail] == ['"b"', '"c"']
    assert [dict(a)["rid"] for _, a in find_plan(calls[:3], [chosen]).tail] == ['"c"']
    assert Route.from_json(chosen.to_json(), name="walkfan").reach == {2: 2, 3: 1}
