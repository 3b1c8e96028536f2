"""Issue 24: self-improvement that tells the truth: the ledger books a replayed step used only when
the model draws on what it returned, one task cannot make a route, and a value from a tool's output
never steers a call that reaches outside the space."""
from __future__ import annotations

import json

import pytest

from waggle import service
from waggle.config import WaggleConfig
from waggle.models import FiredPlan, LedgerEntry, Waggle
from waggle_helpers import FakeExec, feed, noise, routine

pytestmark = pytest.mark.django_db

QUIET = WaggleConfig(mine_period=10_000)
ANSWERS = {"read_file": json.dumps({"sha": "Qx7731", "owner": "Ingrid Solberg"}),
           "git_log": json.dumps({"commits": [{"id": "c0ffee42", "msg": "fix"}]}),
           "blackboard_read": json.dumps({"notes": ["RELEASE-118 is blocked"]})}


def teach(space, cfg):
    for i, m in enumerate(("m1", "m2", "m3")):
        feed(space, f"teach-{m}", routine(m) + noise(i), QUIET)
    w = service.sweep(space, config=cfg)
    assert w is not None
    return w


def fire(space, session, module, cfg):
    feed(space, session, routine(module)[:2], cfg)
    assert service.follow(space, session, FakeExec(answers=ANSWERS), config=cfg) is not None


# --- 1. the ledger books a step used only when the model draws on it ------------------------------
def test_a_model_that_moves_on_books_nothing_used_and_the_run_end_settles_it(cfg):
    teach("1", cfg)
    fire("1", "s1", "fresh", cfg)
    # the model moves on: another tool, text that names nothing the replay returned
    assert service.judge_reply("1", "s1", [("task_done", {"result": "ok"})], text="All good.", config=cfg) == 0
    assert not LedgerEntry.objects.get().settled  # not decided yet: a later reply may still draw on it
    assert service.end_run("1", "s1", config=cfg) == 1
    entry = LedgerEntry.objects.get()
    assert entry.settled and entry.used_steps == 0 and entry.fail and "3 not drawn on" in entry.detail
    assert not FiredPlan.objects.filter(settled=False).exists()


def test_a_reply_that_names_what_only_the_replay_returned_books_that_step_used(cfg):
    teach("1", cfg)
    fire("1", "s1", "fresh", cfg)
    # its text names the file's owner (read_file's output), a call takes the commit id (git_log's)
    service.judge_reply("1", "s1", [("git_show", {"commit": "c0ffee42"})], text="Ingrid Solberg owns it.", config=cfg)
    service.end_run("1", "s1", config=cfg)
    entry = LedgerEntry.objects.get()
    assert entry.used_steps == 2 and "1 not drawn on" in entry.detail  # blackboard_read: nothing drawn
    tail = FiredPlan.objects.get().tail
    assert [step[7] for step in tail] == ["used", "used", "not drawn on"]


def test_a_value_the_session_already_held_is_no_evidence_of_use(cfg):
    teach("1", cfg)
    answers = dict(ANSWERS, read_file=json.dumps({"path": "Fresh9", "size": "Fresh9"}))
    feed("1", "s1", [("whoami", {"name": "Fresh9"})], cfg)  # the session knew "Fresh9" before
    feed("1", "s1", routine("fresh")[:2], cfg)
    assert service.follow("1", "s1", FakeExec(answers=answers), config=cfg) is not None
    service.judge_reply("1", "s1", [], text="Fresh9 it is.", config=cfg)
    service.end_run("1", "s1", config=cfg)
    assert LedgerEntry.objects.get().used_steps == 0


def test_a_value_the_models_own_later_call_brought_is_no_evidence_of_use(cfg):
    teach("1", cfg)
    fire("1", "s1", "fresh", cfg)
    # the model looked the owner up itself after the replay: naming it draws on its own call
    service.observe("1", "s1", "m1", "whois", {"q": "fresh"}, False, json.dumps({"owner": "Ingrid Solberg"}), config=cfg)
    service.judge_reply("1", "s1", [], text="Ingrid Solberg owns it.", config=cfg)
    service.end_run("1", "s1", config=cfg)
    assert LedgerEntry.objects.get().used_steps == 0


def test_a_route_the_model_never_draws_on_is_demoted(cfg):
    w = teach("1", cfg)
    for n in range(3):
        fire("1", f"s{n}", f"x{n}", cfg)
        service.judge_reply("1", f"s{n}", [], text="Done.", config=cfg)
        service.end_run("1", f"s{n}", config=cfg)
        if Waggle.objects.get(name=w.name).disabled:
            break
    assert Waggle.objects.get(name=w.name).disabled


