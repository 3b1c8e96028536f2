"""Issue 12: the ledger tells the truth, routes bind values from earlier outputs and fan out,
confidence is a small-sample lower bound over distinct contexts, arguments keep their JSON types,
and bad input (lone surrogates, huge literals, long traces, far-apart repeats) is handled."""
from __future__ import annotations

import json

import pytest
from django.db import DatabaseError

from waggle import service, sweeping
from waggle.config import WaggleConfig
from waggle.models import ForageCall, LedgerEntry, Waggle
from waggle.route import Route, Step, TraceIndex, choose_trigger, render_script, wilson_lower
from waggle.trace import Call
from waggle_helpers import FakeExec, feed, noise, routine

pytestmark = pytest.mark.django_db

QUIET = WaggleConfig(mine_period=10_000)


def teach(space, cfg, modules=("m1", "m2", "m3")):
    for i, m in enumerate(modules):
        feed(space, f"teach-{m}", routine(m) + noise(i), QUIET)
    w = service.sweep(space, config=cfg)
    assert w is not None
    return w


ANSWERS = {"read_file": "Body1 of the file", "git_log": "commit Log22", "blackboard_read": "note Board333"}
DRAWN = "Body1, Log22 and Board333"  # a reply that draws on each replayed step's output


def fire(space, session, module, cfg, exe=None):
    feed(space, session, routine(module)[:2], cfg)
    return service.follow(space, session, exe or FakeExec(answers=ANSWERS), config=cfg)


# --- 1. the ledger tells the truth --------------------------------------------------------------
def test_a_replay_the_model_repeats_itself_is_a_miss_and_demotes_the_route(cfg):
    w = teach("1", cfg)
    assert fire("1", "s1", "fresh", cfg) is not None
    tail = [(t, a) for t, a in routine("fresh")[2:]]
    service.judge_reply("1", "s1", tail[:1], text=DRAWN, config=cfg)  # the model fetched read_file again itself
    entry = LedgerEntry.objects.get()
    assert entry.settled and entry.used_steps == 2 and not entry.fail  # the other two were relied on
    assert not Waggle.objects.get(name=w.name).disabled
    assert fire("1", "s2", "x2", cfg) is not None  # the model ignores this replay entirely
    service.judge_reply("1", "s2", [(t, a) for t, a in routine("x2")[2:]], config=cfg)
    stats = service.list_waggles("1")[0]["stats"]
    assert (stats["uses"], stats["fails"], stats["steps_replayed"], stats["steps_used"]) == (1, 1, 6, 2)
    assert Waggle.objects.get(name=w.name).disabled  # 2 of 6 used: demoted at once
    assert fire("1", "s4", "later", cfg) is None


def test_a_reply_that_contradicts_a_replayed_step_makes_it_a_miss(cfg):
    teach("1", cfg)
    assert fire("1", "s1", "fresh", cfg) is not None  # replays read_file, git_log(limit=5), blackboard_read
    # the model asks git_log about the same path with another setting: the replayed log was not
    # what it needed; another path with the same setting contradicts nothing
    service.judge_reply("1", "s1", [("git_log", {"path": "fresh", "limit": 50}),
                                    ("read_file", {"path": "elsewhere"})], text=DRAWN, config=cfg)
    entry = LedgerEntry.objects.get()
    assert entry.settled and entry.used_steps == 2 and "1 contradicted" in entry.detail
    assert fire("1", "s2", "x2", cfg) is not None
    service.judge_reply("1", "s2", [("git_log", {"path": "other", "limit": 5})], text=DRAWN, config=cfg)
    assert LedgerEntry.objects.get(session_key="s2").used_steps == 3


def test_replayed_calls_are_never_mining_input(cfg):
    teach("1", cfg)
    for i in range(4):
        assert fire("1", f"r{i}", f"v{i}", cfg) is not None
    segments = sweeping._space_segments("1", cfg.normalized())
    replayed = ForageCall.objects.filter(replayed=True).count()
    assert replayed == 12
    kept = sum(1 for seg in segments for c in seg if c is not None)
    assert kept == ForageCall.objects.filter(replayed=False).count()  # replayed rows are barriers


