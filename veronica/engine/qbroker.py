"""The embedded mode's broker: django-q2's ORM broker with a doorbell in front of its poll.

The ORM broker's pusher polls the queue table every `poll` seconds (0.1): a wake waited 50 ms for
it on average and up to the whole interval (the p99 of embedded wakes was the poll). Here enqueue
rings the pushers on this database over the embedded doorbell (veronica.plumbing.doorbell: Unix datagram
sockets beside the SQLite file) once the task's row is committed, and an empty poll waits on that
ring instead of sleeping, so a wake is fetched as soon as it is committed. The table stays the
durable path: a ring says "look", never carries the task, and the wait still ends after `poll`, so
a lost or late ring costs at most the old poll interval.

Hosted mode keeps django-q2's Redis broker (BLPOP, no poll), gated: a host cut off from the
database fetches nothing (GatedRedis, below). Set VERONICA_Q_DOORBELL=0 for the
stock ORM broker (the benches compare both).
"""
from __future__ import annotations

import logging
import os
import time

from django.db import transaction
from django_q.brokers.orm import ORM
from django_q.brokers.redis_broker import Redis
from django_q.conf import Conf

from veronica.plumbing import doorbell
from veronica.engine import outage, warm

log = logging.getLogger(__name__)


class DoorbellORM(ORM):
    _bell: doorbell.QueueBell | None = None

    def enqueue(self, task):
        pk = super().enqueue(task)
        transaction.on_commit(doorbell.ring_queue, using=Conf.ORM)  # at once in autocommit, else after the commit
        return pk

    def dequeue(self):
        if not warm.wait_until_ready():  # no worker of this host is warm yet: leave the wakes to one that is
            return None
        tasks = self.get_connection().filter(key=self.list_key, lock__lt=self._now())[0:Conf.BULK]
        if tasks:
            taken = []
            for task in tasks:
                if self.get_connection().filter(id=task.id, lock=task.lock).update(lock=self.timeout(task)):
                    taken.append((task.pk, task.payload))
                # else another cluster was faster to it
            return taken
        self._wait(Conf.POLL)
        return None

    @staticmethod
    def _now():
        from django.utils import timezone

        return timezone.now()

    def _wait(self, timeout: float) -> None:
        bell = self._bell
        if bell is None or bell.pid != os.getpid():  # the sentinel built us; the pusher is a fork
            try:
                bell = self._bell = doorbell.QueueBell()
            except OSError:
                log.warning("the queue's doorbell could not be bound; polling every %.2fs", timeout, exc_info=True)
                self._bell = None
                import time

                time.sleep(timeout)
                return
        bell.wait(timeout)


class GatedRedis(Redis):
    """Hosted mode's broker: django-q2's Redis broker whose pusher fetches nothing while this host is
    cut off from the database (veronica.engine.outage), or before any of its workers is warm
    (veronica.engine.warm): the wakes stay in Redis for a host that can run them now, instead of each
    being fetched here, tried and handed back, or held until the workers are ready."""

    def dequeue(self):
        if outage.is_down():
            time.sleep(GATE_PAUSE)
            return None
        if not warm.wait_until_ready():  # no worker of this host is warm yet: leave the wakes to one that is
            return None
        return super().dequeue()


GATE_PAUSE = 0.5  # how often a cut-off pusher looks at the note again