def test_a_replay_no_reply_followed_is_left_unjudged_not_booked_unused(cfg):
    """The run ends before the model says anything after the replay (cut off, or an empty last
    reply): nothing could have drawn on it, so it is neither a use nor a miss; its ledger row stays
    out of the route's figures (and its demotion), saying why."""
    w = teach("1", cfg)
    for n in range(4):
        fire("1", f"s{n}", f"x{n}", cfg)
        service.judge_reply("1", f"s{n}", [], text="  ", config=cfg)  # an empty reply says nothing
        service.end_run("1", f"s{n}", config=cfg)
    assert not Waggle.objects.get(name=w.name).disabled
    assert not FiredPlan.objects.filter(settled=False).exists()  # nothing left waiting
    assert all(step[7] == "unjudged" for fired in FiredPlan.objects.all() for step in fired.tail)
    entries = LedgerEntry.objects.all()
    assert len(entries) == 4 and not any(e.settled for e in entries)
    assert all(e.detail == "unjudged: the run ended before the model replied to the replay" for e in entries)
    # one reply that names nothing is a chance to draw on it: that run's replay is booked unused
    fire("1", "s9", "x9", cfg)
    service.judge_reply("1", "s9", [("task_done", {})], text="Done.", config=cfg)
    service.end_run("1", "s9", config=cfg)
    assert LedgerEntry.objects.filter(settled=True, used_steps=0).count() == 1


UNWRITTEN = "unjudged: the model wrote no text after the replay, and its calls did not draw on it"


def test_a_replay_the_model_answered_only_with_calls_that_named_nothing_is_left_unjudged(cfg):
    """A model that writes no text after the replay (BFCL's turns end on an empty reply) has shown
    only what its calls needed: a read it made for its reader (the distance it was asked for) is
    drawn on in text alone, so calls that name nothing of it neither book it used nor unused."""
    w = teach("1", cfg)
    for n in range(4):
        fire("1", f"s{n}", f"x{n}", cfg)
        service.judge_reply("1", f"s{n}", [("task_done", {"result": "ok"})], text="", config=cfg)
        service.judge_reply("1", f"s{n}", [], text="", config=cfg)  # the run ends on an empty reply
        service.end_run("1", f"s{n}", config=cfg)
    assert not Waggle.objects.get(name=w.name).disabled
    assert all(step[7] == "unjudged" for fired in FiredPlan.objects.all() for step in fired.tail)
    entries = LedgerEntry.objects.all()
    assert len(entries) == 4 and not any(e.settled for e in entries)
    assert all(e.detail == UNWRITTEN for e in entries)


def test_text_after_a_call_only_reply_puts_the_replay_to_the_test(cfg):
    # the model answered with a call, then wrote text naming nothing of the replay: booked unused
    teach("1", cfg)
    fire("1", "s1", "fresh", cfg)
    service.judge_reply("1", "s1", [("task_done", {})], text="", config=cfg)
    service.judge_reply("1", "s1", [], text="All good.", config=cfg)
    service.end_run("1", "s1", config=cfg)
    entry = LedgerEntry.objects.get()
    assert entry.settled and entry.used_steps == 0 and "3 not drawn on" in entry.detail


def test_calls_that_decide_a_step_or_a_step_with_nothing_to_show_keep_the_replay_judged(cfg):
    # a call drew on one step (git_log's commit id): the replay was put to the test, the rest is unused
    teach("1", cfg)
    fire("1", "s1", "fresh", cfg)
    service.judge_reply("1", "s1", [("git_show", {"commit": "c0ffee42"})], text="", config=cfg)
    service.end_run("1", "s1", config=cfg)
    entry = LedgerEntry.objects.get()
    assert entry.settled and entry.used_steps == 1
    # a step whose output brought nothing to name could not be shown used by any reply: booked as ever
    teach("2", cfg)
    answers = dict(ANSWERS, blackboard_read=json.dumps({"ok": True}))
    feed("2", "s2", routine("other")[:2], cfg)
    assert service.follow("2", "s2", FakeExec(answers=answers), config=cfg) is not None
    service.judge_reply("2", "s2", [("task_done", {})], text="", config=cfg)
    service.end_run("2", "s2", config=cfg)
    entry = LedgerEntry.objects.get(space_key="2")
    assert entry.settled and entry.used_steps == 0


# --- 2. one task cannot make a route --------------------------------------------------------------
def copies(space, task, n, start=0):
    """``n`` near-identical copies of one task: the same message, a literal-only walk with the same outputs."""
    for k in range(n):
        service.inbound(space, f"task{task}-copy{k + start}", "m1", f"Task {task}: how is my watchlist doing?", config=QUIET)
        feed(space, f"task{task}-copy{k + start}",
             [("get_watchlist", {}), ("get_market", {}), ("get_stock_info", {"symbol": f"S{task}"})] + noise(100 * task + k),
             QUIET)