# --- 2. parameters bound to earlier outputs, fan-out with a cap -----------------------------------
def user_output(user, ids):
    return json.dumps({"name": user, "reservations": ids})


def walk(space, session, user, ids, fetched, cfg):
    """get_user(user) lists ``ids``; the model then fetches the first ``fetched`` of them."""
    service.observe(space, session, "m", "get_user", {"user_id": user}, False, user_output(user, ids), config=cfg)
    for rid in ids[:fetched]:
        service.observe(space, session, "m", "get_reservation", {"reservation_id": rid}, False,
                        json.dumps({"id": rid, "seat": "1A"}), config=cfg)


def test_a_route_binds_ids_from_an_earlier_output_and_fans_out_with_a_cap(cfg):
    for u in range(4):  # four users, each walking all of their reservations
        ids = [f"R{u}{j}" for j in range(4)]
        walk("1", f"t{u}", f"user{u}", ids, 4, QUIET)
        service.observe("1", f"t{u}", "m", "answer", {}, True, "done", config=QUIET)
    while service.sweep("1", config=cfg) is not None:
        pass
    fan = [Route.from_json(w.route) for w in Waggle.objects.all()]
    assert any(r.steps[-1].each for r in fan), [render_script(r) for r in fan]
    exe = FakeExec()
    ids = [f"N{j}" for j in range(12)]  # a new user, never seen: the values come from the output
    walk("1", "new", "newbie", ids, 2, cfg)
    block = service.follow("1", "new", exe, config=cfg)
    assert block is not None
    got = [a["reservation_id"] for _, a in exe.calls]
    assert got[0] == "N2" and got == ids[2:2 + len(got)]  # in list order, none fetched twice
    assert 1 <= len(got) <= cfg.fanout_cap + 4  # fixed steps, then the fan-out's cap


def test_fan_out_cap_bounds_a_long_list():
    route = Route(steps=(Step("get_user", binds=(("user_id", "u"),)),
                         Step("get_res", refs=(("rid", (0, ("reservations", 0))),)),
                         Step("get_res", refs=(("rid", (0, ("reservations", 1))),), each=True)),
                  params=("u",), name="r", cap=3)
    out = Call.make("get_user", {"user_id": "a"}, output=user_output("a", [f"x{i}" for i in range(50)]))
    first = Call.make("get_res", {"rid": "x0"}, output="{}")
    from waggle.replay import find_plan

    plan = find_plan([out, first], [route], cap=8)
    assert [dict(a)["rid"] for _, a in plan.tail] == ['"x1"', '"x2"', '"x3"']  # the route's learned cap
    assert len(find_plan([out, first], [Route(**{**route.__dict__, "cap": 0})], cap=5).tail) == 5


# --- 3. confidence is a lower bound over distinct contexts ----------------------------------------
def test_a_route_seen_only_in_one_context_is_not_stored(cfg):
    # the same concrete walk many times in one session (say, a retry loop): one context
    for i in range(6):
        feed("1", "busy", routine("same") + noise(i), QUIET)
    assert service.sweep("1", config=cfg) is None
    # the same count spread over three different modules: three contexts, stored
    teach("2", cfg)


def test_wilson_lower_bound_is_small_for_small_samples():
    assert wilson_lower(3, 3, 1.0) == pytest.approx(0.75)
    assert wilson_lower(30, 30, 1.0) > 0.96
    assert wilson_lower(0, 0, 1.0) == 0.0
    assert wilson_lower(5, 10, 1.645) < 0.5


