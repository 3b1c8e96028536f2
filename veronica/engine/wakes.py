"""Wakes are doorbells: a django-q2 task per wake, enqueued only after the commit that caused it."""
from __future__ import annotations

import logging
import os
from typing import Iterable

from django.db import transaction

log = logging.getLogger(__name__)

SOURCES = ("message", "task", "timer", "alarm", "resume")


def enqueue_wake(member_id: int, source: str) -> None:
    """Put one wake on the broker now. A lost wake is recovered by the engine tick's sweep."""
    from django_q.tasks import async_task

    if source not in SOURCES:
        raise ValueError(f"unknown wake source {source!r}")
    # A resume is recovery (a dead run's member, a decided approval, a retry whose backoff ran out):
    # it goes to the head of Redis's list, so the next free worker takes it rather than the
    # doorbells queued behind busy members.
    options = {"task_name": f"wake-{member_id}-{source}", "broker": wake_broker(front=source == "resume")}
    try:
        async_task("veronica.engine.runner.wake", member_id, source, q_options=options)
    except Exception:
        log.warning("could not enqueue wake for member %s (%s); the sweep will recover it", member_id, source, exc_info=True)


_brokers: dict[tuple[int, str, bool], object] = {}


def wake_broker(front: bool = False):
    """One broker per process and queue: django-q2 builds a new one per task by default, which for
    Redis is a new connection (and its handshake) on the path of every wake. front: the broker whose
    enqueue pushes to the head of Redis's list (q2's own is rpush); on the ORM broker, whose dequeue
    has no order to jump, it is a plain one (embedded mode has one host anyway)."""
    from django_q.brokers import get_broker
    from django_q.brokers.redis_broker import Redis
    from django_q.conf import Conf

    key = (os.getpid(), Conf.CLUSTER_NAME, front)  # a forked worker, or a test that renamed the queue, builds its own
    broker = _brokers.get(key)
    if broker is None:
        broker = get_broker()
        if front and isinstance(broker, Redis):
            broker.enqueue = lambda task, b=broker: b.connection.lpush(b.list_key, task)
        if len(_brokers) > 16:  # only tests rename queues this often
            _brokers.clear()
        _brokers[key] = broker
    return broker


def wake_on_commit(member_ids: Iterable[int], source: str) -> None:
    ids = sorted(set(member_ids))
    if not ids:
        return
    transaction.on_commit(lambda: [enqueue_wake(member_id, source) for member_id in ids])
