"""Inbound routes: a call whose argument is the one pending token of the learned shape in the
message that woke the member (waggle.inbound), mined against a brute-force reference, replayed
through the service and booked honestly by the ledger."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waggle import service
from waggle.config import WaggleConfig
from waggle.inbound import (INBOUND_TOOL, MAX_TOKEN_CHARS, MAX_TOKENS, TokenShape, is_message, message_call,
                            message_tokens, mine_heard, plan_heard, plan_joined, route_of, tokens)
from waggle.models import FiredPlan, ForageCall, LedgerEntry, Waggle
from waggle.route import Route, render_script, wilson_lower
from waggle.trace import Call, decode_value
from waggle_helpers import FakeExec, teach_heard

USERS = ["mia_li_3668", "noah_smith_1234", "ava_kim_2020", "liam_wu_7781", "emma_roy_4410", "omar_haddad_9001"]


# --- tokens and shapes (pure) ---------------------------------------------------------------------
def test_tokens_strip_punctuation_and_keep_order():
    assert tokens("My user id is mia_li_3668. Look at src/foo.py, please!") == \
        ["My", "user", "id", "is", "mia_li_3668", "Look", "at", "src/foo.py", "please"]
    assert tokens("(JG7FMM) and JG7FMM") == ["JG7FMM", "and"]


@pytest.mark.parametrize("text", [None, "", 42, b"bytes", "   \n\t "])
def test_no_message_gives_no_tokens(text):
    assert tokens(text) == []
    assert message_call(text).refs == ()


def test_huge_and_odd_tokens_are_not_candidates():
    huge = "x" * (MAX_TOKEN_CHARS + 1)
    got = tokens(f"id {huge} \ud800lone mia_li_3668")
    assert huge not in got and "mia_li_3668" in got
    assert "\ufffdlone" in got  # a lone surrogate is made storable, never raised
    many = " ".join(f"t{i}" for i in range(MAX_TOKENS * 3))
    assert len(tokens(many)) == MAX_TOKENS
    assert len(tokens("a " * 5_000_000)) == 1  # a 10 MB message is read only as far as its start


def test_a_shape_is_learned_from_values_not_the_literals():
    shape = TokenShape.learn(["mia_li_3668", "noah_smith_1234", "liam_wu_7781"])
    assert shape.fits("ava_kim_2020") and shape.fits("omar_hadd_9001")
    assert shape.fits("omar_haddad_90012")  # a little longer than any seen: lengths varied (11-15)
    assert not shape.fits("omar_haddad_" + "9" * 8)  # 20: past the spread seen beyond the longest
    assert not shape.fits("reservation")  # no digits, no underscore
    assert not shape.fits("JG7FMM") and not shape.fits("a_1")  # other classes; too short
    assert TokenShape.from_json(json.loads(json.dumps(shape.to_json()))) == shape
    assert TokenShape.learn([]) is None


# --- mining (pure) against a brute-force reference -----------------------------------------------
def session(user, *, first=True, reply="", extra=""):
    """A support session: the user gives their id, the agent (when ``first``) looks it up first."""
    events = [message_call(f"Hi, {reply}my user id is {user}. {extra}")]
    if not first:
        events.append(Call.make("think", {"thought": "what do they want"}))
    events.append(Call.make("get_user_details", {"user_id": user}, output=json.dumps({"id": user})))
    events.append(Call.make("cancel", {"user_id": user}, mutates=True))
    return events


def brute_heard(segments, min_contexts):
    """Reference: every definition applied from scratch at every position (quadratic)."""
    def strs(c):
        return [decode_value(v) for _, v in c.args if isinstance(decode_value(v), str)]

    values, groups = {}, {}
    for seg in segments:
        for j, c in enumerate(seg):
            if c is None or is_message(c) or c.barrier:
                continue
            for key, v in c.args:
                d = decode_value(v)
                if not isinstance(d, str):
                    continue
                said = any(is_message(x) and d in message_tokens(x) for x in seg[:j] if x is not None)
                used = any(x is not None and not is_message(x) and d in strs(x) for x in seg[:j])
                if said and not used:
                    values.setdefault((c.tool, key), set()).add(d)
                    groups.setdefault((c.tool, key, tuple(a for a in c.args if a[0] != key)), set()).add(d)
    shapes = {a: TokenShape.learn(sorted(v)) for a, v in values.items() if len(v) >= min_contexts}
    cands = [g for g, v in groups.items() if len(v) >= min_contexts and (g[0], g[1]) in shapes]
    allshapes = {shapes[(g[0], g[1])] for g in cands}
    out = {}
    for g in cands:
        tool, key, lits = g
        shape = shapes[(tool, key)]
        per = {}
        for seg in segments:
            for at, c in enumerate(seg):
                if c is None or not is_message(c):
                    continue
                before = seg[:at + 1]
                used = {s for x in before if x is not None and not is_message(x) for s in strs(x)}
                pend = {t for x in before if x is not None and is_message(x) for t in message_tokens(x)
                        if t not in used and any(s.fits(t) for s in allshapes)}
                if len(pend) != 1:
                    continue
                (token,) = pend
                if token not in message_tokens(c) or not shape.fits(token):
                    continue
                rest = [x for x in seg[at + 1:] if x is None or not is_message(x)]
                if rest and rest[0] is None:
                    continue
                step = (tool, tuple(sorted(list(lits) + [(key, json.dumps(token))])))
                if any(x is not None and not is_message(x) and x.invocation() == step for x in seg[:at]):
                    continue
                n, u = per.get(token, (0, 0))
                per[token] = (n + 1, u + bool(rest and rest[0].invocation() == step))
        if len(per) >= min_contexts:
            out[(tool, key, lits)] = (len(per), round(sum(u / n for n, u in per.values()), 9))
    return out


word_st = st.sampled_from(["aa_1", "bb_2", "cc_3", "XY9", "QQ7", "hello", "is", "dd_4"])
event_st = st.one_of(
    st.builds(lambda ws: message_call(" ".join(ws)), st.lists(word_st, max_size=3)),
    st.builds(lambda tool, v, lit: Call.make(tool, {"id": v} | ({"mode": lit} if lit else {})),
              st.sampled_from(["get", "find"]), word_st, st.sampled_from(["", "", "fast"])),
    st.builds(lambda v: Call.make("change", {"id": v}, mutates=True), word_st),
    st.just(None),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(segments=st.lists(st.lists(event_st, max_size=12), max_size=8), k=st.integers(1, 3))
def test_mined_inbound_routes_match_brute_force(segments, k):
    got = mine_heard(segments, min_contexts=k, min_confidence=0.0, z=1.0, wilson=wilson_lower)
    assert {(h.tool, h.key, h.literals): (h.contexts, round(h.used, 9)) for h in got} == brute_heard(segments, k)


def test_mining_learns_the_lookup_and_refuses_a_coin_flip():
    sure = [session(u) for u in USERS]
    heard = mine_heard(sure, min_contexts=3, min_confidence=0.75, z=1.0, wilson=wilson_lower)
    assert [(h.tool, h.key, h.contexts) for h in heard] == [("get_user_details", "user_id", 6)]
    flip = [session(u, first=i % 2 == 0) for i, u in enumerate(USERS)]  # half the time it thinks first
    assert mine_heard(flip, min_contexts=3, min_confidence=0.75, z=1.0, wilson=wilson_lower) == []
    # near-copies of one task are one context, however often they recur
    copies = [session(USERS[0]) for _ in range(10)]
    assert mine_heard(copies, min_contexts=3, min_confidence=0.0, z=1.0, wilson=wilson_lower) == []


def test_two_pending_values_fire_nothing():
    route = route_of(mine_heard([session(u) for u in USERS], min_contexts=3, min_confidence=0.75, z=1.0,
                                wilson=wilson_lower)[0])
    one = [message_call("I am zoe_park_5150")]
    assert plan_heard([route], one)[1] == ("get_user_details", (("user_id", '"zoe_park_5150"'),))
    two = [message_call("I am zoe_park_5150, my partner is ben_park_5151")]
    assert plan_heard([route], two) is None
    earlier = [message_call("my partner is ben_park_5151"), message_call("I am zoe_park_5150")]
    assert plan_heard([route], earlier) is None  # a value from an earlier message is still pending
    looked_up = earlier[:1] + [Call.make("get_user_details", {"user_id": "ben_park_5151"})] + earlier[1:]
    assert plan_heard([route], looked_up)[1][1] == (("user_id", '"zoe_park_5150"'),)
    assert plan_heard([route], [message_call("")]) is None
    assert plan_heard([route], [Call.make("x")]) is None  # no message: nothing to hear


def test_an_inbound_route_round_trips_and_renders():
    h = mine_heard([session(u) for u in USERS], min_contexts=3, min_confidence=0.75, z=1.0, wilson=wilson_lower)[0]
    route = route_of(h)
    back = Route.from_json(route.to_json(), name=route.name)
    assert back == route and back.shapes == route.shapes and back.heard == ("user_id",)
    script = render_script(route)
    assert "inbound message" in script and "get_user_details(user_id={user_id})" in script
    assert route.name.startswith("heard.get_user_details-")


# --- the service: record, mine, replay, ledger ---------------------------------------------------
QUIET = WaggleConfig(mine_period=10_000)


def teach(space, users=USERS):
    return teach_heard(space, users, QUIET)


@pytest.mark.django_db
def test_the_message_that_woke_the_member_replays_the_lookup_before_the_model_asks():
    w = teach("1")
    exe = FakeExec({"get_user_details": '{"id": "zoe_park_5150", "reservations": ["K8TQ2Z"]}'})
    block = service.inbound("1", "live", "m", "Hi! I am zoe_park_5150 and need help.", exe, config=QUIET)
    assert exe.calls == [("get_user_details", {"user_id": "zoe_park_5150"})]
    assert block.startswith("[waggle: replayed 1 step]") and "zoe_park_5150" in block
    assert FiredPlan.objects.get(session_key="live").name == w.name
    assert ForageCall.objects.filter(session_key="live", replayed=True).count() == 1
    # the model draws on it (its next call takes the reservation the replay listed): used
    assert service.judge_reply("1", "live", [("get_reservation", {"id": "K8TQ2Z"})], config=QUIET) == 1
    entry = LedgerEntry.objects.get(session_key="live")
    assert entry.settled and entry.used_steps == 1 and not entry.fail
    # the same plan never fires twice in a session
    assert service.inbound("1", "live", "m", "Again: zoe_park_5150", exe, config=QUIET) is None


@pytest.mark.django_db
def test_a_heard_replay_the_model_makes_again_is_a_miss_and_demotes_the_route():
    w = teach("1")
    for i in range(4):
        user = f"zed_quinn_{1000 + i}"
        assert service.inbound("1", f"s{i}", "m", f"id {user}", FakeExec(), config=QUIET) is not None
        service.judge_reply("1", f"s{i}", [("get_user_details", {"user_id": user})], config=QUIET)
        if Waggle.objects.get(name=w.name).disabled:
            break
    assert LedgerEntry.objects.filter(fail=True).count() >= 1
    assert Waggle.objects.get(name=w.name).disabled  # every replay re-issued: demoted
    assert service.inbound("1", "later", "m", "id zed_quinn_9999", FakeExec(), config=QUIET) is None
    teach_again = service.sweep("1", config=QUIET)  # mining does not bring a demoted route back
    assert teach_again is None and Waggle.objects.get(name=w.name).disabled


@pytest.mark.django_db
def test_settle_books_used_and_missed_heard_replays():
    teach("1")
    assert service.inbound("1", "a", "m", "id zoe_park_5150", FakeExec(), config=QUIET)
    service.settle("1", "a", [True], config=QUIET)
    assert service.inbound("1", "b", "m", "id ben_park_5151", FakeExec(), config=QUIET)
    service.settle("1", "b", [False], config=QUIET)
    used, missed = LedgerEntry.objects.get(session_key="a"), LedgerEntry.objects.get(session_key="b")
    assert (used.used_steps, used.fail, missed.used_steps, missed.fail) == (1, False, 0, True)
    assert not FiredPlan.objects.filter(settled=False).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("text", [None, "", 17, "\ud800\udfff\ud800 zoe_park_5150 \udc00", "x" * 10_000_000,
                                  "nul\x00byte zoe_park_5150 \x00",
                                  "zoe_park_5150 " + "y" * (MAX_TOKEN_CHARS + 5)])
def test_odd_messages_never_raise_and_are_stored(text):
    teach("1")
    got = service.inbound("1", "odd", "m", text, FakeExec(), config=QUIET)
    assert got is None or "zoe_park_5150" in got
    row = ForageCall.objects.filter(session_key="odd", tool=INBOUND_TOOL).get()
    assert all(len(value) <= MAX_TOKEN_CHARS + 2 for _, value in row.out_refs)
    service.sweep("1", config=QUIET)  # the stored message never breaks a later sweep


@pytest.mark.django_db
def test_messages_neither_break_nor_join_call_routes(cfg):
    """A message between calls is not a call: routes are mined and aligned across it."""
    from waggle_helpers import routine

    for m in ("m1", "m2", "m3"):
        for j, (tool, args) in enumerate(routine(m)):
            if j == 1:
                service.inbound("2", f"t-{m}", "x", f"please look at {m}", None, config=QUIET)
            service.observe("2", f"t-{m}", "x", tool, args, False, f"out {tool} {m}", config=QUIET)
    w = service.sweep("2", config=cfg)
    assert w is not None and not w.name.startswith("heard.") and w.length == 5
    service.observe("2", "live", "x", "list_dir", {"path": "m9"}, False, "o", config=cfg)
    service.inbound("2", "live", "x", "and now m9", None, config=cfg)
    service.observe("2", "live", "x", "grep", {"path": "m9", "pattern": "TODO"}, False, "o", config=cfg)
    assert service.follow("2", "live", FakeExec(), config=cfg) is not None


# --- joined inbound routes: the id the message names and the user's own record lists ------------
RESERVATIONS = ["K8TQ2Z", "JG7FMM", "P4XW9B", "Q0ZF0J", "OI5L9G", "AQLBTL"]
SOURCE = ("get_user_details", ("reservations", "*"))


def record(user, *listed):
    return Call.make("get_user_details", {"user_id": user}, output=json.dumps({"id": user, "reservations": list(listed)}))


def support(user, res, *, known_first):
    """A support session. ``known_first``: the user says who they are, the agent reads their
    record, then the user names one of the listed reservations and the agent looks it up. Else the
    user names the reservation before saying who they are, and the agent asks first (policy: it
    authenticates), and a flight number of the same shape goes to a search, never to a lookup."""
    look = Call.make("get_reservation_details", {"reservation_id": res}, output=json.dumps({"id": res}))
    if known_first:
        return [message_call(f"I am {user}."), record(user, "ZZ9ZZ9", res),
                message_call(f"Please check reservation {res}."), look]
    return [message_call(f"Help with reservation {res} please."), message_call(f"I am {user}."),
            record(user, res), look, message_call("Is flight HAT123 free?"),
            Call.make("search_direct_flight", {"origin": "JFK", "flight": "HAT123"}, output="[]")]


def joined_sessions():
    return ([support(u, r, known_first=True) for u, r in zip(USERS, RESERVATIONS)]
            + [support(u + "x", r[::-1], known_first=False) for u, r in zip(USERS, RESERVATIONS)])


def test_a_lookup_the_message_alone_does_not_vouch_for_is_joined_to_the_record_that_lists_it():
    heard = {h.tool: h for h in mine_heard(joined_sessions(), min_contexts=3, min_confidence=0.75, z=1.0,
                                           wilson=wilson_lower)}
    res = heard["get_reservation_details"]
    # judged where each join completed: at the message (known first) and at the record (named first)
    assert res.source == SOURCE and res.contexts == 12 and res.used == 12
    assert heard["get_user_details"].source == ()  # the message alone vouches for this one: plain
    # without a record that lists the ids, the same sessions vouch for no reservation lookup
    bare = [[c if c.tool != "get_user_details" else Call.make(c.tool, {k: decode_value(v) for k, v in c.args})
             for c in seg] for seg in joined_sessions()]
    assert "get_reservation_details" not in {h.tool for h in mine_heard(
        bare, min_contexts=3, min_confidence=0.75, z=1.0, wilson=wilson_lower)}


def test_a_joined_route_fires_only_on_a_value_the_record_listed():
    routes = [route_of(h) for h in mine_heard(joined_sessions(), min_contexts=3, min_confidence=0.75, z=1.0,
                                              wilson=wilson_lower)]
    res = next(r for r in routes if r.source)
    back = Route.from_json(json.loads(json.dumps(res.to_json())), name=res.name)
    assert back.source == SOURCE and "get_user_details.reservations[]" in render_script(back)
    known = [message_call("I am zoe_park_5150"), record("zoe_park_5150", "AB12CD", "EF34GH")]
    assert plan_heard(routes, known + [message_call("Look at EF34GH")])[1] == \
        ("get_reservation_details", (("reservation_id", '"EF34GH"'),))
    assert plan_heard(routes, known + [message_call("Look at XY56ZT")]) is None  # not this user's
    assert plan_heard(routes, known + [message_call("Flight HAT123 or EF34GH?")])[1][1] == \
        (("reservation_id", '"EF34GH"'),)  # a flight number is not a listed reservation: no rival
    assert plan_heard(routes, known + [message_call("AB12CD and EF34GH")]) is None  # two listed: no guess
    assert plan_heard(routes, [message_call("Look at EF34GH")]) is None  # no record yet: the agent asks first
    looked = known + [Call.make("get_reservation_details", {"reservation_id": "EF34GH"}), message_call("EF34GH")]
    assert plan_heard(routes, looked) is None  # already made


def test_a_joined_route_fires_at_the_record_that_lists_a_value_the_user_named_first():
    """The user names the reservation, then who they are; the agent reads their record first (its
    policy authenticates first): the join completes at that output, and the lookup is replayed
    there (before, only a message could complete it: nothing fired)."""
    routes = [route_of(h) for h in mine_heard(joined_sessions(), min_contexts=3, min_confidence=0.75, z=1.0,
                                              wilson=wilson_lower)]
    told = [message_call("Help with reservation EF34GH please."), message_call("I am zoe_park_5150.")]
    assert plan_heard(routes, told) is None  # two values wait: no guess at the message
    assert plan_joined(routes, told + [record("zoe_park_5150", "AB12CD", "EF34GH")])[1] == \
        ("get_reservation_details", (("reservation_id", '"EF34GH"'),))
    assert plan_joined(routes, told + [record("zoe_park_5150", "AB12CD")]) is None  # not this user's
    two = [message_call("EF34GH or AB12CD?"), message_call("I am zoe_park_5150.")]
    assert plan_joined(routes, two + [record("zoe_park_5150", "AB12CD", "EF34GH")]) is None  # two listed: no guess
    other = told + [Call.make("search_direct_flight", {"origin": "JFK"}, output=json.dumps({"reservations": ["EF34GH"]}))]
    assert plan_joined(routes, other) is None  # not the source's tool


def learn_joined(space):
    """The service records the joined sessions and mines them (the joined route is stored)."""
    for i, seg in enumerate(joined_sessions()):
        for c in seg:
            if is_message(c):
                service.inbound(space, f"t{i}", "m", " ".join(message_tokens(c)), None, config=QUIET)
            else:
                service.observe(space, f"t{i}", "m", c.tool, {k: decode_value(v) for k, v in c.args}, c.mutates,
                                json.dumps({"id": "x", "reservations": [decode_value(v) for p, v in c.refs
                                                                         if p[0] == "reservations"]})
                                if c.tool == "get_user_details" else "{}", config=QUIET)
    while service.sweep(space, config=QUIET) is not None:
        pass


@pytest.mark.django_db
def test_a_joined_route_is_replayed_by_follow_after_the_record():
    learn_joined("j")
    exe = FakeExec({"get_reservation_details": '{"id": "EF34GH", "flights": ["HAT001"]}'})
    assert service.inbound("j", "live", "m", "Help with reservation EF34GH please.", exe, config=QUIET) is None
    assert service.inbound("j", "live", "m", "I am zoe_park_5150.", exe, config=QUIET) is None
    service.observe("j", "live", "m", "get_user_details", {"user_id": "zoe_park_5150"}, False,
                    json.dumps({"id": "zoe_park_5150", "reservations": ["AB12CD", "EF34GH"]}), config=QUIET)
    block = service.follow("j", "live", exe, config=QUIET)
    assert block is not None and exe.calls == [("get_reservation_details", {"reservation_id": "EF34GH"})]
    fired = FiredPlan.objects.get(session_key="live")
    assert fired.name.startswith("heard.get_reservation_details")
    assert ForageCall.objects.filter(session_key="live", replayed=True).values_list("member_key", flat=True).get() == "m"


@pytest.mark.django_db
def test_a_joined_route_is_mined_and_replayed_by_the_service():
    learn_joined("j")
    stored = Waggle.objects.get(space_key="j", name__startswith="heard.get_reservation_details")
    assert stored.route["source"] == ["get_user_details", ["reservations", "*"]] and not stored.disabled
    exe = FakeExec({"get_user_details": '{"id": "zoe_park_5150", "reservations": ["AB12CD", "EF34GH"]}'})
    assert service.inbound("j", "live", "m", "I am zoe_park_5150", exe, config=QUIET) is not None
    assert service.inbound("j", "live", "m", "Please look at HAT123", exe, config=QUIET) is None
    block = service.inbound("j", "live", "m", "And reservation EF34GH?", exe, config=QUIET)
    assert block is not None and exe.calls[-1] == ("get_reservation_details", {"reservation_id": "EF34GH"})
