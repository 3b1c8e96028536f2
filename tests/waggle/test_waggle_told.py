"""A route's values that its episodes told (waggle.told): a literal the learning messages named,
one the trigger's outputs held, parameters the messages named in an order. Such a route fires only
where the current episode tells the same."""
from __future__ import annotations

import re

import json

import pytest

from waggle import service
from waggle.config import WaggleConfig
from waggle.models import Waggle
from waggle.route import Route
from waggle.told import Told, ToldTally, words_of
from waggle_helpers import FakeExec

pytestmark = pytest.mark.django_db

QUIET = WaggleConfig(mine_period=10_000)


def episode(session, message, calls, cfg):
    """A wake: ``message``, then each (tool, args, output as JSON)."""
    if message is not None:
        service.inbound("1", session, "m1", message, config=cfg)
    for tool, args, out in calls:
        service.observe("1", session, "m1", tool, args, False, json.dumps(out), config=cfg)


def learn(cfg):
    w = service.sweep("1", config=cfg)
    assert w is not None
    return Route.from_json(w.route)


def fires(session, message, calls, cfg):
    episode(session, message, calls, cfg)
    return service.follow("1", session, FakeExec(), config=cfg) is not None


def stock_walk(i, symbol, watchlist=None):
    return [("get_watchlist", {}, {"watchlist": watchlist or [f"S{i}"]}), ("get_market", {}, {"market": f"open {i}"}),
            ("get_stock_info", {"symbol": symbol}, {"price": 100 + i})]


# --- a literal the messages named -------------------------------------------------------------------
def test_a_literal_the_messages_named_replays_only_on_a_message_that_names_it(cfg):
    for i in range(4):  # four users ask about MSFT (other watchlists: four contexts)
        walk = stock_walk(i, "MSFT") + [(f"noise_{i}", {"n": i}, {})]
        episode(f"t{i}", f"User {i} here: how is MSFT doing today?", walk, QUIET)
    route = learn(cfg)
    assert route.told.named == ('"MSFT"',)
    assert '# replays "MSFT" only when the message names it' in Waggle.objects.get().script
    # a user asking about NVDA is not answered with MSFT
    assert not fires("nvda", "Bring up information on 'NVDA', please.", stock_walk(9, "MSFT")[:2], cfg)
    assert fires("msft", "And msft, how is it?", stock_walk(8, "MSFT")[:2], cfg)


# --- a literal the trigger's outputs held -----------------------------------------------------------
def test_a_literal_the_outputs_held_replays_only_when_the_outputs_hold_it(cfg):
    for i in range(4):  # each watchlist lists QUAS (among others): the agent looks QUAS up
        episode(f"t{i}", None, stock_walk(i, "QUAS", ["QUAS", f"S{i}"]) + [(f"noise_{i}", {"n": i}, {})], QUIET)
    route = learn(cfg)
    assert route.told.held == ('"QUAS"',) and not route.told.named
    assert not fires("other", None, stock_walk(9, "QUAS", ["NVDA", "ZETA"])[:2], cfg)
    assert fires("same", None, stock_walk(8, "QUAS", ["QUAS", "ZETA"])[:2], cfg)


# --- parameters the messages named in an order ------------------------------------------------------
CITIES = [("Rivermist", "83214"), ("San Francisco", "94016"), ("Stonebrook", "74532"), ("Silverpine", "62947"),
          ("Oakendale", "47329")]


def trip(first, second):
    (a, za), (b, zb) = first, second
    return [("get_zipcode", {"city": a}, {"zipcode": za}), ("get_zipcode", {"city": b}, {"zipcode": zb}),
            ("estimate_distance", {"cityA": za, "cityB": zb}, {"distance": 100})]


def test_parameters_the_messages_named_in_an_order_do_not_fire_when_named_the_other_way(cfg):
    for i in range(4):  # the cities are looked up in the order the message names them
        a, b = CITIES[i], CITIES[i + 1]
        episode(f"t{i}", f"How far is it from {a[0]} to {b[0]}?", trip(a, b) + [(f"noise_{i}", {"n": i}, {})], QUIET)
    route = learn(cfg)
    assert route.told.order == (("city", "city2"),)
    # "from Rivermist to San Francisco", looked up the other way round: the distance is wanted the other way
    sf, rivermist = CITIES[1], CITIES[0]
    assert not fires("swapped", "Plan a trip from Rivermist to San Francisco.", trip(sf, rivermist)[:2], cfg)
    assert fires("same", "Plan a trip from San Francisco to Rivermist.", trip(sf, rivermist)[:2], cfg)
    assert fires("silent", "Plan my trip.", trip(sf, rivermist)[:2], cfg)  # nothing named: nothing against it
    # the agent acts on every message received since its last call: together they name the order
    service.inbound("1", "two", "m1", "My trip starts from Rivermist.", config=cfg)
    assert not fires("two", "I'm going to San Francisco.", trip(sf, rivermist)[:2], cfg)


# --- the rules themselves -----------------------------------------------------------------------------
def test_what_is_told_is_what_the_contexts_told_and_survives_storage():
    tally = ToldTally()
    for i, msg in enumerate(["how is MSFT", "MSFT please", "and MSFT again"]):
        tally.add(words_of(msg.split()), ['"MSFT"', "5"], {}, (), {'"MSFT"'} if i == 0 else set())
    told = tally.told()
    assert told.named == ('"MSFT"',) and told.held == ()  # held in 1 of 3: not enough; a number: never
    assert Told.from_json(told.to_json()) == told
    assert Told.from_json("garbage") == Told() and not Told()


def test_a_literal_read_once_when_the_message_did_not_name_it_is_a_constant_of_the_work():
    # the demo's workers open docs/design.md on every task; most briefs happened to name it, one did not
    tally = ToldTally()
    for msg in ["read docs/design.md first", "see docs/design.md", "follow docs/design.md", "find TODO notes"]:
        tally.add(words_of(re.findall(r"\S+", msg)), ['"docs/design.md"'], {}, ())
    assert tally.told().named == ()
