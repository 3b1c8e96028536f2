"""A burst of wakes in one worker claims its members in a few statements (issue 25.1): the run pool
gathers the claims arriving while one is being made (veronica.engine.gather), and on PostgreSQL the
gathered claims are one statement and one commit (slot.claim_many), each member claimed or not by
exactly the conditions of its own claim, with a token of its own."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.conftest import make_space
from veronica.swarm import bus
from veronica.engine import gather, runner, slot, supervisor
from veronica.models import Event, Member, Message, Run, RunOutcome, Session, Wake

postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="the claim of many is PostgreSQL's statement")


# --- the gathering, alone --------------------------------------------------------------------

def test_a_lone_request_is_handled_at_once_on_its_own_thread():
    calls = []

    def handle(args, items):
        calls.append((args, items, threading.current_thread()))
        return [item * 2 for item in items]

    assert gather.Gathering().ask(handle, "x", 21) == 42
    assert calls == [("x", [21], threading.current_thread())]


def test_requests_arriving_while_one_is_handled_are_handled_together_next():
    release, first_in = threading.Event(), threading.Event()
    calls: list[list[int]] = []

    def handle(args, items):
        calls.append(list(items))
        if len(calls) == 1:
            first_in.set()
            release.wait(10)
        return [f"r{item}" for item in items]

    gathering = gather.Gathering()
    results: dict[int, str] = {}

    def ask(item: int) -> None:
        results[item] = gathering.ask(handle, None, item)

    threads = [threading.Thread(target=ask, args=(0,))]
    threads[0].start()
    assert first_in.wait(10)
    for item in range(1, 6):
        threads.append(threading.Thread(target=ask, args=(item,)))
        threads[-1].start()
    deadline = time.monotonic() + 10
    while len(gathering._pending) < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    release.set()
    for thread in threads:
        thread.join(10)
    assert calls == [[0], [1, 2, 3, 4, 5]], "the requests that waited went in one call"
    assert results == {i: f"r{i}" for i in range(6)}


def test_a_failed_call_of_several_sends_each_its_own_way_and_a_lone_one_raises_its_error():
    gathering = gather.Gathering()

    def broken(args, items):
        raise RuntimeError("the statement failed")

    with pytest.raises(RuntimeError, match="the statement failed"):
        gathering.ask(broken, None, 1)
    asks = [gather._Ask((broken, None), item) for item in (1, 2)]
    gathering._serve(asks)
    outcomes = [ask.result for ask in asks]
    assert outcomes == [gather.OWN_WAY, gather.OWN_WAY]
    assert all(ask.event.is_set() for ask in asks)


def test_many_threads_asking_at_once_all_get_their_own_result():
    gathering = gather.Gathering(most=7)
    sizes = []

    def handle(args, items):
        sizes.append(len(items))
        time.sleep(0.001)
        return [item + 1000 for item in items]

    results: dict[int, int] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, gathering.ask(handle, None, i))) for i in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert results == {i: i + 1000 for i in range(200)}
    assert max(sizes) <= 7 and sum(sizes) == 200
    assert not gathering._pending and not gathering._leading


# --- the claim of many (PostgreSQL) ------------------------------------------------------------

def mailed(space, *names: str) -> list[Member]:
    for name in names:
        bus.send(space, "boss", name, f"work for {name}")
    return [supervisor.get_member(space, name) for name in names]


@postgres_only
def test_a_claim_of_many_claims_each_member_as_its_own_claim_would(db, tmp_path):
    space = make_space(tmp_path, workers=("w1", "w2", "w3", "w4"))
    w1, w2, w3, w4 = mailed(space, "w1", "w2", "w3", "w4")
    single = slot.claim(w4.pk, "message", gates=("breaker", "mail"), record_wake=True, open_session=True)
    with CaptureQueriesContext(connection) as queries:
        leases = slot.claim_many([w3.pk, w1.pk, w2.pk], "message", ("breaker", "mail"))
    statements = [q["sql"] for q in queries if "SAVEPOINT" not in q["sql"]]  # (the test's own transaction's)
    assert len(statements) == 2, "one claim statement for the three, and the events' (with the Wake rows)"
    assert sorted(leases) == sorted([w1.pk, w2.pk, w3.pk])
    tokens = {lease.token for lease in leases.values()} | {single.token}
    assert len(tokens) == 4, "each claim has a token of its own"
    for member_id, lease in leases.items():
        row = Member.objects.filter(pk=member_id).values("run_status", "lease_token", "wake_queued_at").get()
        assert row["run_status"] == "busy" and row["lease_token"] == lease.token and row["wake_queued_at"] is not None
        run = Run.objects.get(pk=lease.run.pk)
        assert run.member_id == member_id and run.lease_token == lease.token and run.source == "message" and run.ended_at is None
        assert lease.member.pk == member_id and lease.member.space.pk == space.pk
        assert lease.session is not None and Session.objects.get(pk=lease.session.pk, member_id=member_id).ended_at is None
        assert lease.session.start_empty == single.session.start_empty
        assert [m.body for m in lease.unread] == [f"work for {lease.member.name}"]
        assert Wake.objects.filter(member_id=member_id, source="message", claimed=True).count() == 1
        assert Event.objects.filter(space=space, kind="run.started", member_id=member_id).count() == 1
    for lease in leases.values():  # each lease works as a claim's
        slot.finish(lease, RunOutcome.DONE)
    assert not Member.objects.filter(pk__in=list(leases)).exclude(lease_token="").exists()


@postgres_only
def test_a_claim_of_many_takes_only_the_members_whose_own_claim_would_take_them(db, tmp_path):
    space = make_space(tmp_path, workers=("w1", "w2", "w3", "w4", "w5"))
    w1, w2, w3, w4 = mailed(space, "w1", "w2", "w3", "w4")
    w5 = supervisor.get_member(space, "w5")  # no mail: the mail gate keeps it out
    held = slot.claim(w2.pk, "message")  # already running
    Member.objects.filter(pk=w3.pk).update(failures=2, retry_at=timezone.now() + timedelta(minutes=5))  # backing off
    leases = slot.claim_many([w1.pk, w2.pk, w3.pk, w4.pk, w5.pk], "message", ("breaker", "mail"))
    expected = {w1.pk, w4.pk}
    assert set(leases) == expected
    assert Member.objects.get(pk=w2.pk).lease_token == held.token, "a running member's lease is untouched"
    assert not Run.objects.filter(member=w5).exists() and not Run.objects.filter(member=w2).exclude(pk=held.run.pk).exists()


@postgres_only
def test_a_member_asked_for_twice_in_one_gathered_call_is_claimed_once(db, tmp_path):
    space = make_space(tmp_path, workers=("w1", "w2"))
    w1, w2 = mailed(space, "w1", "w2")
    first, second, other = runner.claim_gathered(("message", ("breaker", "mail")), [w1.pk, w1.pk, w2.pk])
    assert first is not None and second is None and other is not None
    assert Run.objects.filter(member=w1).count() == 1


@postgres_only
def test_a_long_mailbox_is_left_to_the_run_s_start_to_read(db, tmp_path):
    space = make_space(tmp_path, workers=("w1", "w2"))
    for i in range(slot.CLAIM_MAIL + 2):
        bus.send(space, "boss", "w1", f"note {i}")
    w1, w2 = mailed(space, "w1", "w2")
    leases = slot.claim_many([w1.pk, w2.pk], "message", ("breaker", "mail"))
    assert leases[w1.pk].unread is None, "more than CLAIM_MAIL: not read by the claim"
    assert [m.body for m in leases[w2.pk].unread] == ["work for w2"]
    assert Message.objects.filter(recipient=w1, read_at__isnull=True).count() == slot.CLAIM_MAIL + 3


@postgres_only
def test_a_pool_s_burst_of_wakes_claims_in_a_few_statements(transactional_db, tmp_path, monkeypatch):
    """The wakes' own path: a run pool's threads each ask for their claim; while the first is made, the
    others gather, and go in one claim of many."""
    space = make_space(tmp_path, workers=tuple(f"w{i}" for i in range(6)))
    members = mailed(space, *[f"w{i}" for i in range(6)])
    pool = runner.fleet.RunPool(8, heartbeat=False)
    monkeypatch.setattr(runner.fleet, "_pool", pool)
    sizes = []
    real = slot.claim_many
    monkeypatch.setattr(slot, "claim_many", lambda ids, source, gates: sizes.append(len(ids)) or real(ids, source, gates))
    hold, first_in = threading.Event(), threading.Event()
    alone = runner.claim_alone

    def slow_alone(member_id, source, gates):  # the first claim takes a while: the others arrive meanwhile
        first_in.set()
        hold.wait(10)
        return alone(member_id, source, gates)
    monkeypatch.setattr(runner, "claim_alone", slow_alone)
    got: dict[int, object] = {}

    def wake(member: Member) -> None:
        try:
            got[member.pk] = runner.first_claim(member.pk, "message", ("breaker", "mail"))
        finally:
            from django.db import connections
            connections.close_all()
    threads = [threading.Thread(target=wake, args=(members[0],))]
    threads[0].start()
    assert first_in.wait(10)
    for member in members[1:]:
        threads.append(threading.Thread(target=wake, args=(member,)))
        threads[-1].start()
    deadline = time.monotonic() + 10
    while len(pool.claims._pending) < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    hold.set()
    for thread in threads:
        thread.join(20)
    assert sizes == [5], "the five wakes that waited were claimed in one statement"
    assert all(isinstance(got[m.pk], slot.RunLease) for m in members)
    assert len({got[m.pk].token for m in members}) == 6


@postgres_only
def test_a_claim_of_many_locks_the_spaces_event_counters_in_the_order_of_their_ids(db, tmp_path):
    """Two claims of many that each lock two spaces must take them in one order, or they can wait on
    each other in a circle (PostgreSQL ends one with "deadlock detected" after a second). Both spaces'
    counters go in one statement, which locks them in the order of their ids."""
    first, second = make_space(tmp_path, "first", workers=("a1",)), make_space(tmp_path, "second", workers=("b1",))
    supervisor.add_member(first, "a2", actor="test")  # a member of the first space with a higher id than the second's
    a2, b1 = mailed(first, "a2")[0], mailed(second, "b1")[0]
    assert a2.pk > b1.pk and first.pk < second.pk
    with CaptureQueriesContext(connection) as queries:
        leases = slot.claim_many([b1.pk, a2.pk], "message", ("breaker", "mail"))
    assert set(leases) == {a2.pk, b1.pk}
    counters = [q["sql"] for q in queries if "SET event_seq" in q["sql"]]
    # one statement for both spaces, its locking read sorted by id (the order itself: tests/test_event_commit.py)
    assert len(counters) == 1 and "FROM veronica_space WHERE id = ANY(" in counters[0] and "ORDER BY id FOR UPDATE" in counters[0]


@postgres_only
def test_when_the_claim_of_many_fails_each_wake_claims_on_its_own(db, tmp_path, monkeypatch):
    from django.db import OperationalError, connections

    space = make_space(tmp_path, workers=("w1", "w2"))
    w1, w2 = mailed(space, "w1", "w2")

    def broken(ids, source, gates):
        connections["default"].ensure_connection()
        raise OperationalError("the server closed the connection unexpectedly")
    monkeypatch.setattr(slot, "claim_many", broken)
    closed = []
    monkeypatch.setattr(type(connections["default"]), "close", lambda self: closed.append(self.alias))
    with pytest.raises(OperationalError):
        runner.claim_gathered(("message", ("breaker", "mail")), [w1.pk, w2.pk])
    assert closed == ["default"], "the failed statement's connection is dropped, so each wake's own claim takes a new one"
    gathering = gather.Gathering()
    asks = [gather._Ask((runner.claim_gathered, ("message", ("breaker", "mail"))), m.pk) for m in (w1, w2)]
    gathering._serve(asks)
    assert [ask.result for ask in asks] == [gather.OWN_WAY, gather.OWN_WAY]
    pool = runner.fleet.RunPool(2, heartbeat=False)
    monkeypatch.setattr(runner.fleet, "_pool", pool)
    monkeypatch.setattr(pool.claims, "ask", lambda handle, args, item: gather.OWN_WAY)
    lease = runner.first_claim(w1.pk, "message", ("breaker", "mail"))
    assert isinstance(lease, slot.RunLease) and Member.objects.get(pk=w1.pk).lease_token == lease.token
