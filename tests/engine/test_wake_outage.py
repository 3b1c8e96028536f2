"""Wakes across an outage: mail sent while the broker refused its wake is rung at the engine's
next tick (not after the unread sweep's wait), and a worker that cannot reach the database hands
its wakes back to the broker at once instead of failing each on a connect timeout."""
from __future__ import annotations

import pytest
from django.db import OperationalError

from veronica.swarm import bus
from veronica.engine import outage, runner, supervisor, tick

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker(monkeypatch):
    """django-q2's enqueue, refusing while `down` is set and recording what it accepted."""
    import django_q.tasks

    state = {"down": True, "sent": []}

    def async_task(func, member_id, source, q_options=None):
        if state["down"]:
            raise ConnectionError("Redis is down")
        state["sent"].append((member_id, source))
    monkeypatch.setattr(django_q.tasks, "async_task", async_task)
    return state


def test_mail_sent_while_the_broker_was_down_is_rung_at_the_next_tick(space, broker, django_capture_on_commit_callbacks):
    w1 = supervisor.get_member(space, "w1")
    with django_capture_on_commit_callbacks(execute=True):
        bus.send(space, "operator", "w1", "are you there?")
    assert broker["sent"] == [], "the broker refused the wake"
    broker["down"] = False
    with django_capture_on_commit_callbacks(execute=True):
        tick.tick()
    assert [member for member, _ in broker["sent"]] == [w1.pk], "rung at the first tick after the broker is back"


def test_a_worker_cut_off_from_the_database_hands_its_wakes_back_at_once(space, broker, monkeypatch):
    broker["down"] = False
    w1 = supervisor.get_member(space, "w1")
    claims = []

    def unreachable(*args):
        claims.append(args)
        raise OperationalError("connection to server at 127.0.0.1 failed: timeout expired")
    monkeypatch.setattr(runner, "first_claim", unreachable)
    monkeypatch.setattr(runner, "BOUNCE_PAUSE", 0)
    monkeypatch.delenv(outage.MARK_ENV, raising=False)
    outage.mark_up()
    assert runner.wake(w1.pk, "message") == "handed-back"
    assert runner.wake(w1.pk, "message") == "handed-back"
    assert len(claims) == 1, "within the outage window the database is not tried again (no connect timeout per wake)"
    assert broker["sent"] == [(w1.pk, "message"), (w1.pk, "message")], "each wake went back to the broker, for a host that can run it"
    outage.mark_up()  # (what the ticker's next good beat does)


def test_a_host_cut_off_from_the_database_fetches_no_wakes_until_its_ticker_gets_through(tmp_path, monkeypatch):
    """The note is the host's: one worker's failed claim stops the pusher (another process) fetching;
    a failed beat of the ticker keeps it standing, and the first beat that gets through lifts it."""
    from veronica.engine import qbroker
    from veronica.engine.ticker import Ticker

    monkeypatch.setenv(outage.MARK_ENV, str(tmp_path / "outage"))
    monkeypatch.setattr(outage, "network_database", lambda: True)  # (the embedded pass runs it on SQLite)
    monkeypatch.setattr(qbroker, "GATE_PAUSE", 0)
    fetched = []
    monkeypatch.setattr(qbroker.GatedRedis, "_take", lambda self: fetched.append(1) or [("ack", "task")])
    pusher = qbroker.GatedRedis.__new__(qbroker.GatedRedis)
    assert pusher.dequeue() == [("ack", "task")]
    monkeypatch.setattr(runner, "first_claim", lambda *a: (_ for _ in ()).throw(OperationalError("timeout expired")))
    monkeypatch.setattr(runner, "BOUNCE_PAUSE", 0)
    monkeypatch.setattr(runner.wakes, "enqueue_wake", lambda *a, **k: True)
    assert runner.wake(1, "message") == "handed-back"
    assert pusher.dequeue() is None and len(fetched) == 1, "the host's pusher stopped fetching"
    ticker = Ticker(period=1, holder="t")
    monkeypatch.setattr("veronica.engine.leases.hold_role", lambda *a: (_ for _ in ()).throw(OperationalError("timeout expired")))
    ticker.beat()
    assert pusher.dequeue() is None, "a failed beat keeps the host cut off"
    monkeypatch.setattr("veronica.engine.leases.hold_role", lambda *a: False)
    monkeypatch.setattr("veronica.engine.leases.seconds_to_next_expiry", lambda: None)  # a follower's one read
    ticker.beat()
    assert pusher.dequeue() == [("ack", "task")], "the first beat that got through lets the host fetch again"


def test_a_beat_stuck_on_the_database_stops_the_host_fetching_before_the_timeout_fails_it(monkeypatch, tmp_path):
    """A packet nobody answers fails only after the connect or TCP user timeout (10-20 s): the
    qcluster's main loop watches the beat's role statement and marks the host cut off past
    stall_seconds(); the beat that gets through lifts the note."""
    import time

    from veronica.engine.ticker import Ticker

    monkeypatch.setenv(outage.MARK_ENV, str(tmp_path / "outage"))
    monkeypatch.setattr(outage, "network_database", lambda: True)
    ticker = Ticker(period=1, holder="t")
    ticker.beat_started = time.monotonic() - 1
    ticker.watch()
    assert not outage.is_down(), "a beat of a second is no stall"
    ticker.beat_started = time.monotonic() - ticker.stall_seconds() - 1
    ticker.watch()
    assert outage.is_down(), "a beat stuck past stall_seconds() marks the host cut off"
    monkeypatch.setattr("veronica.engine.leases.hold_role", lambda *a: False)
    monkeypatch.setattr("veronica.engine.leases.seconds_to_next_expiry", lambda: None)  # a follower's one read
    ticker.beat()
    assert not outage.is_down() and ticker.beat_started is None


def test_sqlite_locked_is_no_partition_the_other_workers_carry_on(tmp_path, monkeypatch):
    """Embedded: "database is locked" in one worker's claim hands that wake back, but does not stop
    the host (its ticker and other workers) the way a cut network does."""
    monkeypatch.setenv(outage.MARK_ENV, str(tmp_path / "outage"))
    monkeypatch.setattr(outage, "network_database", lambda: False)
    outage.mark_down()
    assert not (tmp_path / "outage").exists() and outage.is_down(), "this process's own note only"
    outage.mark_up()
