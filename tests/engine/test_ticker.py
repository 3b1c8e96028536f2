"""The engine ticker's election, its idle cost and its behaviour when the database goes away
(in-process; tests/engine/test_recovery.py drives the real clusters)."""
from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.conftest import make_space
from veronica.swarm import bus
from veronica.engine import leases, retention, supervisor, tick
from veronica.engine.ticker import ROLE, Ticker
from veronica.models import EngineLease, Member, RetirePolicy, Run, RunOutcome

pytestmark = pytest.mark.django_db


def expire(name: str) -> None:
    EngineLease.objects.filter(name=name).update(expires_at=leases.db_now_plus(-1))


def test_one_holder_at_a_time_and_a_follower_takes_over_when_the_lease_runs_out():
    assert leases.hold_role("r", "a", ttl=30)
    assert not leases.hold_role("r", "b", ttl=30), "a live holder keeps the role"
    assert leases.hold_role("r", "a", ttl=30), "the holder renews"
    taken = EngineLease.objects.get(name="r").acquired_at
    expire("r")
    assert leases.hold_role("r", "b", ttl=30), "an expired role goes to the next claimant"
    assert not leases.hold_role("r", "a", ttl=30), "the old holder lost it"
    lease = EngineLease.objects.get(name="r")
    assert lease.holder == "b" and lease.acquired_at >= taken
    leases.release_role("r", "b")
    assert leases.hold_role("r", "a", ttl=30), "a role handed back is free at once"


def test_role_and_run_lease_expiry_use_the_database_clock(space, monkeypatch):
    """A host whose clock runs an hour fast neither steals the role nor expires a live run lease."""
    assert leases.hold_role("r", "a", ttl=30)
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="live", lease_expires_at=leases.db_now_plus(30))
    fast = timezone.now() + timedelta(hours=1)
    monkeypatch.setattr(timezone, "now", lambda: fast)
    assert not leases.hold_role("r", "b", ttl=30)
    assert leases.expire_leases() == []
    assert Member.objects.get(pk=w1.pk).lease_token == "live"


@pytest.mark.skipif(connection.vendor == "postgresql", reason="PostgreSQL: the select locks the rows (the test below)")
def test_expiry_rechecks_the_lease_so_a_renewal_in_between_wins(space, monkeypatch):
    """SQLite has no row locks: a heartbeat may renew between the expiry's select and its update."""
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="t", lease_expires_at=timezone.now() - timedelta(seconds=1))
    real_filter = Member.objects.filter
    renewed = []

    def renew_then_filter(*args, **kwargs):
        if kwargs.get("lease_token") == "t" and not renewed:  # the heartbeat lands between select and update
            renewed.append(real_filter(pk=w1.pk).update(lease_expires_at=leases.db_now_plus(30)))
        return real_filter(*args, **kwargs)

    monkeypatch.setattr(Member.objects, "filter", renew_then_filter)
    assert leases.expire_leases() == []
    assert renewed == [1] and Member.objects.get(pk=w1.pk).lease_token == "t"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_a_renewal_during_the_expiry_waits_for_it_and_the_batch_expires_in_one_update(space, monkeypatch):
    """PostgreSQL: the expiry's select locks the run-out rows until its commit, so a heartbeat's renewal
    from another connection cannot land between the select and the update (it waits, then finds the
    lease gone); the batch is then released in one UPDATE, not one per member."""
    import psycopg

    members = [supervisor.get_member(space, name) for name in ("w1", "w2")]
    for n, member in enumerate(members):
        Member.objects.filter(pk=member.pk).update(run_status="busy", lease_token=f"t{n}",
                                                   lease_expires_at=timezone.now() - timedelta(seconds=1))
    real_filter = Member.objects.filter
    tried = []

    def renew_then_filter(*args, **kwargs):
        if "pk__in" in kwargs and not tried:  # the batch's release is next: a heartbeat tries now
            settings = connection.settings_dict
            with psycopg.connect(host=settings["HOST"] or "127.0.0.1", port=settings["PORT"] or 5432, user=settings["USER"],
                                 dbname=settings["NAME"], autocommit=True) as other:
                try:
                    # SET LOCAL, in a transaction: a session's SET would stay on the server connection, which
                    # a transaction pooler (the PgBouncer pass) hands to the next test's statements
                    with other.transaction():
                        other.execute("SET LOCAL lock_timeout = '200ms'")
                        other.execute(f"UPDATE {Member._meta.db_table} SET lease_expires_at = now() + interval '30 seconds' "
                                      "WHERE id = %s AND lease_token = 't0'", [members[0].pk])
                    tried.append("renewed")
                except psycopg.errors.LockNotAvailable:
                    tried.append("waited")
        return real_filter(*args, **kwargs)

    monkeypatch.setattr(Member.objects, "filter", renew_then_filter)
    with CaptureQueriesContext(connection) as queries:
        woken = leases.expire_leases()
    assert tried == ["waited"]
    assert sorted(woken) == sorted(m.pk for m in members)
    assert set(Member.objects.filter(pk__in=[m.pk for m in members]).values_list("lease_token", flat=True)) == {""}
    releases = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE") and "lease_token" in q["sql"]
                and "cancel_requested" in q["sql"]]
    assert len(releases) == 1, releases