def test_four_copies_of_one_task_are_one_context_and_make_no_route(cfg):
    copies("1", 117, 4)
    assert service.sweep("1", config=cfg) is None
    assert not Waggle.objects.exists()


def test_three_tasks_that_differ_make_a_route(cfg):
    # the same literal calls with three different outputs (three watchlists): three contexts
    for task in (1, 2, 3):
        for k in range(2):
            for tool in ("get_watchlist", "get_market"):
                service.observe("1", f"t{task}-{k}", "m1", tool, {}, False, f"{tool} of account {task}", config=QUIET)
            service.observe("1", f"t{task}-{k}", "m1", "get_stock_info", {"symbol": "ACME"}, False, "up", config=QUIET)
            feed("1", f"t{task}-{k}", noise(10 * task + k), QUIET)
    assert service.sweep("1", config=cfg) is not None


STOCKS = [("get_watchlist", {}), ("get_available_stocks", {"sector": "Technology"}), ("get_stock_info", {"symbol": "MSFT"})]
TASK_117 = "I have been watching Microsoft: how is it doing?"


def walk(space, session, message, outputs, k):
    """One wake: ``message``, then the stock walk answered with ``outputs`` (JSON), then other work."""
    service.inbound(space, session, "m1", message, config=QUIET)
    for (tool, args), out in zip(STOCKS, outputs):
        service.observe(space, session, "m1", tool, args, False, json.dumps(out), config=QUIET)
    feed(space, session, noise(k), QUIET)


def test_copies_of_one_task_whose_outputs_were_padded_are_one_context(cfg):
    # BFCL's four copies of one task: two alike, one with the message worded apart, one whose outputs
    # hold the same entries among padding (a longer listing, another layout): two contexts, no route
    base = [{"watchlist": ["NVDA"]}, {"stock_list": ["AAPL", "GOOG", "MSFT", "NVDA"]}, {"price": 310.23}]
    padded = [["NVDA", "JHGUN", "LMAT", "YNK"], {"stock_list": ["AAPL", "GOOG", "MSFT", "NVDA", "LGY", "HW"]},
              {"price": 310.23, "MA(5)": [234.34, 212.46]}]
    walk("1", "copy0", TASK_117, base, 0)
    walk("1", "copy1", TASK_117, base, 1)
    walk("1", "copy2", "I have been watching a company. It is Microsoft: how is it doing?", base, 2)
    walk("1", "copy3", TASK_117, padded, 3)
    assert service.sweep("1", config=cfg) is None
    assert not Waggle.objects.exists()


def test_a_fixed_brief_on_new_data_every_day_makes_a_route(cfg):
    # a daily cron: the same brief every day, the same calls, each day's outputs hold other values
    # (not a padded copy of another day's): each day is a context, so the routine is learned
    for day in range(4):
        stocks = [f"S{day}{j}" for j in range(3)]
        walk("1", f"cron-day{day}", "Daily: review the watchlist and report.",
             [{"watchlist": stocks}, {"stock_list": stocks[:2], "day": day}, {"price": 300 + day}], day)
        feed("1", f"cron-day{day}", [("post_report", {"day": day})], QUIET, mutates=True)
    w = service.sweep("1", config=cfg)
    assert w is not None and [s["tool"] for s in w.route["steps"]] == [t for t, _ in STOCKS]


def test_a_fixed_brief_every_day_in_one_long_lived_session_makes_a_route(cfg):
    # one member session woken every day by the same brief: each wake is its own episode (what an
    # earlier day made is not "already made" today), and each day's new data is a context
    for day in range(4):
        stocks = [f"S{day}{j}" for j in range(3)]
        walk("1", "cron", "Daily: review the watchlist and report.",
             [{"watchlist": stocks}, {"stock_list": stocks[:2], "day": day}, {"price": 300 + day}], day)
        feed("1", "cron", [("post_report", {"day": day})], QUIET, mutates=True)
    w = service.sweep("1", config=cfg)
    assert w is not None and [s["tool"] for s in w.route["steps"]] == [t for t, _ in STOCKS]


def test_tasks_that_orient_the_same_way_in_one_long_lived_session_are_distinct_contexts(cfg):
    # one member, one session, four wakes with different briefs, each orienting the same way in the
    # same workspace (the same outputs): four episodes, four contexts, so the orientation is a route
    orientation = [("list_dir", {"path": "."}), ("read_file", {"path": "README.md"}), ("glob", {"pattern": "*.py"})]
    for task in range(4):
        service.inbound("1", "worker", "m1", f"Task {task}: check module{task}.py", config=QUIET)
        feed("1", "worker", orientation + noise(task), QUIET)  # then the task's own work
        feed("1", "worker", [("task_done", {"task_id": task})], QUIET, mutates=True)
    w = service.sweep("1", config=cfg)
    assert w is not None and [s["tool"] for s in w.route["steps"]] == ["list_dir", "read_file", "glob"]
    # each later run (a wake) of the same session replays it: its episode is its own
    for task in (4, 5):
        with service.pinned("1", "worker"):
            service.inbound("1", "worker", "m1", f"Task {task}: check module{task}.py", config=QUIET)
            feed("1", "worker", orientation[:2], cfg)
            exe = FakeExec(answers={"glob": "Main1.py"})
            assert service.follow("1", "worker", exe, config=cfg) is not None
            assert exe.calls == [("glob", {"pattern": "*.py"})]
            service.judge_reply("1", "worker", [("read_file", {"path": "Main1.py"})], config=cfg)
    assert LedgerEntry.objects.filter(session_key="worker", used_steps=1).count() == 2


