"""Issue 24 point 1: the host's judge books what the model really drew on (booked precision near
true precision): a model that walks on down a list the replay walked took the replayed elements
as read; a reply writes dates and numbers for a reader ("May 17", "$1,227")."""
from __future__ import annotations

import json

import pytest

from waggle import evidence, service
from waggle.config import WaggleConfig
from waggle.models import FiredPlan, LedgerEntry
from waggle_helpers import FakeExec

pytestmark = pytest.mark.django_db

QUIET = WaggleConfig(mine_period=10_000)


def user_output(user, ids):
    return json.dumps({"name": user, "reservations": ids})


def res_output(rid):
    return json.dumps({"id": rid, "seat": "1A"})  # nothing in it a reply would name


def walk(space, session, user, ids, fetched, cfg):
    service.observe(space, session, "m", "get_user", {"user_id": user}, False, user_output(user, ids), config=cfg)
    for rid in ids[:fetched]:
        service.observe(space, session, "m", "get_reservation", {"reservation_id": rid}, False, res_output(rid),
                        config=cfg)


def teach_walk(cfg):
    for u in range(4):
        walk("1", f"t{u}", f"user{u}", [f"R{u}{j}" for j in range(4)], 4, QUIET)
        service.observe("1", f"t{u}", "m", "answer", {}, True, "done", config=QUIET)
    while service.sweep("1", config=cfg) is not None:
        pass


def fire_walk(cfg, ids):
    exe = FakeExec(answers={"get_reservation": res_output("x")})
    walk("1", "new", "newbie", ids, 2, cfg)
    assert service.follow("1", "new", exe, config=cfg) is not None
    return [a["reservation_id"] for _, a in exe.calls]


def test_a_model_that_walks_on_past_the_replayed_elements_used_them():
    cfg = WaggleConfig(mine_period=8, min_len=2, max_len=6, k=3, min_prefix=2, fanout_cap=2)
    teach_walk(cfg)
    ids = [f"N{j}" for j in range(8)]
    got = fire_walk(cfg, ids)
    assert got == ["N2", "N3"]  # the cap: two more
    # the model goes on with the next element: it took N2 and N3 as read
    service.judge_reply("1", "new", [("get_reservation", {"reservation_id": "N4"})], text="", config=cfg)
    entry = LedgerEntry.objects.get()
    assert entry.settled and entry.used_steps == 2


def test_a_model_that_jumps_to_a_later_element_did_not_use_the_skipped_ones():
    cfg = WaggleConfig(mine_period=8, min_len=2, max_len=6, k=3, min_prefix=2, fanout_cap=2)
    teach_walk(cfg)
    ids = [f"N{j}" for j in range(8)]
    fire_walk(cfg, ids)
    # N5: N4 was neither replayed nor made: the model wanted N5, not a walk down the list
    service.judge_reply("1", "new", [("get_reservation", {"reservation_id": "N5"})], text="", config=cfg)
    assert not LedgerEntry.objects.get().settled
    service.end_run("1", "new", config=cfg)
    entry = LedgerEntry.objects.get()
    assert entry.used_steps == 0 and [s[7] for s in FiredPlan.objects.get().tail] == ["not drawn on"] * 2


def test_dates_and_numbers_are_found_as_a_reader_writes_them():
    assert evidence.drawn(["2024-05-17"], "Your flight on May 17, 2024 is booked.") == "2024-05-17"
    assert evidence.drawn(["2024-05-02"], "departing 2nd May") is None  # ("2 may" / "may 2nd" only)
    assert evidence.drawn(["2024-05-02"], "departing May 2nd") == "2024-05-02"
    assert evidence.drawn(["1227"], "The total is $1,227.") == "1227"
    assert evidence.drawn(["159"], "Price: $159.00") == "159"
    assert evidence.drawn(["1227"], "11227 points") is None
    assert evidence.drawn(["2024-05-12T17:08:42"], "May 12") is None  # a timestamp is not a day


def test_a_float_is_found_as_a_whole_number_or_rounded_but_never_inside_a_longer_number():
    """A tool says 980.0 and the model writes "980 miles"; a computed 10.566880000000001 is passed
    on as 10.57. A short whole (10.0 as "10") is too common to tell; 980 is not in 980.05."""
    assert evidence.drawn(["980.0"], "The estimated distance is 980 miles.") == "980.0"
    assert evidence.drawn(["10.566880000000001"], '{"fuelAmount": 10.57}') == "10.566880000000001"
    assert evidence.drawn(["10.0"], "add 10 liters") is None
    assert evidence.drawn(["980.0"], "980.05 km") is None
    assert evidence.drawn(["980"], "1.980 km") is None


def test_a_json_output_of_only_flags_brought_no_value_to_name():
    """{"canDrive": false}: its key is a name of the tool's schema, not a value it returned."""
    assert evidence.step_evidence({"distance": 980.0}, json.dumps({"canDrive": False}), known=set()) == []
    assert evidence.step_evidence({}, "Gate B12 opens", known=set()) == ["B12"]  # (plain text: its words)