def populate(tmp_path, prefix: str, spaces: int, workers: int) -> None:
    for s in range(spaces):
        space = make_space(tmp_path, slug=f"{prefix}{s}", workers=tuple(f"w{i}" for i in range(workers)))
        supervisor.spawn(supervisor.get_member(space, "w0"), retire_policy=RetirePolicy.ON_COMPLETE, actor="test")  # waits for work
        busy = supervisor.get_member(space, f"w{workers - 1}")  # mid-run, with mail waiting for it
        bus.send(space, "boss", busy.name, "hello")
        Member.objects.filter(pk=busy.pk).update(run_status="busy", lease_token="x", lease_expires_at=leases.db_now_plus(600))


def idle_tick_statements() -> int:
    with CaptureQueriesContext(connection) as queries:
        summary = tick.tick()
    assert summary["leases_expired"] == 0 and summary["swept"] == 0
    return len(queries)


IDLE_TICK_MAX_STATEMENTS = 17  # one reading of the database's clock, the engine duties (8), due retries (1), parked a2a__ calls due a poll (1) and the ops duties (6: watchdogs, notifier retries, lost checks)


def test_an_idle_tick_costs_a_handful_of_statements_whatever_the_size(tmp_path, django_assert_max_num_queries, monkeypatch):
    # Retention runs once a period per process, so whether this test's first tick is the one that
    # purges depends on test order (CI saw 17 then 15). Count it as not due; its own cost is below.
    monkeypatch.setattr(retention, "_last_purge", time.monotonic())
    populate(tmp_path, "a", spaces=1, workers=1)
    small = idle_tick_statements()
    populate(tmp_path, "b", spaces=4, workers=6)
    with django_assert_max_num_queries(IDLE_TICK_MAX_STATEMENTS):
        tick.tick()
    assert idle_tick_statements() == small, "an idle tick must not cost anything per space or member"
    leader, follower = Ticker(period=2, holder="a"), Ticker(period=2, holder="b")
    leader.beat()  # the first beat ever creates the role's row
    with django_assert_max_num_queries(IDLE_TICK_MAX_STATEMENTS + 2):  # hold the role, tick, the next lease end
        leader.beat()
    with django_assert_max_num_queries(3):  # try the role (update, then exists), the next lease end
        follower.beat()


def test_the_leader_wakes_when_the_soonest_run_lease_ends_not_a_period_later(space):
    ticker = Ticker(period=5, holder="a")
    ticker.beat()
    assert ticker.expiry_deadline is None and ticker.pause(0) == 5, "no lease held: one period"
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="t", lease_expires_at=timezone.now() + timedelta(seconds=1))
    ticker.beat()
    assert 0.05 <= ticker.pause(0) <= 1.1


