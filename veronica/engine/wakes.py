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
    try:
        async_task("veronica.engine.runner.wake", member_id, source,
                   q_options={"task_name": f"wake-{member_id}-{source}", "broker": wake_broker()})
    except Exception:
        log.warning("could not enqueue wake for member %s (%s); the sweep will recover it", member_id, source, exc_info=True)


_broker: tuple[tuple[int, str], object] | None = None


def wake_broker():
    """One broker per process and queue: django-q2 builds a new one per task by default, which for
    Redis is a new connection (and its handshake) on the path of every wake."""
    global _broker
    from django_q.brokers import get_broker
    from django_q.conf import Conf

    key = (os.getpid(), Conf.CLUSTER_NAME)  # a forked worker, or a test that renamed the queue, builds its own
    if _broker is None or _broker[0] != key:
        _broker = (key, get_broker())
    return _broker[1]


def wake_on_commit(member_ids: Iterable[int], source: str) -> None:
    ids = sorted(set(member_ids))
    if not ids:
        return
    transaction.on_commit(lambda: [enqueue_wake(member_id, source) for member_id in ids])
