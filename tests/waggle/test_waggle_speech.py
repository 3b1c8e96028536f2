"""Issue 24 point 1, silent reads: the judge books as many silent replayed steps used as the
model's measured silence about its own reads accounts for (waggle.speech), per route and per
tool, and never for a replay nothing was drawn on."""
from __future__ import annotations

import json

import pytest

from waggle import service, speech
from waggle.config import WaggleConfig
from waggle.models import LedgerEntry, Waggle
from waggle_helpers import FakeExec, feed, noise, routine

pytestmark = pytest.mark.django_db

QUIET = WaggleConfig(mine_period=10_000)


@pytest.fixture
def cfg():
    # a lenient bar (a third of the steps used keeps a route): these runs leave two of three steps silent
    return WaggleConfig(mine_period=8, min_len=2, max_len=6, k=3, min_prefix=2, min_confidence=0.2)
ANSWERS = {"read_file": "Body1 of the file", "git_log": "commit Log22", "blackboard_read": "note Board333"}


def teach(cfg):
    for i, m in enumerate(("m1", "m2", "m3")):
        feed("1", f"teach-{m}", routine(m) + noise(i), QUIET)
    w = service.sweep("1", config=cfg)
    assert w is not None
    return w


def run(cfg, n, *, named_own: int, own: int = 2, reply: str = "Body1 it is") -> LedgerEntry:
    """One run: the replay fires (read_file, git_log, blackboard_read), the model makes ``own``
    reads of its own and names ``named_own`` of them, its reply draws on what ``reply`` names."""
    session = f"run{n}"
    feed("1", session, routine(f"x{n}")[:2], cfg)
    assert service.follow("1", session, FakeExec(answers=ANSWERS), config=cfg) is not None
    service.judge_reply("1", session, [], text="looking", config=cfg)
    for k in range(own):
        service.observe("1", session, "m", "read_file", {"path": f"own{n}_{k}"}, False, json.dumps({"body": f"Secret{n}x{k}Q"}), config=cfg)
    said = " ".join(f"Secret{n}x{k}Q" for k in range(named_own))
    service.judge_reply("1", session, [], text=f"{reply} {said}", config=cfg)
    service.end_run("1", session, config=cfg)
    return LedgerEntry.objects.filter(session_key=session).get()


def test_a_model_that_names_half_its_reads_gets_a_silent_step_booked_for_each_one_it_named(cfg):
    teach(cfg)
    first = [run(cfg, n, named_own=1) for n in range(2)]  # 4 reads of its own watched, 2 named
    assert [e.used_steps for e in first] == [1, 1]  # (too few watched for a measure: silence is unused)
    assert speech.rate("1", "read_file") == (4, 2)
    later = run(cfg, 2, named_own=1)  # its own 2 reads make 6 watched, 3 named: half
    assert speech.rate("1", "read_file") == (6, 3)
    assert later.used_steps == 2  # read_file drawn on; one silent step (git_log) booked used with it
    assert "1 not drawn on" in later.detail


def test_a_model_that_names_every_read_gets_no_credit_for_silence(cfg):
    teach(cfg)
    entries = [run(cfg, n, named_own=2) for n in range(5)]
    assert [e.used_steps for e in entries] == [1] * 5


def test_a_replay_nothing_was_drawn_on_gets_no_credit_and_its_route_is_still_demoted(cfg):
    w = teach(cfg)
    for n in range(3):
        run(cfg, n, named_own=1)
    misses = []
    for n in range(3, 12):
        if Waggle.objects.get(name=w.name).disabled:
            break
        misses.append(run(cfg, n, named_own=1, reply="no idea"))
    assert misses and all(e.used_steps == 0 and e.fail for e in misses)  # (the run's measure lends it nothing)
    assert Waggle.objects.get(name=w.name).disabled