def test_a_follower_expires_a_dead_runs_lease_at_its_end_without_waiting_for_the_holder(space):
    """A kill can take the role's holder and a run together: the run's member must not wait for the
    role to change hands (its TTL plus a beat, longer on a starved host) to be released."""
    holder, follower = Ticker(period=5, holder="a"), Ticker(period=5, holder="b")
    assert holder.beat() is not None  # "a" holds the role from now on and never beats again (dead)
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="dead", lease_expires_at=leases.db_now_plus(1))
    Run.objects.create(member=w1, source="message", lease_token="dead", started_at=timezone.now())
    assert follower.beat() is None and not follower.leading
    assert 0.05 <= follower.pause(0) <= 1.1, "the follower wakes when the lease runs out, not a period later"
    Member.objects.filter(pk=w1.pk).update(lease_expires_at=leases.db_now_plus(-0.5))  # its time has come
    follower.expiry_deadline = time.monotonic() - 0.01
    assert follower.beat() is None, "still a follower: the role is the holder's until its TTL runs out"
    assert Run.objects.get(member=w1).outcome == RunOutcome.LEASE_EXPIRED
    assert Member.objects.get(pk=w1.pk).lease_token == ""
    assert follower.expiry_deadline is None and follower.pause(0) == 5, "no lease left: one period"
    assert EngineLease.objects.get(name=ROLE).holder == "a"


def test_a_ticker_beat_holds_the_role_then_ticks(space):
    a, b = Ticker(period=1, holder="a"), Ticker(period=1, holder="b")
    assert a.beat() is not None and a.leading
    assert b.beat() is None and not b.leading, "a follower does not tick"
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="dead", lease_expires_at=leases.db_now_plus(-1))
    Run.objects.create(member=w1, source="message", lease_token="dead", started_at=timezone.now())
    assert a.beat()["leases_expired"] == 1
    assert Run.objects.get(member=w1).outcome == RunOutcome.LEASE_EXPIRED
    assert EngineLease.objects.get(name=ROLE).holder == "a"


def test_a_ticker_cut_off_from_the_database_logs_each_retry_and_recovers(monkeypatch, caplog):
    ticker = Ticker(period=2, holder="h")

    def unreachable(*args, **kwargs):
        raise OperationalError("connection to server at \"db\" failed: timeout expired")

    monkeypatch.setattr(leases, "hold_role", unreachable)
    with caplog.at_level(logging.WARNING, logger="veronica.engine.ticker"):
        assert ticker.beat() is None and ticker.beat() is None
        monkeypatch.undo()
        assert ticker.beat() is not None
    lines = [r.getMessage() for r in caplog.records]
    assert "retry 1 in 2s" in lines[0] and "OperationalError" in lines[0] and "retry 2" in lines[1]
    assert "reachable again after 2 failed beats" in lines[2]


def test_the_sweep_leaves_fresh_mail_and_recently_woken_members_to_their_own_wakes(space, monkeypatch):
    """The tick runs every few seconds: the sweep must not pile doorbells on a backlogged queue."""
    enqueued = []
    monkeypatch.setattr(tick, "enqueue_wake", lambda pk, source: enqueued.append(pk))
    w1, w2 = supervisor.get_member(space, "w1"), supervisor.get_member(space, "w2")
    bus.send(space, "boss", "w1", "fresh: its own wake is on the way")
    bus.send(space, "boss", "w2", "old, and w2 was woken a moment ago")
    from veronica.models import Message, Wake

    Message.objects.filter(recipient=w2).update(created_at=timezone.now() - timedelta(minutes=5))
    Wake.objects.create(member=w2, source="message")
    assert tick.sweep_unread() == [] and enqueued == []
    Message.objects.update(created_at=timezone.now() - timedelta(minutes=5))
    Wake.objects.update(created_at=timezone.now() - timedelta(minutes=5))
    assert sorted(tick.sweep_unread()) == sorted([w1.pk, w2.pk])


def test_the_sweep_wakes_a_member_once_while_its_wake_waits_in_a_backlogged_queue(space, monkeypatch):
    """A queue backlog past SWEEP_AFTER: the member's wake is queued, not yet taken (no Wake row). The
    next ticks must not enqueue one more wake each (the backlog would feed itself); after SWEEP_AFTER
    with nothing come of it, the sweep tries once more."""
    from veronica.models import Message

    enqueued = []
    monkeypatch.setattr(tick, "enqueue_wake", lambda pk, source: enqueued.append(pk))
    w1 = supervisor.get_member(space, "w1")
    bus.send(space, "boss", "w1", "its wake waits behind a backlog")
    Message.objects.update(created_at=timezone.now() - timedelta(minutes=5))
    assert tick.sweep_unread() == [w1.pk]
    for _ in range(3):  # the next ticks, the wake still queued
        assert tick.sweep_unread() == []
    assert enqueued == [w1.pk]
    Member.objects.filter(pk=w1.pk).update(wake_queued_at=timezone.now() - tick.SWEEP_AFTER - timedelta(seconds=1))
    assert tick.sweep_unread() == [w1.pk], "a sweep's wake that never came is tried again"


