"""What waggle reads for a pinned run (issue 25, "a fleet on few hosts"): nothing for a session the host
just opened (its ring is known empty, no replay waits), the space's routes once per process for a few
seconds (a write in this process is seen at once), and no FiredPlan read when this process left the
session with nothing waiting and nobody appended since. The rows written are the same as before."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from waggle import recording, routecache, service
from waggle.config import WaggleConfig
from waggle.models import FiredPlan, ForageCall, Waggle
from waggle.route import Route, Step
from tests.harness import round_trips

pytestmark = pytest.mark.django_db

QUIET = WaggleConfig(mine_period=10_000)


def reads(queries, table: str) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT") and f'"{table}"' in q["sql"]]


def route(tag: str = "a") -> Route:
    r = Route(steps=(Step("list_dir", binds=(("path", "path"),)), Step("grep", binds=(("path", "path"),),
                     literals=(("pattern", tag),)), Step("read_file", binds=(("path", "path"),))), params=("path",))
    return Route(steps=r.steps, params=r.params, name=r.stable_name())


def store(r: Route, space="1", scope="space") -> Waggle:
    """A route written and committed (the test's transaction never commits: its hooks run here)."""
    from django.test import TestCase

    with TestCase.captureOnCommitCallbacks(execute=True):
        return Waggle.objects.create(name=r.name, scope=scope, space_key=space if scope == "space" else "",
                                     route=r.to_json(), length=len(r.steps))


def a_run(session: str, *, new: bool, space="1"):
    """A run as the host makes one: the wake's message, a reply with a call, the call, a final reply."""
    with service.pinned(space, session, new=new):
        service.ready(space, session, config=QUIET)
        service.inbound(space, session, "m1", "list the folder", lambda n, a: "x", config=QUIET)
        service.judge_reply(space, session, [("list_dir", {"path": "."})], text="", config=QUIET)
        service.observe(space, session, "m1", "list_dir", {"path": "."}, False, "a.txt", config=QUIET)
        assert service.follow(space, session, lambda n, a: "x", config=QUIET) is None
        service.judge_reply(space, session, [], text="done", config=QUIET)
        service.end_run(space, session, config=QUIET)


def test_a_new_session_costs_only_its_inserts():
    routecache.routes("1", lambda key: [])  # the space's routes are held already (another run loaded them)
    with round_trips() as sent:
        a_run("s-new", new=True)
    assert len(sent) == 2, "\n".join(s[:90] for s in sent)  # the message's INSERT and the call's (their savepoints ride)
    assert all("INSERT INTO \"waggle_foragecall\"" in s and "SELECT" not in s for s in sent)
    rows = list(ForageCall.objects.filter(session_key="s-new").order_by("seq").values_list("seq", "tool"))
    assert rows == [(1, "(inbound message)"), (2, "list_dir")]


def test_an_old_session_still_reads_its_ring_and_what_waits():
    ForageCall.objects.create(space_key="1", session_key="s-old", member_key="m1", seq=1, tool="read_file", args={},
                              mutates=False, out_hash="h", est_tokens=1)  # an earlier run, in another process
    with CaptureQueriesContext(connection) as queries:
        a_run("s-old", new=False)
    assert reads(queries, "waggle_foragecall") and reads(queries, "waggle_firedplan")
    assert list(ForageCall.objects.filter(session_key="s-old").order_by("seq").values_list("seq", flat=True)) == [1, 2, 3]


def test_a_space_s_routes_are_read_once_for_many_runs():
    store(route())
    with CaptureQueriesContext(connection) as queries:
        for i in range(3):
            a_run(f"s{i}", new=True)
    assert len(reads(queries, "waggle_waggle")) == 1


def test_a_route_written_in_this_process_reaches_the_next_run_at_once():
    a_run("s0", new=True)  # the space's routes (none) are cached
    w = store(route())
    with service.pinned("1", "s1", new=True):
        service.ready("1", "s1", config=QUIET)
        assert [r.name for r in recording._pins[("1", "s1")].routes] == [w.name]
    Waggle.objects.filter(pk=w.pk).update(disabled=True)  # demoted (curation, the ledger, an operator)
    with service.pinned("1", "s2", new=True):
        service.ready("1", "s2", config=QUIET)
        assert recording._pins[("1", "s2")].routes == []
    Waggle.objects.filter(pk=w.pk).update(disabled=False)
    Waggle.objects.filter(pk=w.pk).delete()
    with service.pinned("1", "s3", new=True):
        service.ready("1", "s3", config=QUIET)
        assert recording._pins[("1", "s3")].routes == []


def test_a_route_written_elsewhere_reaches_new_runs_after_the_ttl(monkeypatch):
    a_run("s0", new=True)
    r = route()
    with connection.cursor() as cur:  # another process's write: this one's cache hears nothing of it
        cur.execute("INSERT INTO waggle_waggle (name, scope, space_key, route, script, length, mined_count, disabled, "
                    "created, touched) VALUES (%s, 'space', '1', %s, '', 3, 0, %s, %s, %s)",
                    [r.name, __import__("json").dumps(r.to_json()), False, "2026-01-01", "2026-01-01"])
    with service.pinned("1", "s1", new=True):
        service.ready("1", "s1", config=QUIET)
        assert recording._pins[("1", "s1")].routes == []  # within the TTL: as a run begun just before the write
    monkeypatch.setattr(routecache, "TTL", 0.0)
    with service.pinned("1", "s2", new=True):
        service.ready("1", "s2", config=QUIET)
        assert [x.name for x in recording._pins[("1", "s2")].routes] == [r.name]


def test_the_next_run_of_a_quiet_session_reads_no_fired_plan():
    a_run("s1", new=True)
    with CaptureQueriesContext(connection) as queries:
        a_run("s1", new=False)
    assert len(reads(queries, "waggle_foragecall")) == 1  # its last seq: nobody appended since
    assert not reads(queries, "waggle_firedplan")


def test_a_session_appended_elsewhere_is_asked_what_waits():
    a_run("s1", new=True)
    FiredPlan.objects.create(space_key="1", session_key="s1", plan_key="k", name="r", settled=False, tail=[])
    ForageCall.objects.create(space_key="1", session_key="s1", member_key="m1", seq=3, tool="read_file", args={},
                              mutates=False, out_hash="h", est_tokens=1)  # another host ran the session meanwhile
    with CaptureQueriesContext(connection) as queries:
        with service.pinned("1", "s1"):
            service.ready("1", "s1", config=QUIET)
            service.judge_reply("1", "s1", [], text="done", config=QUIET)
    assert reads(queries, "waggle_firedplan")


def test_a_run_that_fails_leaves_no_ring_behind():
    with pytest.raises(RuntimeError):
        with service.pinned("1", "s1", new=True):
            service.observe("1", "s1", "m1", "list_dir", {"path": "."}, False, "a.txt", config=QUIET)
            raise RuntimeError("the lease was lost: the run's writes roll back, another host takes the session")
    assert ("1", "s1") not in recording._rings and ("1", "s1") not in recording._quiet


def test_ready_says_whether_an_inbound_route_may_fire(cfg):
    from waggle_helpers import teach_heard

    teach_heard("2", ["u1", "u2", "u3", "u4"], cfg)  # space 2 learns an inbound route; space 1 has none
    with service.pinned("1", "s1", new=True), service.pinned("2", "s2", new=True):
        assert service.ready("1", "s1", config=cfg) is False  # the host records the message in its transaction
        assert service.ready("2", "s2", config=cfg) is True  # heard before it: a replay runs a tool
    assert service.ready("1", "s3", config=cfg) is True  # unpinned: nothing known ahead


def test_a_route_written_in_a_rolled_back_transaction_is_not_kept_in_the_route_cache():
    """The writing transaction read its own uncommitted route (a pinned run in it): that set must not
    outlive the rollback in the cache, or the next runs of the process replay a route that is not there."""
    from django.db import transaction

    from waggle import following

    r = route("rolled-back")
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            Waggle.objects.create(name=r.name, scope="space", space_key="1", route=r.to_json(), length=len(r.steps))
            with service.pinned("1", "s-in"):
                assert [x.name for x in following._session_routes("1", "s-in")] == [r.name]
            raise RuntimeError
    assert not Waggle.objects.filter(name=r.name).exists()
    with service.pinned("1", "s-after"):
        assert following._session_routes("1", "s-after") == []


def test_a_pin_that_reloaded_its_routes_before_a_demotion_committed_forgets_them_at_the_commit():
    """Another thread's run reloaded the space's routes while the demoting transaction was still open
    (it read the route enabled): the commit takes the route from it too, not the end of its run."""
    from django.test import TestCase

    from waggle import judging
    from waggle.models import LedgerEntry

    w = store(route())
    LedgerEntry.objects.create(name=w.name, scope="space", store_key="1", space_key="1", steps=40, used_steps=0)
    with service.pinned("1", "s-other", new=True):
        pin = recording._pins[("1", "s-other")]
        with TestCase.captureOnCommitCallbacks(execute=True):
            assert judging._demote_if_missing("space", "1", w.name, WaggleConfig())
            pin.routes = [Route.from_json(w.route, name=w.name)]  # the other thread's reload, before the commit
        assert pin.routes is None, "the demotion's commit forgets what the pins read before it"


# --- an old session read before the host's first transaction (sync) or ahead, with others (read_ahead) ------

def old_session(session: str, space="1", calls=3) -> None:
    """A session an earlier run recorded, in another process: this one holds no ring of it."""
    for seq in range(1, calls + 1):
        ForageCall.objects.create(space_key=space, session_key=session, member_key="m1", seq=seq, tool="read_file",
                                  args={"path": f"f{seq}"}, mutates=False, out_hash=f"h{seq}", est_tokens=1)
    recording._forget((space, session))


def first_call_in_a_transaction(session: str, space="1"):
    """The host's first transaction of the run: a reply judged, a call observed. Its round trips."""
    from django.db import transaction

    with round_trips() as sent, transaction.atomic():
        service.judge_reply(space, session, [("list_dir", {"path": "."})], text="", config=QUIET)
        service.observe(space, session, "m1", "list_dir", {"path": "."}, False, "a.txt", config=QUIET)
    return sent


def test_an_old_session_synced_at_its_pin_reads_nothing_in_the_hosts_first_transaction():
    old_session("s-sync")
    with round_trips() as at_pin:
        with service.pinned("1", "s-sync", sync=True):
            sent = first_call_in_a_transaction("s-sync")
    assert not [s for s in sent if s.startswith("SELECT")], sent
    assert any("waggle_foragecall" in s for s in at_pin) and any("waggle_firedplan" in s for s in at_pin)
    assert list(ForageCall.objects.filter(session_key="s-sync").order_by("seq").values_list("seq", flat=True)) == [1, 2, 3, 4]


def test_an_old_session_read_lazily_reads_in_the_hosts_first_transaction():
    """The other side of the test above: without sync, the reads fall in the host's transaction."""
    old_session("s-lazy")
    with service.pinned("1", "s-lazy"):
        sent = first_call_in_a_transaction("s-lazy")
    assert [s for s in sent if "SELECT" in s and "waggle_foragecall" in s], sent
    assert list(ForageCall.objects.filter(session_key="s-lazy").order_by("seq").values_list("seq", flat=True)) == [1, 2, 3, 4]


def test_sessions_read_ahead_together_are_what_each_would_read_and_their_pins_read_nothing():
    old_session("s-a", calls=3)
    old_session("s-b", calls=250)  # more calls than a ring holds: its last ring_capacity ones
    old_session("s-c", space="2", calls=1)
    FiredPlan.objects.create(space_key="1", session_key="s-b", plan_key="k", name="r", settled=False, tail=[])
    with round_trips() as ahead_sent:
        seen = service.read_ahead([("1", "s-a"), ("1", "s-b"), ("2", "s-c"), ("1", "s-none")])
    assert len(ahead_sent) == 2, ahead_sent  # the rings' rows and what waits, for all of them
    for key in [("1", "s-a"), ("1", "s-b"), ("2", "s-c"), ("1", "s-none")]:
        recording._forget(key)
        ring = recording._ring(*key, QUIET.normalized())  # what a lazy sync builds
        assert seen[key].last == ring.last_seq and seen[key].ring.last_seq == ring.last_seq
        assert [c.tool for c in seen[key].ring.recent()] == [c.tool for c in ring.recent()]
        assert [c.args for c in seen[key].ring.recent()] == [c.args for c in ring.recent()]
        recording._forget(key)
    assert seen[("1", "s-b")].waits and not seen[("1", "s-a")].waits and seen[("1", "s-none")].last == 0
    assert len(seen[("1", "s-b")].ring.recent()) == QUIET.normalized().ring_capacity
    with round_trips() as at_pin:
        with service.pinned("1", "s-a", sync=True, seen=seen[("1", "s-a")]):
            sent = first_call_in_a_transaction("s-a")
    assert not [s for s in at_pin if "SELECT" in s], at_pin
    assert not [s for s in sent if s.startswith("SELECT")], sent
    assert list(ForageCall.objects.filter(session_key="s-a").order_by("seq").values_list("seq", flat=True)) == [1, 2, 3, 4]
    with service.pinned("1", "s-b", seen=seen[("1", "s-b")]):  # a replay waits: the judge reads it, as ever
        with CaptureQueriesContext(connection) as queries:
            service.judge_reply("1", "s-b", [], text="done", config=QUIET)
    assert reads(queries, "waggle_firedplan")
