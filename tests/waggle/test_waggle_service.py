"""The host-facing service: recorder rows, periodic mining and promotion, replay through the
host's exec, the library calls, the ledger, best effort and space isolation."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from waggle import following, recording, service, sweeping
from waggle.config import WaggleConfig
from waggle.models import FiredPlan, ForageCall, LedgerEntry, Waggle
from waggle.service import WaggleError
from waggle_helpers import FakeExec, feed, noise, routine

pytestmark = pytest.mark.django_db


QUIET = WaggleConfig(mine_period=10_000)  # observe without periodic sweeps


def teach(space, cfg, modules=("m1", "m2", "m3"), session="s-teach"):
    """Walk the routine once per module (with a unique call in between), then sweep once."""
    for i, m in enumerate(modules):
        feed(space, session, routine(m) + noise(i), QUIET)
    w = service.sweep(space, config=cfg)
    assert w is not None and Waggle.objects.filter(space_key=space).count() == 1
    return w


def trigger(space, session, module, cfg):
    feed(space, session, routine(module)[:2], cfg)


# --- recorder ---------------------------------------------------------------------------------
def test_observe_records_calls(cfg):
    service.observe("1", "s1", "m1", "grep", {"pattern": "x", "path": 3}, False, "abcdefgh", config=cfg)
    service.observe("1", "s1", "m1", "write_file", {"path": "a", "content": "y" * 5000}, True, "ok", config=cfg)
    rows = list(ForageCall.objects.order_by("seq"))
    assert [(r.seq, r.tool, r.mutates) for r in rows] == [(1, "grep", False), (2, "write_file", True)]
    assert rows[0].args == {"path": 3, "pattern": "x"}  # JSON types kept
    assert rows[0].est_tokens == 2 and len(rows[0].out_hash) == 16
    assert len(rows[1].args["content"]) == 200  # a mutator is only a barrier: its body is not kept
    assert rows[0].space_key == "1" and rows[0].session_key == "s1" and rows[0].member_key == "m1"


def test_ring_is_bounded_and_resyncs_across_processes(cfg):
    small = WaggleConfig(ring_capacity=3, mine_period=1000)
    feed("1", "s1", [(f"t{i}", {}) for i in range(5)], small)
    ring = recording._rings[("1", "s1")]
    assert [c.tool for c in ring.recent()] == ["t2", "t3", "t4"] and ring.last_seq == 5
    # another process appends to the same session: this process notices and reloads
    ForageCall.objects.create(space_key="1", session_key="s1", seq=6, tool="t5", args={})
    assert [c.tool for c in recording._ring("1", "s1", small.normalized()).recent()] == ["t3", "t4", "t5"]


def test_waggle_tools_and_bad_keys_are_not_recorded(cfg):
    service.observe("1", "s1", "m1", "waggle_run", {"name": "x"}, False, "out", config=cfg)
    service.observe("", "s1", "m1", "grep", {}, False, "out", config=cfg)
    service.observe("1", None, "m1", "grep", {}, False, "out", config=cfg)  # type: ignore[arg-type]
    assert ForageCall.objects.count() == 0


def test_retention_bounds_the_forage_log(cfg):
    small = WaggleConfig(retention_calls=10, mine_period=4)
    feed("1", "s1", [(f"t{i}", {}) for i in range(30)], small)
    assert ForageCall.objects.filter(space_key="1").count() <= 10 + 4
    assert ForageCall.objects.order_by("-seq").first().seq == 30


# --- miner + promoter -------------------------------------------------------------------------
def test_mining_runs_every_mine_period_observations(cfg, monkeypatch):
    seen = []
    real = service.sweep
    monkeypatch.setattr(sweeping, "sweep", lambda space, config=None: seen.append(space) or real(space, config=config))
    feed("1", "s1", [(f"t{i}", {}) for i in range(24)], cfg)
    assert seen == ["1", "1", "1"]  # at 8, 16 and 24, never on every call
    seen.clear()
    feed("1", "s2", [(f"u{i}", {}) for i in range(6)], WaggleConfig(mine_period=1))
    assert len(seen) == 3  # a period below 2 is clamped to 2


def test_periodic_sweep_promotes_a_repeated_route(cfg):
    for i, m in enumerate(("m1", "m2", "m3", "m4")):
        feed("1", "s1", routine(m) + noise(i), cfg)  # 24 observations: sweeps at 8, 16, 24
    # the sweep at 16 saw the third occurrence half-walked (4 steps); the one at 24 the whole route
    assert sorted(Waggle.objects.values_list("length", flat=True)) == [4, 5]
    w = Waggle.objects.get(length=5)
    assert w.scope == "space" and w.space_key == "1" and not w.disabled and w.mined_count == 4
    assert w.route["steps"][0] == {"tool": "list_dir", "args": {}, "params": {"path": "path"}}
    assert w.script.startswith(f"# waggle {w.name}")
    # both agree on what comes next: the longer prediction is the one replayed
    exe = FakeExec()
    trigger("1", "s2", "fresh", cfg)
    assert service.follow("1", "s2", exe, config=cfg).startswith("[waggle: replayed 3 steps]")
    assert FiredPlan.objects.get(session_key="s2").name == w.name
    assert [t for t, _ in exe.calls] == ["read_file", "git_log", "blackboard_read"]


def test_one_new_waggle_per_sweep_with_content_stable_names(cfg):
    other = [("task_list", {"status": "open"}), ("task_get", {"id": "7"}), ("list_members", {})]
    for i, m in enumerate(("m1", "m2", "m3")):  # a route of literals varies by what it returned: three
        feed("1", f"s{i}", routine(m) + noise(i), QUIET)
        for tool, args in other:
            service.observe("1", f"s{i}", "m1", tool, args, False, f"{tool} in week {i}", config=QUIET)
        feed("1", f"s{i}", noise(10 + i), QUIET)
    first = service.sweep("1", config=cfg)
    assert first is not None and Waggle.objects.count() == 1
    second = service.sweep("1", config=cfg)
    assert second is not None and second.name != first.name and Waggle.objects.count() == 2
    assert service.sweep("1", config=cfg) is None and Waggle.objects.count() == 2
    # the same route in another space gets the same name
    w2 = teach("2", cfg, modules=("x", "y", "z"))
    assert w2.name == Waggle.objects.get(space_key="1", length=5).name


def test_a_mutator_inside_every_occurrence_blocks_the_route(cfg):
    quiet = QUIET
    for i, m in enumerate(("m1", "m2", "m3")):
        steps = routine(m)
        feed("1", "s1", steps[:2], quiet)
        feed("1", "s1", [("write_file", {"path": m})], quiet, mutates=True)
        feed("1", "s1", steps[2:] + noise(i), quiet)
    service.sweep("1", config=cfg)
    for w in Waggle.objects.all():
        tools = [s["tool"] for s in w.route["steps"]]
        assert not ({"list_dir", "grep"} <= set(tools) and "read_file" in tools)


def test_unreliable_trigger_is_not_stored(cfg):
    quiet = QUIET
    for i, m in enumerate(("m1", "m2", "m3")):
        feed("1", "s1", routine(m) + noise(i), quiet)
    for i, m in enumerate(("a", "b", "c", "d")):  # the same start, then something else
        feed("1", "s1", routine(m)[:2] + [("wc", {"path": m})] + noise(20 + i), quiet)
    w = service.sweep("1", config=cfg)
    # list_dir+grep is followed by the rest only 3 times in 7: the route needs a longer trigger
    assert w is not None and w.route["trigger"] == 3


# --- replay -----------------------------------------------------------------------------------
def test_follow_replays_the_tail_through_exec(cfg):
    w = teach("1", cfg)
    exe = FakeExec(answers={"read_file": "file body of Fresh42"})
    feed("1", "s2", routine("fresh")[:1], cfg)
    assert service.follow("1", "s2", exe, config=cfg) is None  # one matching step is not enough
    feed("1", "s2", routine("fresh")[1:2], cfg)
    block = service.follow("1", "s2", exe, config=cfg)
    assert block is not None
    assert block.splitlines()[0] == "[waggle: replayed 3 steps]"  # (the route is the ledger's: below)
    assert "file body of Fresh42" in block
    assert exe.calls == [("read_file", {"path": "fresh"}), ("git_log", {"limit": 5, "path": "fresh"}),
                         ("blackboard_read", {})]  # the int stays an int
    entry = LedgerEntry.objects.get()
    assert (entry.name, entry.steps, entry.fail, entry.space_key, entry.scope) == (w.name, 3, False, "1", "space")
    assert not entry.settled and entry.yield_tokens == 0  # booked only once the model's reply says so
    # the reply draws on the file's body only; the run ends: the other two steps were not used
    service.judge_reply("1", "s2", [("task_done", {"result": "Fresh42 fixed"})], config=cfg)
    service.end_run("1", "s2", config=cfg)
    entry.refresh_from_db()
    assert entry.settled and entry.used_steps == 1 and entry.yield_tokens > 0
    replayed = ForageCall.objects.filter(session_key="s2", replayed=True).order_by("seq")
    assert [r.tool for r in replayed] == ["read_file", "git_log", "blackboard_read"]


def test_once_per_plan_per_session_across_processes(cfg):
    teach("1", cfg)
    exe = FakeExec()
    trigger("1", "s2", "fresh", cfg)
    assert service.follow("1", "s2", exe, config=cfg) is not None
    recording._rings.clear()  # a different worker process runs the session's next turn
    trigger("1", "s2", "fresh", cfg)
    assert service.follow("1", "s2", exe, config=cfg) is None
    assert FiredPlan.objects.filter(session_key="s2").count() == 1
    trigger("1", "s2", "other", cfg)  # another concrete plan in the same session
    assert service.follow("1", "s2", exe, config=cfg) is not None
    trigger("1", "s3", "fresh", cfg)  # the same plan in another session
    assert service.follow("1", "s3", exe, config=cfg) is not None
    assert len(exe.calls) == 8  # "other" left out blackboard_read(): the session already has it


def test_follow_needs_a_read_only_last_call(cfg):
    teach("1", cfg)
    feed("1", "s2", routine("f")[:1], cfg)
    feed("1", "s2", routine("f")[1:2], cfg, mutates=True)
    assert service.follow("1", "s2", FakeExec(), config=cfg) is None


@pytest.mark.parametrize("broken", [{"fail_on": {"git_log"}}, {"empty_on": {"read_file"}}])
def test_exec_error_or_empty_output_is_a_recorded_failure(cfg, broken):
    w = teach("1", cfg)
    exe = FakeExec(**broken)
    trigger("1", "s2", "fresh", cfg)
    assert service.follow("1", "s2", exe, config=cfg) is None
    entry = LedgerEntry.objects.get()
    assert entry.fail and entry.yield_tokens == 0 and entry.name == w.name and entry.detail
    assert not ForageCall.objects.filter(replayed=True).exists()


def test_space_isolation(cfg):
    teach("A", cfg)
    exe = FakeExec()
    trigger("B", "sB", "fresh", cfg)
    assert service.follow("B", "sB", exe, config=cfg) is None
    assert exe.calls == []
    assert service.list_waggles("B") == []
    with pytest.raises(WaggleError):
        service.run_waggle("B", Waggle.objects.get().name, {"path": "x"}, exe)
    # B's own calls never mine A's route from A's calls
    assert service.sweep("B", config=cfg) is None


def test_global_waggle_fires_everywhere_and_disabled_never(cfg):
    w = teach("A", cfg)
    Waggle.objects.create(name=w.name, scope="global", space_key="", route=w.route, script=w.script, length=w.length)
    exe = FakeExec()
    trigger("C", "sC", "fresh", cfg)
    assert service.follow("C", "sC", exe, config=cfg) is not None
    assert LedgerEntry.objects.get().scope == "global"
    Waggle.objects.update(disabled=True)
    trigger("C", "sC2", "fresh", cfg)
    trigger("A", "sA2", "fresh", cfg)
    assert service.follow("C", "sC2", exe, config=cfg) is None
    assert service.follow("A", "sA2", exe, config=cfg) is None


# --- library ----------------------------------------------------------------------------------
def test_list_waggles(cfg):
    w = teach("1", cfg)
    trigger("1", "s2", "fresh", cfg)
    service.follow("1", "s2", FakeExec(answers={"read_file": "Alpha1", "git_log": "Beta22", "blackboard_read": "Gamma333"}),
                   config=cfg)
    assert service.list_waggles("1")[0]["stats"]["uses"] == 0  # not yet judged by the model's reply
    service.judge_reply("1", "s2", [], text="Alpha1, Beta22 and Gamma333.", config=cfg)  # it draws on all three
    [item] = service.list_waggles("1")
    assert item["name"] == w.name and item["scope"] == "space" and item["disabled"] is False
    assert item["stats"]["steps_replayed"] == 3 and item["stats"]["steps_used"] == 3
    assert item["steps"][0] == "list_dir(path={path})"
    assert item["params"] == {"path": "m3"}
    assert item["stats"]["uses"] == 1 and item["stats"]["fails"] == 0
    assert item["stats"]["est_tokens_saved"] > 0 and item["stats"]["yield_is_estimate"] is True


def test_run_waggle_on_demand(cfg):
    w = teach("1", cfg)
    exe = FakeExec()
    out = service.run_waggle("1", w.name, {"path": "pkg"}, exe)
    assert out.startswith(f"[waggle: ran waggle {w.name} \u2014 5 steps]")
    assert exe.calls[0] == ("list_dir", {"path": "pkg"}) and len(exe.calls) == 5
    entry = LedgerEntry.objects.get()
    assert entry.on_demand and not entry.fail and entry.steps == 5


@pytest.mark.parametrize("name,params,message", [
    ("nope", {}, "unknown waggle 'nope'"),
    (None, {}, "missing parameter(s): path"),
    (None, {"path": "x", "colour": "red"}, "unknown parameter(s): colour"),
])
def test_run_waggle_refuses_bad_requests(cfg, name, params, message):
    w = teach("1", cfg)
    exe = FakeExec()
    with pytest.raises(WaggleError) as err:
        service.run_waggle("1", name or w.name, params, exe)
    assert message in str(err.value)
    assert exe.calls == []


def test_run_waggle_refuses_a_disabled_waggle(cfg):
    w = teach("1", cfg)
    Waggle.objects.update(disabled=True)
    exe = FakeExec()
    with pytest.raises(WaggleError, match="disabled"):
        service.run_waggle("1", w.name, {"path": "x"}, exe)
    assert exe.calls == []


def test_run_waggle_step_failure(cfg):
    w = teach("1", cfg)
    with pytest.raises(WaggleError, match="exploded"):
        service.run_waggle("1", w.name, {"path": "x"}, FakeExec(fail_on={"read_file"}))
    assert LedgerEntry.objects.get().fail


def test_saved_tokens_per_day():
    now = timezone.now()
    for days_ago, tokens, fail, space in [(0, 100, False, "1"), (0, 50, False, "1"), (2, 7, False, "1"),
                                          (0, 999, True, "1"), (0, 999, False, "2"), (30, 999, False, "1")]:
        LedgerEntry.objects.create(name="w", scope="space", store_key=space, space_key=space, steps=2,
                                   yield_tokens=tokens, fail=fail, created=now - timedelta(days=days_ago))
    series = service.saved_tokens_per_day("1", days=5)
    today = timezone.localdate()
    assert [d for d, _ in series] == [today - timedelta(days=i) for i in range(4, -1, -1)]
    assert [v for _, v in series] == [0, 0, 7, 0, 150]
    assert len(service.saved_tokens_per_day("1")) == 14


# --- best effort --------------------------------------------------------------------------------
def test_exploding_exec_never_raises(cfg):
    teach("1", cfg)

    def exec_boom(tool, args):
        raise SystemError("host tool crashed")

    trigger("1", "s2", "fresh", cfg)
    assert service.follow("1", "s2", exec_boom, config=cfg) is None
    assert LedgerEntry.objects.get().fail


def test_db_errors_inside_observe_and_follow_do_not_raise_or_break_the_callers_transaction(cfg, monkeypatch):
    teach("1", cfg)

    def bad_sql(*args, **kwargs):
        with connection.cursor() as cur:
            cur.execute("SELECT * FROM waggle_no_such_table")

    with transaction.atomic():  # the host may be inside its own transaction
        monkeypatch.setattr(recording, "_record", bad_sql)
        service.observe("1", "s9", "m", "grep", {}, False, "x", config=cfg)
        monkeypatch.setattr(following, "_routes_for", bad_sql)
        assert service.follow("1", "s9", FakeExec(), config=cfg) is None
        # the caller's transaction is still usable (on PostgreSQL a failed statement would
        # otherwise poison it)
        assert Waggle.objects.count() == 1


def test_errors_in_sweep_are_swallowed_by_observe(cfg, monkeypatch):
    def boom(*a, **k):
        raise DatabaseError("disk full")

    monkeypatch.setattr(sweeping, "sweep", boom)
    feed("1", "s1", [(f"t{i}", {}) for i in range(8)], cfg)  # the 8th call triggers the sweep
    assert ForageCall.objects.count() == 8


def test_follow_with_no_waggles_or_unknown_session(cfg):
    assert service.follow("1", "nobody", FakeExec(), config=cfg) is None
    teach("1", cfg)
    assert service.follow("1", "nobody", FakeExec(), config=cfg) is None
    Waggle.objects.update(route={"garbage": True})
    trigger("1", "s2", "fresh", cfg)
    assert service.follow("1", "s2", FakeExec(), config=cfg) is None


def test_failed_sweep_inside_the_hosts_transaction_keeps_the_call(cfg, monkeypatch):
    def bad_sql(*args, **kwargs):
        with connection.cursor() as cur:
            cur.execute("SELECT * FROM waggle_no_such_table")

    monkeypatch.setattr(sweeping, "sweep", bad_sql)
    with transaction.atomic():
        feed("1", "s1", [(f"t{i}", {}) for i in range(8)], cfg)
        assert ForageCall.objects.count() == 8


@pytest.mark.django_db(transaction=True)
def test_end_to_end_in_autocommit_mode(cfg, monkeypatch):
    """The host usually calls waggle outside any transaction: the same rules hold there."""
    w = teach("1", cfg)
    exe = FakeExec()
    trigger("1", "s2", "fresh", cfg)
    assert service.follow("1", "s2", exe, config=cfg).startswith("[waggle: replayed ")
    assert FiredPlan.objects.get(session_key="s2").name == w.name
    trigger("1", "s2", "fresh", cfg)
    assert service.follow("1", "s2", exe, config=cfg) is None

    def bad_sql(*args, **kwargs):
        with connection.cursor() as cur:
            cur.execute("SELECT * FROM waggle_no_such_table")

    monkeypatch.setattr(following, "_routes_for", bad_sql)
    assert service.follow("1", "s2", exe, config=cfg) is None
    monkeypatch.setattr(recording, "_record", bad_sql)
    service.observe("1", "s2", "m", "grep", {}, False, "x", config=cfg)
    assert LedgerEntry.objects.filter(fail=False).count() == 1


def test_unbound_tail_never_fires_and_is_never_promoted(cfg):
    # the third step reads a file whose name the first two never show
    for i, m in enumerate(("m1", "m2", "m3", "m4")):
        feed("1", "s1", [("list_dir", {"path": m}), ("grep", {"path": m, "pattern": "x"}),
                         ("read_file", {"path": f"tmp/{i}.log"})] + noise(i), QUIET)
    assert service.sweep("1", config=cfg) is None
    assert not Waggle.objects.exists()
    # a stored route like that (e.g. written by hand) still never fires
    route = {"steps": [{"tool": "list_dir", "params": {"path": "path"}},
                       {"tool": "grep", "args": {"pattern": "x"}, "params": {"path": "path"}},
                       {"tool": "read_file", "params": {"path": "log"}}], "params": ["path", "log"]}
    Waggle.objects.create(name="unbound", space_key="1", route=route, script="# unbound", length=3)
    exe = FakeExec()
    feed("1", "s2", [("list_dir", {"path": "z"}), ("grep", {"path": "z", "pattern": "x"})], cfg)
    assert service.follow("1", "s2", exe, config=cfg) is None
    assert exe.calls == []
    # it can still be run on demand, with both parameters given
    assert service.run_waggle("1", "unbound", {"path": "z", "log": "a.log"}, exe).startswith("[waggle: ran waggle")
    assert exe.calls[-1] == ("read_file", {"path": "a.log"})


@pytest.mark.django_db(transaction=True)
def test_async_sweep_mines_off_the_turn_in_a_q2_task(monkeypatch):
    """With sweep_async the observing call only enqueues (after commit); a worker mines later."""
    from waggle import service
    from waggle.config import WaggleConfig

    enqueued = []
    monkeypatch.setattr(sweeping, "_enqueue_sweep", lambda key, interval: enqueued.append(key))
    cfg = WaggleConfig(mine_period=2, sweep_async=True).normalized()
    for i in range(4):
        service.observe("s-async", "sess", "m", "read_file", {"path": f"f{i % 2}"}, False, "out", config=cfg)
    assert enqueued == ["s-async", "s-async"]
    from waggle.models import Waggle

    assert not Waggle.objects.filter(space_key="s-async").exists()


def test_async_sweeps_share_one_broker_per_process(monkeypatch):
    """q2 would build a broker (for Redis: a connection and its handshake) for every enqueued sweep."""
    import django_q.tasks as tasks

    from waggle import service

    brokers = []
    monkeypatch.setattr(tasks, "async_task", lambda *args, **kwargs: brokers.append(kwargs["q_options"]["broker"]))
    sweeping._enqueue_sweep("1")
    sweeping._enqueue_sweep("2")
    assert len(brokers) == 2 and brokers[0] is not None and brokers[0] is brokers[1]


def test_the_default_config_follows_the_setting_and_is_memoized(settings):
    from waggle.config import WaggleConfig, default_config

    settings.WAGGLE = {"mine_period": 16}
    first = default_config()
    assert first.mine_period == 16 and default_config() is first
    settings.WAGGLE = {"mine_period": 1}  # out of range: normalized to the floor
    assert default_config().mine_period == 2
    odd = WaggleConfig(ring_capacity=-1, ignore_tools=["x"])  # unhashable as given: normalized all the same
    assert odd.normalized().ring_capacity == 200 and odd.normalized().ignore_tools == frozenset({"x"})
    assert WaggleConfig(k=4).normalized() is WaggleConfig(k=4).normalized().normalized()


def test_async_sweeps_of_a_space_are_at_most_one_per_interval_per_process(monkeypatch):
    """A busy space hit its mine period many times a second: the sweeps queued faster than workers ran
    them, and the members' wakes waited behind them."""
    import django_q.tasks as tasks

    from waggle import service

    clock = [1000.0]
    queued = []
    monkeypatch.setattr(sweeping.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(tasks, "async_task", lambda func, key, **kwargs: queued.append(key))
    for _ in range(5):
        sweeping._enqueue_sweep("busy", 2.0)
    sweeping._enqueue_sweep("other", 2.0)
    assert queued == ["busy", "other"]
    clock[0] += 2.0
    sweeping._enqueue_sweep("busy", 2.0)
    assert queued == ["busy", "other", "busy"]
