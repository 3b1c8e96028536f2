"""Wakes are doorbells: a django-q2 task per wake, enqueued only after the commit that caused it."""
from __future__ import annotations

import logging
from typing import Iterable

from django.db import transaction

log = logging.getLogger(__name__)

SOURCES = ("message", "task", "timer", "alarm", "resume")


def enqueue_wake(member_id: int, source: str) -> None:
    """Put one wake on the broker now. A lost wake is recovered by the engine tick's sweep."""
    from django_q.tasks import async_task

    if source not in SOURCES:
        raise ValueError(f"unknown wake source {source!r}")
    options = {"task_name": f"wake-{member_id}-{source}"}
    if source == "resume":
        options["broker"] = front_of_queue()
    try:
        async_task("veronica.engine.runner.wake", member_id, source, q_options=options)
    except Exception:
        log.warning("could not enqueue wake for member %s (%s); the sweep will recover it", member_id, source, exc_info=True)


def front_of_queue():
    """The broker a resume wake goes through. A resume is recovery (a dead run's member, a decided
    approval, a retry whose backoff ran out): it goes to the head of Redis's list, so the next free
    worker takes it rather than the doorbells queued behind busy members. None (q2's own broker) on
    the ORM broker, whose dequeue has no order to jump; embedded mode has one host anyway."""
    from django_q.brokers import get_broker
    from django_q.brokers.redis_broker import Redis

    broker = get_broker()
    if not isinstance(broker, Redis):
        return None

    broker.enqueue = lambda task: broker.connection.lpush(broker.list_key, task)  # q2's own is rpush
    return broker


def wake_on_commit(member_ids: Iterable[int], source: str) -> None:
    ids = sorted(set(member_ids))
    if not ids:
        return
    transaction.on_commit(lambda: [enqueue_wake(member_id, source) for member_id in ids])