# --- 4. JSON types end to end ---------------------------------------------------------------------
def test_arguments_keep_their_json_types_through_replay(cfg):
    def typed(m):
        return [("task_list", {"mine": False, "tags": [m, "x"]}), ("task_get", {"id": 7, "full": True}),
                ("task_stats", {"mine": False, "window": 2.5})]
    for i, m in enumerate(("a", "b", "c")):
        feed("1", f"s{i}", typed(m) + noise(i), QUIET)
    w = service.sweep("1", config=cfg)
    assert w is not None and w.route["steps"][2]["args"] == {"mine": False, "window": 2.5}
    exe = FakeExec()
    feed("1", "new", typed("d")[:2], cfg)
    assert service.follow("1", "new", exe, config=cfg) is not None
    assert exe.calls == [("task_stats", {"mine": False, "window": 2.5})]
    row = ForageCall.objects.filter(session_key="new").order_by("seq").first()
    assert row.args == {"mine": False, "tags": ["d", "x"]}


# --- 5. robustness --------------------------------------------------------------------------------
def test_a_lone_surrogate_is_stored_as_a_replacement_character(cfg):
    for i, m in enumerate(("a\ud800", "b\udfff", "c\ud83d")):
        feed("1", f"s{i}", routine(m) + noise(i), QUIET)
    assert service.sweep("1", config=cfg) is not None
    for row in ForageCall.objects.all():
        json.dumps(row.args, ensure_ascii=False).encode("utf-8")  # strict: raises on a lone surrogate
    assert any(row.args.get("path") == "a\ufffd" for row in ForageCall.objects.all())


def test_a_failing_store_still_trims_the_forage_log(cfg, monkeypatch):
    small = WaggleConfig(retention_calls=10, mine_period=10_000)
    for i, m in enumerate(("m1", "m2", "m3")):
        feed("1", f"s{i}", routine(m) + noise(i), small)

    def refuse(*a, **k):
        raise DatabaseError("invalid byte sequence for encoding UTF8")
    monkeypatch.setattr(Waggle.objects, "create", refuse)
    service.sweep("1", config=WaggleConfig(retention_calls=10))
    assert ForageCall.objects.filter(space_key="1").count() == 10


def test_a_huge_literal_never_becomes_a_route_script_or_header(cfg):
    huge = "z" * 100_000
    for i, m in enumerate(("m1", "m2", "m3")):
        feed("1", f"s{i}", [("list_dir", {"path": m}), ("grep", {"path": m, "pattern": huge}),
                            ("read_file", {"path": m}), ("stat", {"path": m})] + noise(i), QUIET)
    service.sweep("1", config=cfg)
    assert all(len(w.script) < 5_000 and huge not in json.dumps(w.route) for w in Waggle.objects.all())
    assert ForageCall.objects.filter(oversized=True).count() == 3
    assert max(len(json.dumps(r.args)) for r in ForageCall.objects.all()) < 1_000


def test_choosing_a_trigger_examines_only_sightings_of_its_first_pair():
    trace = [Call.make("read", {"path": f"p{i}"}, output="x") for i in range(5_000)]
    for m in ("a", "b", "c"):
        trace += [None, Call.make("read", {"path": m}), Call.make("grep", {"path": m}), Call.make("stat", {"path": m})]
    route = Route(steps=(Step("read", binds=(("path", "path"),)), Step("grep", binds=(("path", "path"),)),
                         Step("stat", binds=(("path", "path"),))), params=("path",), name="r")
    calls = []
    real = Step.match

    def counting(self, *a, **k):
        calls.append(1)
        return real(self, *a, **k)
    index = TraceIndex(trace)
    try:
        Step.match = counting
        chosen = choose_trigger(route, index, 2, 0.7)
    finally:
        Step.match = real
    assert chosen is not None and chosen.trigger == 2
    assert len(calls) <= 10  # 3 sightings x 2 steps, not one per "read" in the trace


def test_mining_sees_repeats_further_apart_than_two_thousand_calls(cfg):
    for i, m in enumerate(("m1", "m2", "m3")):
        feed("1", f"s{i}", routine(m) + noise(i), QUIET)
        ForageCall.objects.bulk_create([ForageCall(space_key="1", session_key=f"n{i}", seq=j + 1, tool=f"other{i}_{j}",
                                                   args={"j": j}) for j in range(1_500)])
    assert service.sweep("1", config=cfg) is not None


