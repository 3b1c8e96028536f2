"""Enqueueing a wake reuses one broker per process and queue (issue 13): django-q2 would build a
new broker per task, which for Redis is a new connection on the path of every wake."""
from __future__ import annotations

import django_q.brokers

from veronica.engine import wakes


def test_wakes_share_one_broker_until_the_queue_changes(db, monkeypatch):
    from django_q.conf import Conf

    built = []
    real = django_q.brokers.get_broker

    def counting(*args, **kwargs):
        built.append(Conf.CLUSTER_NAME)
        return real(*args, **kwargs)

    monkeypatch.setattr(django_q.brokers, "get_broker", counting)
    monkeypatch.setattr(wakes, "_brokers", {})
    first = wakes.wake_broker()
    assert wakes.wake_broker() is first and wakes.wake_broker() is first
    assert len(built) == 1
    monkeypatch.setattr(Conf, "CLUSTER_NAME", Conf.CLUSTER_NAME + "-renamed")
    renamed = wakes.wake_broker()
    assert renamed is not first and Conf.CLUSTER_NAME in renamed.list_key  # Redis prefixes its key
    assert len(built) == 2
    front = wakes.wake_broker(front=True)
    assert front is not renamed and wakes.wake_broker(front=True) is front, "the resume broker is kept too"
    assert len(built) == 3


def test_an_enqueued_wake_goes_through_the_shared_broker(db, monkeypatch):
    sent = []

    class Recording:
        list_key = "vt-recording"

        def enqueue(self, task):
            sent.append(task)
            return 1

    monkeypatch.setattr(wakes, "wake_broker", lambda front=False: Recording())
    monkeypatch.setattr("django_q.conf.Conf.SYNC", False)
    wakes.enqueue_wake(7, "message")
    assert len(sent) == 1
