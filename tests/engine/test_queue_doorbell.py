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
