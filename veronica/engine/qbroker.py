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

from django.db import connections, transaction
from django_q.brokers.orm import ORM
from django_q.brokers.redis_broker import Redis
from django_q.conf import Conf
from django_q.models import OrmQ

from veronica.plumbing import doorbell
from veronica.engine import outage, warm

log = logging.getLogger(__name__)


# Wakes the embedded pusher locks per statement: a burst of mail goes to the workers in a few writes.
# (q2's pusher then hands them over one at a time as the workers take them, as before.)
TAKE_AT_ONCE = 32


class DoorbellORM(ORM):
    _bell: doorbell.QueueBell | None = None

    def enqueue(self, task):
        pk = super().enqueue(task)
        transaction.on_commit(doorbell.ring_queue, using=Conf.ORM)  # at once in autocommit, else after the commit
        return pk

    def dequeue(self):
        if not warm.wait_until_ready():  # no worker of this host is warm yet: leave the wakes to one that is
            return None
        taken = self._take(max(Conf.BULK, TAKE_AT_ONCE))
        if taken:
            return taken
        self._wait(Conf.POLL)
        return None

    def _take(self, limit: int) -> list[tuple[int, str]]:
        """Lock up to `limit` due tasks in ONE statement (q2's broker: a select, then an UPDATE per
        task, each its own write transaction). On SQLite every write queues for the one write lock
        behind the runs' steps: with 500 wakes at once, a wake's own write transaction per task put
        seconds between the first member started and the last (bench/fleet.py, embedded). A task
        another cluster locked meanwhile is not in the UPDATE's rows (its lock is no longer due)."""
        self.get_connection()  # q2's stale-connection check, outside a transaction
        conn = connections[Conf.ORM]
        now, until = (conn.ops.adapt_datetimefield_value(value) for value in (self._now(), self.timeout(None)))
        table, key, lock = (conn.ops.quote_name(name) for name in (OrmQ._meta.db_table, "key", "lock"))
        with conn.cursor() as cursor:
            cursor.execute(f"UPDATE {table} SET {lock} = %s WHERE id IN (SELECT id FROM {table} WHERE {key} = %s AND {lock} < %s "
                           f"ORDER BY id LIMIT %s) AND {lock} < %s RETURNING id, payload",
                           [until, self.list_key, now, limit, now])
            return sorted(cursor.fetchall())

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