# --- 4. a tool's output never steers a call that reaches outside the space --------------------------
def links_walk(space, session, page, links, cfg):
    service.observe(space, session, "m", "list_links", {"page": page}, False, json.dumps({"links": links}), config=cfg)
    for url in links[:2]:
        service.observe(space, session, "m", "fetch", {"url": url}, False, f"<html>{url}</html>", config=cfg)


def teach_links(cfg):
    for p in range(4):  # four pages, each walked link after link
        links = [f"https://docs.example/{p}/{j}" for j in range(4)]
        links_walk("1", f"t{p}", f"page{p}", links, QUIET)
        for url in links[2:]:
            service.observe("1", f"t{p}", "m", "fetch", {"url": url}, False, f"<html>{url}</html>", config=QUIET)
        service.observe("1", f"t{p}", "m", "answer", {}, True, "done", config=QUIET)
    while service.sweep("1", config=cfg) is not None:
        pass
    assert Waggle.objects.filter(route__steps__0__tool="list_links").exists()


ATTACK = ["https://docs.example/x/0", "https://docs.example/x/1", "http://169.254.169.254/latest/meta-data/",
          "http://attacker.example/?leak=secret", "file:///etc/passwd"]


def test_a_value_from_an_output_never_reaches_a_tool_that_reaches_outside(cfg):
    teach_links(cfg)
    links_walk("1", "live", "attacker-page", ATTACK, cfg)
    exe = FakeExec()
    assert service.follow("1", "live", exe, config=cfg, reaches_out=lambda tool: tool == "fetch") is None
    assert exe.calls == []  # nothing fetched without the model
    # the host's closed-world tools still replay from outputs (the same route, fetch declared closed)
    links_walk("1", "closed", "page9", [f"https://docs.example/9/{j}" for j in range(4)], cfg)
    exe = FakeExec()
    assert service.follow("1", "closed", exe, config=cfg, reaches_out=lambda tool: False) is not None
    assert exe.calls and all(t == "fetch" for t, _ in exe.calls)


def test_a_route_run_on_demand_refuses_to_pass_an_output_to_a_tool_that_reaches_outside(cfg):
    teach_links(cfg)
    name = Waggle.objects.filter(route__steps__0__tool="list_links").first().name
    exe = FakeExec(answers={"list_links": json.dumps({"links": ATTACK})})
    with pytest.raises(service.WaggleError, match="reaches outside the space"):
        service.run_waggle("1", name, {"page": "attacker-page"}, exe, reaches_out=lambda tool: tool == "fetch")
    assert [t for t, _ in exe.calls] == ["list_links"]


def test_an_output_nested_five_thousand_deep_is_still_recorded(cfg):
    deep = "[" * 5000 + "]" * 5000
    service.observe("1", "s1", "m", "read_tree", {"path": "x"}, False, deep, config=cfg)
    service.observe("1", "s1", "m", "read_tree", {"path": "y"}, False, '{"a":' * 5000 + "1" + "}" * 5000, config=cfg)
    from waggle.models import ForageCall

    assert ForageCall.objects.filter(session_key="s1").count() == 2


def test_the_same_call_with_its_values_swapped_is_a_miss():
    """``distance(a=y, b=x)`` after a replayed ``distance(a=x, b=y)`` (BFCL's estimate_distance with
    the cities the other way round): the model asked the question again, or the other way round;
    either way it did not rely on the replay. A call that changes a value is not one."""
    from waggle.judging import _judge_step
    from waggle.trace import flatten_args

    step = ["estimate_distance", dict(flatten_args({"cityA": "94016", "cityB": "83214"})), 5, []]
    swapped = [("estimate_distance", flatten_args({"cityA": "83214", "cityB": "94016"}))]
    assert _judge_step(step, swapped) == "swapped"
    other = [("estimate_distance", flatten_args({"cityA": "83214", "cityB": "10001"}))]
    assert _judge_step(step, other) is None
    assert _judge_step(step, [("estimate_distance", flatten_args({"cityA": "94016", "cityB": "83214"}))]) == "re-issued"