def test_credit_stays_within_the_route_whose_steps_were_drawn_on():
    speech.forget()
    for n in range(3):  # read_file: 6 watched, 2 named
        st = speech._session("s", f"w{n}")
        st.heard["read_file"] = [2, 1 if n < 2 else 0]
        assert speech.credit("s", f"w{n}", {}) == {}
    assert speech.rate("s", "read_file") == (6, 2)
    speech.booked("s", "run", "A", drawn={"read_file": 1})
    got = speech.credit("s", "run", {"A": 5, "B": 5})
    assert got == {"A": 2}  # 1 drawn / (2 of 6 named): 2 more used in silence, on A only
    speech.booked("s", "run2", "A", drawn={"git_log": 3})  # a tool never watched: no measure, no credit
    assert speech.credit("s", "run2", {"A": 5}) == {}


def test_a_tool_that_answers_in_plain_text_is_measured_like_one_that_answers_in_json(cfg):
    """Its own reads' specific words are watched (the ring keeps a text's words): before, a text
    read brought no evidence, was never watched, and its tool's silence stayed unused."""
    teach(cfg)
    for n in range(3):
        session = f"text{n}"
        feed("1", session, routine(f"x{n}")[:2], cfg)
        assert service.follow("1", session, FakeExec(answers=ANSWERS), config=cfg) is not None
        service.judge_reply("1", session, [], text="looking", config=cfg)
        for k in range(2):
            service.observe("1", session, "m", "read_file", {"path": f"own{n}_{k}"}, False,
                            f"The file opens. It calls Secret{n}x{k}Q and returns.", config=cfg)
        service.judge_reply("1", session, [], text=f"Body1 it is, Secret{n}x0Q", config=cfg)
        service.end_run("1", session, config=cfg)
    assert speech.rate("1", "read_file") == (6, 3)  # (not "The" nor "It": grammar, not evidence)


def test_the_reads_since_the_last_reply_before_a_replay_are_watched_too(cfg):
    """The model's own read that triggered the replay (no reply had seen its output yet) is a
    witness: a tool the replay stands in for is otherwise rarely read by the model after it."""
    teach(cfg)
    session = "before"
    service.judge_reply("1", session, [], text="starting", config=cfg)  # nothing waits: the reply is noted
    service.observe("1", session, "m", "list_dir", {"path": "x9"}, False, json.dumps({"entries": ["Dir9Q"]}), config=cfg)
    service.judge_reply("1", session, [("grep", {"path": "x9", "pattern": "TODO"})], text="", config=cfg)
    service.observe("1", session, "m", "grep", {"path": "x9", "pattern": "TODO"}, False,
                    json.dumps({"hits": ["Hit9Q"]}), config=cfg)
    assert service.follow("1", session, FakeExec(answers=ANSWERS), config=cfg) is not None
    service.judge_reply("1", session, [], text="Hit9Q and Body1", config=cfg)
    service.end_run("1", session, config=cfg)
    assert speech.rate("1", "grep") == (1, 1)  # read after the last reply, named after the replay
    assert speech.rate("1", "list_dir") == (0, 0)  # read before it: the earlier reply saw it already


def test_a_step_booked_used_unnamed_that_a_later_reply_names_counts_as_drawn_on():
    """A witness counts as named when any later reply of the run names it; a replayed step booked
    used before it was named (walked past, walk continued) that a later reply names must count the
    same way, or the rate measured on witnesses is applied to a population it was not measured on
    and the credit for silent steps comes out short."""
    from waggle.recorder import Recorder
    speech.forget()
    for n in range(3):  # read_file: 6 watched, 3 named
        st = speech._session("s", f"w{n}")
        st.heard["read_file"] = [2, 1]
        assert speech.credit("s", f"w{n}", {}) == {}
    ring = Recorder()
    speech.booked("s", "run", "A", drawn={"read_file": 1}, inferred=1,
                  unnamed=[("read_file", ["Body77"], 0, set())])
    speech.watch("s", "run", ring, None, set(), "the fix is in Body77")  # a later reply names the inferred step
    # 2 drawn at a rate of 1/2: 2 more used in silence, none owed to the inferred one (it was named)
    assert speech.credit("s", "run", {"A": 5}) == {"A": 2}
    speech.booked("s", "run2", "A", drawn={"read_file": 1}, inferred=1,
                  unnamed=[("read_file", ["Body88"], 0, set())])
    speech.watch("s", "run2", ring, None, set(), "done")  # never named: stays inferred, counted against the owed
    assert speech.credit("s", "run2", {"A": 5}) == {}
