"""Issue 24 point 5, more of what is replayable: a heard value whose length varied is not held to
the lengths seen, the parts of an address are heard, and a route many contexts vouched for is not
demoted by one early miss (its mined evidence counts with the live ledger)."""
from __future__ import annotations

import pytest

from waggle import service
from waggle.config import WaggleConfig
from waggle.inbound import TokenShape, tokens
from waggle.models import LedgerEntry, Waggle
from waggle.route import mined_prior
from waggle_helpers import FakeExec, teach_heard

QUIET = WaggleConfig(mine_period=10_000)
USERS = ["mia_li_3668", "noah_smith_1234", "ava_kim_2020", "liam_wu_7781", "emma_roy_4410", "omar_haddad_9001"]


def teach(space):
    return teach_heard(space, USERS, QUIET)


def replayed(block):
    return block is not None and "get_user_details" in block


# --- shapes and tokens (pure) ---------------------------------------------------------------------
def test_a_length_that_varied_is_widened_by_its_spread_and_a_fixed_one_is_kept():
    names = TokenShape.learn(["ava_kim_2020", "noah_smith_1234"])  # 12 and 15 characters
    assert (names.lo, names.hi) == (9, 18)
    assert names.fits("olivia_gonzal_23") and names.fits("mia_li_36")  # 16 and 9: as likely as those seen
    assert not names.fits("mohamed_hernandez_5188")  # 22: well past the spread
    codes = TokenShape.learn(["JG7FMM", "H8Q05L", "SI5UKW"])  # every one 6 characters: a property
    assert (codes.lo, codes.hi) == (6, 6) and not codes.fits("JG7FMMX") and not codes.fits("JG7FM")


def test_the_parts_of_an_address_are_tokens_too():
    assert tokens("Sure, my email is mia_li_3668@example.com.") == \
        ["Sure", "my", "email", "is", "mia_li_3668@example.com", "mia_li_3668", "example.com"]
    assert tokens("@ mia@") == ["@", "mia@", "mia"]  # (empty parts are no tokens)


# --- through the service ----------------------------------------------------------------------
@pytest.mark.django_db
def test_a_user_id_longer_than_those_learned_from_is_still_heard():
    teach("1")
    block = service.inbound("1", "live", "m", "I know my user ID, it's olivia_gonzalez_2305.", FakeExec(), config=QUIET)
    assert replayed(block) and "olivia_gonzalez_2305" in block


@pytest.mark.django_db
def test_an_email_address_brings_its_local_part_to_the_lookup():
    teach("1")
    block = service.inbound("1", "live", "m", "My email address is zoe_park_5150@example.com.", FakeExec(), config=QUIET)
    assert replayed(block) and 'user_id="zoe_park_5150"' in block


def miss_once(space, session, user):
    assert replayed(service.inbound(space, session, "m", f"id {user}", FakeExec(), config=QUIET))
    service.judge_reply(space, session, [("get_user_details", {"user_id": user})], config=QUIET)  # made again: a miss


def taught_as_mined_on(contexts, confidence):
    """The inbound route, as if mining had vouched for it over ``contexts`` at that lower bound."""
    w = teach("1")
    data = dict(Waggle.objects.get(name=w.name).route, contexts=contexts, confidence=confidence)
    Waggle.objects.filter(name=w.name).update(route=data)
    miss_once("1", "s0", "zed_quinn_1000")
    return w


@pytest.mark.django_db
def test_one_early_miss_does_not_demote_a_route_many_contexts_vouched_for():
    w = taught_as_mined_on(18, 0.85)
    assert LedgerEntry.objects.filter(fail=True).count() == 1
    assert not Waggle.objects.get(name=w.name).disabled  # 1 miss against 15 contexts past the bar
    for i in range(1, 12):  # misses that keep coming outweigh them
        miss_once("1", f"s{i}", f"zed_quinn_{1000 + i}")
        if Waggle.objects.get(name=w.name).disabled:
            break
    assert Waggle.objects.get(name=w.name).disabled and 1 < i < 12


@pytest.mark.django_db
def test_a_route_stored_at_the_bar_has_no_evidence_to_spare():
    w = taught_as_mined_on(3, 0.75)
    assert Waggle.objects.get(name=w.name).disabled


def test_the_mined_prior_reads_a_stored_route_and_nothing_else():
    assert mined_prior({"contexts": 18, "confidence": 0.85}, 3) == (15.0, 15 * 0.85)
    assert mined_prior({"contexts": 2, "confidence": 0.9}, 3) == (0.0, 0.0)
    assert mined_prior({"contexts": "x"}, 3) == (0.0, 0.0) and mined_prior(None, 3) == (0.0, 0.0)