class SeatExec(FakeExec):
    """A reservation's output names its seat (Seat-<id>): what a reply drawing on it names."""

    def __call__(self, tool, args):
        super().__call__(tool, args)
        return json.dumps({"id": args.get("reservation_id"), "seat": f"Seat-{args.get('reservation_id')}"})


def test_the_ledger_stops_replaying_a_position_the_model_keeps_redoing(cfg):
    # user -> reservations [0], [1], [2], [3]; mined from 4 users who all walked the whole list
    steps = (Step("get_user", binds=(("user_id", "u"),)),) + tuple(
        Step("get_reservation", refs=(("reservation_id", (0, ("reservations", j))),)) for j in range(4))
    route = Route(steps=steps, params=("u",), name="walk4").with_trigger(
        2, 0.8, 4, reach={2: 3}, evidence={(2, pos): (4, 4) for pos in range(3)})
    Waggle.objects.create(name="walk4", scope="space", space_key="1", route=route.to_json(),
                          script=render_script(route), length=5)
    replayed = []
    for n in range(4):
        ids = [f"R{n}{j}" for j in range(4)]
        walk("1", f"s{n}", f"user{n}", ids, 1, cfg)
        exe = SeatExec()
        assert service.follow("1", f"s{n}", exe, config=cfg) is not None
        replayed.append([a["reservation_id"] for _, a in exe.calls])
        # the model draws on [1] and [2] but fetches [3] again itself: position 2 is a miss
        service.judge_reply("1", f"s{n}", [("get_reservation", {"reservation_id": ids[3]})],
                            text="Seats " + " and ".join(f"Seat-{rid}" for rid in ids[1:3]), config=cfg)
    # 4 mined contexts and 3 live misses: the upper bound of "used" at position 2 is below 0.75
    assert [len(r) for r in replayed] == [3, 3, 3, 2]
    w = Waggle.objects.get(name="walk4")
    assert not w.disabled and w.route["reach"] == {"2": 2} and w.route["live"]["2:2"] == [3, 0]
    assert LedgerEntry.objects.filter(session_key="s3").get().used_steps == 2


def test_a_stored_route_is_judged_again_when_seen_more_often(cfg):
    w = teach("1", cfg)  # three clean contexts: fires after list_dir + grep
    assert w.route["trigger"] == 2 and w.route["contexts"] == 3
    for i, m in enumerate(("m4", "m5", "m6")):  # three more whole routines...
        feed("1", f"more-{m}", routine(m) + noise(10 + i), QUIET)
    for i in range(8):  # ...and eight sessions where list_dir + grep led elsewhere
        feed("1", f"other-{i}", routine(f"o{i}")[:2] + noise(20 + i), QUIET)
    service.sweep("1", config=cfg)
    w.refresh_from_db()
    assert not w.disabled and w.mined_count == 6
    assert w.route["trigger"] == 3 and w.route["contexts"] == 6  # the larger sample moved the trigger
    feed("1", "fresh", routine("fresh")[:2], cfg)
    assert service.follow("1", "fresh", FakeExec(), config=cfg) is None
    feed("1", "fresh", routine("fresh")[2:3], cfg)
    assert service.follow("1", "fresh", FakeExec(), config=cfg) is not None


def test_a_plain_text_outputs_words_survive_the_database_and_stay_out_of_its_refs():
    """The ring keeps a text output's specific words (waggle.speech watches them); read back from
    ForageCall they are words again, never refs a route could bind to."""
    from waggle import recording
    from waggle.config import WaggleConfig

    cfg = WaggleConfig(mine_period=10_000)
    service.observe("1", "words", "m", "read_file", {"path": "a.py"}, False,
                    "The module defines load_Q7 and talks to db7.example.com. Then it ends.", config=cfg)
    held = recording._ring("1", "words", cfg).recent()[-1]
    assert held.words == ("load_Q7", "db7.example.com") and held.refs == ()
    recording._rings.clear()
    back = recording._ring("1", "words", cfg).recent()[-1]
    assert back.words == held.words and back.refs == ()