def test_a_due_retention_pass_adds_a_fixed_handful_of_statements_to_an_idle_tick(tmp_path, monkeypatch):
    from django.db import connection

    populate(tmp_path, "a", spaces=3, workers=2)
    monkeypatch.setattr(retention, "_last_purge", time.monotonic())
    idle = idle_tick_statements()
    monkeypatch.setattr(retention, "_last_purge", time.monotonic() - 10 * 86400)
    # prune webhook deliveries, select spaces with retention on; the audit trail's purge: select the
    # spaces keeping events longer, savepoint, delete, release (and SET LOCAL for its trigger on PostgreSQL)
    extra = 2 + 4 + (connection.vendor == "postgresql")
    assert idle_tick_statements() == idle + extra
    assert idle_tick_statements() == idle, "then not again until the period has passed"


def test_two_hand_overs_in_a_row_fit_inside_the_shortest_lease_the_bench_uses():
    """A hand-over costs at most the role's TTL plus a follower's beat after the holder dies. The
    holder dies at K, its successor takes over and dies at the next kill (K + 4 in bench/recovery.py):
    the third holder must be ticking before the dead run's 10 s lease runs out, or recovery waits on
    the role (it did: kill -> lease expired 16.9 s with TTL period + 2)."""
    from veronica.engine.ticker import role_ttl

    period, kill_every, lease = 2, 4, 10
    assert kill_every + role_ttl(period) + period < lease


def test_a_killed_hosts_leases_are_expired_together_not_a_transaction_each(tmp_path, monkeypatch,
                                                                         django_capture_on_commit_callbacks):
    """A killed host leaves hundreds of leases running out at once (bench/fleet.py: 256 of 500); one
    transaction of about ten round trips each put seconds between the first member re-woken and the
    last. A batch: one statement per member (its conditional release) and a fixed handful besides.
    Each killed run is still ended, recounted from its events and its member owed a resume."""
    from veronica.engine import failures
    from veronica.models import Event

    rung = []
    monkeypatch.setattr(failures, "enqueue_wake", lambda member_id, source: rung.append((member_id, source)))
    space = make_space(tmp_path, workers=tuple(f"w{i}" for i in range(6)))
    killed = [supervisor.get_member(space, f"w{i}") for i in range(6)]
    runs = {}
    for i, member in enumerate(killed):
        token = f"dead-{i}"
        Member.objects.filter(pk=member.pk).update(run_status="busy", lease_token=token, lease_expires_at=leases.db_now_plus(-1))
        runs[member.pk] = Run.objects.create(member=member, source="message", lease_token=token, started_at=timezone.now())
        Event.objects.create(space=space, seq=1000 + i, kind="model.called", member=member,
                             payload={"run": runs[member.pk].pk, "input": 10 + i, "output": 1})
    live = supervisor.get_member(space, "boss")  # a live run: its lease holds
    Member.objects.filter(pk=live.pk).update(run_status="busy", lease_token="live", lease_expires_at=leases.db_now_plus(60))
    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
        assert sorted(leases.expire_leases()) == sorted(m.pk for m in killed)
    assert len(queries) <= len(killed) + 12, "\n".join(q["sql"][:100] for q in queries)
    assert sorted(rung) == sorted((m.pk, "resume") for m in killed)
    for i, member in enumerate(killed):
        run, row = Run.objects.get(pk=runs[member.pk].pk), Member.objects.get(pk=member.pk)
        assert run.outcome == RunOutcome.LEASE_EXPIRED and run.ended_at is not None
        assert (run.model_calls, run.tokens) == (1, 11 + i), "recounted from its model.called events"
        assert (row.lease_token, row.run_status, row.phase) == ("", "idle", "ready") and row.retry_at is not None
        assert Event.objects.filter(member=member, kind="run.lease_expired", payload__run=run.pk).count() == 1
    assert Member.objects.get(pk=live.pk).lease_token == "live"
