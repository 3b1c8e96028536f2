"""Embedded wakes skip the ORM broker's poll (issue 13: the embedded wake's p99 was the 0.1 s poll):
enqueue rings the pushers over the doorbell once the task's row is committed, and an empty poll
waits on that ring. The queue table stays the durable path and the poll the backstop."""
from __future__ import annotations

import pytest
from django.conf import settings
from django.db import transaction
from django_q.brokers import get_broker

from veronica.plumbing import doorbell
from veronica.engine.qbroker import DoorbellORM

pytestmark = pytest.mark.skipif(bool(settings.REDIS_URL), reason="hosted mode's broker is Redis (BLPOP, no poll)")


@pytest.fixture
def bell(transactional_db):
    bell = doorbell.QueueBell()
    bell.wait(0)  # rings left over from other tests
    yield bell
    bell.close()


def test_embedded_mode_uses_the_doorbell_broker(db):
    assert isinstance(get_broker("vt-doorbell"), DoorbellORM)


def test_an_enqueue_rings_the_pushers_once_its_row_is_committed(bell):
    broker = DoorbellORM(list_key="vt-doorbell")
    with transaction.atomic():
        broker.enqueue("payload")
        assert bell.wait(0) is False, "no ring before the commit: the pusher would find nothing"
    assert bell.wait(0) is True
    assert bell.wait(0) is False, "one enqueue, one ring"
    tasks = broker.dequeue()
    assert [payload for _, payload in tasks] == ["payload"]
    broker.purge_queue()


def test_an_empty_poll_waits_on_the_bell_and_a_ring_ends_it(bell, monkeypatch):
    broker = DoorbellORM(list_key="vt-doorbell-empty")
    waits = []
    monkeypatch.setattr(broker, "_wait", lambda timeout: waits.append(timeout))
    assert broker.dequeue() is None and len(waits) == 1, "an empty queue: one wait of at most the poll"
    doorbell.ring_queue()
    assert bell.wait(30) is True, "a ring that came before the wait ends it at once"


def test_a_feeds_ring_does_not_wake_a_pusher(bell):
    doorbell.ring(1, 1)
    assert bell.wait(0) is False


def test_a_burst_of_wakes_is_taken_in_one_write_and_each_task_once(bell):
    """A burst of wakes leaves the queue table in batches of TAKE_AT_ONCE, one UPDATE each (SQLite's one
    write lock is what the runs' steps queue for), oldest first, and goes to q2's loop a task a dequeue
    from the pusher's hand; a task taken is locked, so neither this pusher nor another cluster's takes it
    again until its lock runs out (q2's retry) or the hand gives it back."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from veronica.engine.qbroker import TAKE_AT_ONCE

    broker = DoorbellORM(list_key="vt-burst")
    other = DoorbellORM(list_key="vt-burst")
    for n in range(TAKE_AT_ONCE + 8):
        broker.enqueue(f"wake-{n}")
    with CaptureQueriesContext(connection) as statements:
        first = [task for _ in range(TAKE_AT_ONCE) for task in broker.dequeue()]
    writes = [q["sql"] for q in statements.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(writes) == 1, writes
    assert [payload for _, payload in first] == [f"wake-{n}" for n in range(TAKE_AT_ONCE)]
    second = [task for _ in range(8) for task in other.dequeue()]
    assert [payload for _, payload in second] == [f"wake-{n}" for n in range(TAKE_AT_ONCE, TAKE_AT_ONCE + 8)]
    assert not {pk for pk, _ in first} & {pk for pk, _ in second}
    assert broker.queue_size() == 0 and broker.lock_size() == TAKE_AT_ONCE + 8
    broker.purge_queue()