def test_a_date_the_session_already_said_in_words_is_no_evidence():
    output = json.dumps({"date": "2024-05-17", "other": "2024-06-01"})
    assert evidence.step_evidence({}, output, known={"May", "17,"}) == ["2024-06-01"]
    # said in words after the replay (a later message): excluded there too
    assert evidence.drawn(["2024-05-17"], "on May 17", exclude={"May", "17"}) is None


def flights(tool, args):
    """Each reservation's output holds its own flight number (what a reply names)."""
    rid = args.get("reservation_id", "")
    return json.dumps({"id": rid, "flight": f"HAT{100 + int(rid[1:] or 0)}"})


def teach_long_walks(cfg):
    for u in range(4):
        walk("1", f"t{u}", f"user{u}", [f"R{u}{j}" for j in range(6)], 6, QUIET)
        service.observe("1", f"t{u}", "m", "answer", {}, True, "done", config=QUIET)
    while service.sweep("1", config=cfg) is not None:
        pass


def fire_walk_of(cfg, ids):
    calls = []
    walk("1", "new", "newbie", ids, 2, cfg)
    assert service.follow("1", "new", lambda t, a: calls.append(a["reservation_id"]) or flights(t, a),
                          config=cfg) is not None
    return calls


@pytest.mark.parametrize("reported", [-1, 1, 0])  # the last element replayed, the second, the first
def test_a_list_walk_reported_at_one_element_walked_past_the_ones_before_it(reported):
    cfg = WaggleConfig(mine_period=8, min_len=2, max_len=6, k=3, min_prefix=2, fanout_cap=4)
    teach_long_walks(cfg)
    replayed = fire_walk_of(cfg, [f"N{j}" for j in range(8)])
    assert replayed == ["N2", "N3", "N4", "N5"]
    flight = json.loads(flights("get_reservation", {"reservation_id": replayed[reported]}))["flight"]
    service.judge_reply("1", "new", [], text=f"Found it: your flight {flight}.", config=cfg)
    service.end_run("1", "new", config=cfg)
    upto = reported % len(replayed) + 1  # that element and every one before it in the walk
    assert [s[7] for s in FiredPlan.objects.get().tail] == ["used"] * upto + ["not drawn on"] * (len(replayed) - upto)
    assert LedgerEntry.objects.get().used_steps == upto


def test_walking_past_needs_one_list_not_just_one_tool():
    """Two replayed lookups that are not neighbours in any list the session saw: naming the second
    says nothing about the first."""
    cfg = WaggleConfig(mine_period=8, min_len=2, max_len=6, k=3, min_prefix=2, fanout_cap=4)
    teach_long_walks(cfg)
    fire_walk_of(cfg, [f"N{j}" for j in range(8)])
    fired = FiredPlan.objects.get()
    tail = fired.tail
    tail[1][1] = {"reservation_id": '"Z9"'}  # (as if the second one came from elsewhere)
    FiredPlan.objects.filter(pk=fired.pk).update(tail=tail)
    service.judge_reply("1", "new", [], text="Found it: your flight HAT104.", config=cfg)  # (N4's)
    service.end_run("1", "new", config=cfg)
    assert [s[7] for s in FiredPlan.objects.get().tail] == ["not drawn on", "not drawn on", "used", "not drawn on"]


def test_a_capitalised_word_opening_a_sentence_of_a_text_output_is_not_evidence():
    """"The" or "Error:" at a sentence's start is grammar: a reply saying "the" did not draw on
    the text. A name inside a sentence, or a capitalised id with a digit, still is."""
    output = "The flight is late.\nError: seat taken by Smith. Gate B12 opens"
    assert evidence.step_evidence({}, output, known=set()) == ["Smith", "B12"]


def test_a_value_two_steps_of_one_replay_brought_names_neither():
    """Two replayed reservations both fly through MIA: a reply naming MIA may have read either (or
    neither: the one the model had already made itself), so it books no step used (a value one of
    them alone brought still does: the walks above)."""
    cfg = WaggleConfig(mine_period=8, min_len=2, max_len=6, k=3, min_prefix=2, fanout_cap=4)
    teach_long_walks(cfg)

    def via_hub(tool, args):
        return json.dumps(json.loads(flights(tool, args)) | {"hub": "MIA"})

    walk("1", "new", "newbie", [f"N{j}" for j in range(8)], 2, cfg)
    assert service.follow("1", "new", via_hub, config=cfg) is not None
    tail = FiredPlan.objects.get().tail
    assert all("MIA" not in s[6] for s in tail) and all(s[6] for s in tail)
    service.judge_reply("1", "new", [], text="Both fly through MIA.", config=cfg)
    service.end_run("1", "new", config=cfg)
    assert LedgerEntry.objects.get().used_steps == 0
