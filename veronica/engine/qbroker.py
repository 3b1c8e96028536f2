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

import itertools
import logging
import os
import time
from collections import deque
from typing import Callable

import redis
from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.brokers.redis_broker import Redis
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from veronica.plumbing import doorbell
from veronica.engine import outage, warm

log = logging.getLogger(__name__)


# Wakes a pusher takes from the broker at once (the embedded one locks them in one statement, the
# hosted one pops them in one round trip): a burst of mail goes to the workers in a few fetches. Both
# keep what a fetch took in the pusher's hand and give q2's loop one task a dequeue (held, bundle_wakes).
TAKE_AT_ONCE = 32


class DoorbellORM(ORM):
    _bell: doorbell.QueueBell | None = None

    def enqueue(self, task):
        pk = super().enqueue(task)
        transaction.on_commit(doorbell.ring_queue, using=Conf.ORM)  # at once in autocommit, else after the commit
        return pk

    def enqueue_many(self, tasks: list[str]) -> None:
        """Every task's row in one transaction, and one ring after its commit (veronica.engine.wakes.one_push)."""
        now = timezone.now()
        with transaction.atomic(using=Conf.ORM):
            OrmQ.objects.using(Conf.ORM).bulk_create([OrmQ(key=self.list_key or Conf.CLUSTER_NAME, payload=task, lock=now)
                                                      for task in tasks])
            transaction.on_commit(doorbell.ring_queue, using=Conf.ORM)

    def dequeue(self):
        """As GatedRedis's: what one fetch took stays in the pusher's hand, and q2's loop gets one task
        (a bundle of the wakes at the hand's head) per dequeue, each past the gates. When the whole fetch
        went to q2 at once, the pusher put its tasks in q2's one-place queue one after another, and a
        worker whose run slots had all been taken meanwhile held each wake for SLOT_WAIT_SECONDS before
        handing it back: with a worker per host, 29 members woke 16 s late (bench/fleet.py, embedded, a
        host killed with such wakes in its queue)."""
        if not warm.wait_until_ready():  # no worker of this host is warm yet: leave the wakes to one that is
            return None
        if workers_full():
            self._give_back()
            return None
        hand = held(self)
        if not hand:
            hand.extend(self._take(max(Conf.BULK, TAKE_AT_ONCE)))
        if hand:
            return [bundle_wakes(hand)]
        self._wait(Conf.POLL)
        return None

    def _give_back(self) -> None:
        """The wakes in hand are due again at once, for a worker with room (their rows were locked for
        q2's retry, a quarter of an hour); their ids keep their place at the queue's head."""
        give_back(self, lambda taken: self.get_connection().filter(pk__in=[pk for pk, _ in taken]).update(lock=timezone.now()))

    def acknowledge(self, task_id):
        """A bundle's task is acknowledged for every wake it carried (bundle_wakes: its ack is their rows' ids)."""
        self.get_connection().filter(pk__in=task_id if isinstance(task_id, (tuple, list)) else [task_id]).delete()

    def fail(self, task_id):
        self.acknowledge(task_id)

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
    cut off from the database (veronica.engine.outage), before any of its workers is warm, or while
    every one of its workers has all its run slots taken (veronica.engine.warm): the wakes stay in
    Redis for a host that can run them now, instead of each being fetched here, tried and handed
    back, or held until the workers are ready.

    A burst is fetched several wakes at a time: q2's dequeue is one BLPOP per wake, and the pusher's
    next round trip to Redis sat between every two wakes its workers took, on a host busy with the
    burst's runs (500 wakes reached their workers over 1.5-2.5 s, bench/fleet.py). The pusher holds
    what one fetch took in its hand and gives q2's loop one wake per dequeue, so each wake still
    passes the gates above: a host that fills up, or is cut off, pushes the rest back to the head of
    the list, in order, for a host with room. The wakes in the hand die with the host (their members'
    flags go stale and the unread sweep rings them again, veronica.engine.wakes): at most TAKE_AT_ONCE,
    and only while the list held that many."""

    _counted = True  # LPOP's count (Redis 6.2): off for good on a server that refuses it

    def enqueue_many(self, tasks: list[str]) -> None:
        """Every task at the list's tail in one RPUSH (veronica.engine.wakes.one_push)."""
        self.connection.rpush(self.list_key, *tasks)

    def dequeue(self):
        if outage.is_down():
            self._give_back()
            time.sleep(GATE_PAUSE)
            return None
        if not warm.wait_until_ready():  # no worker of this host is warm yet: leave the wakes to one that is
            return None
        if workers_full():
            self._give_back()
            return None
        hand = held(self)
        if not hand:
            hand.extend(self._take() or ())
        return [bundle_wakes(hand)] if hand else None

    def _take(self):
        """The list's first wake (waiting for one up to a second, as q2's dequeue does), and with it up to
        TAKE_AT_ONCE - 1 more that are already there, in their order."""
        first = self.connection.blpop(self.list_key, 1)
        if not first:
            return None
        taken = [(None, first[1])]
        if self._counted:
            try:
                more = self.connection.lpop(self.list_key, TAKE_AT_ONCE - 1)
            except redis.ResponseError:  # a server before 6.2: one wake per round trip, as q2 fetches
                type(self)._counted = False
                more = None
            taken += [(None, task) for task in more or ()]
        return taken

    def _give_back(self) -> None:
        """The wakes in hand go back to the head of the list, in their order."""
        give_back(self, lambda taken: self.connection.lpush(self.list_key, *reversed([task for _, task in taken])))


# Wakes at the hand's head that go to a worker as one task (runner.wake_all). In a burst each q2 task is
# one hand-over from the pusher to a worker's task thread through q2's one-place queue, and that thread
# answers among its run pool's busy threads: 500 wakes reached their workers over 1.4-1.7 s (bench/fleet.py),
# the pusher waiting a few milliseconds on a worker between every two. A bundle is still gated as one
# wake is (above), and a worker without room for all of it hands the rest back to the list's head at once.
BUNDLE_MOST = 16
WAKE_FUNC = "veronica.engine.runner.wake"
BUNDLE_FUNC = "veronica.engine.runner.wake_all"


def held(broker) -> deque:
    """A pusher's hand: the (ack id, package) pairs its last fetch took that q2's loop has not had yet."""
    hand = broker.__dict__.get("_hand")
    if hand is None:
        hand = broker.__dict__["_hand"] = deque()
    return hand


def give_back(broker, put_back: Callable[[list], object]) -> None:
    """Empty a pusher's hand through put_back (its (ack id, package) pairs, in order). A broker that is
    away too loses them, as wakes lost with a host: their flags go stale and the unread sweep rings again."""
    hand = held(broker)
    if not hand:
        return
    taken = list(hand)
    hand.clear()
    try:
        put_back(taken)
    except Exception:
        log.warning("could not give %d fetched wake(s) back to the broker; the unread sweep rings them again",
                    len(taken), exc_info=True)


def bundle_wakes(hand: deque):
    """The hand's first task; with the wakes right behind it, one task carrying up to BUNDLE_MOST wakes,
    when it is a wake and this host's workers have run pools (settings.RUNS_PER_WORKER). Any other task
    goes alone, in its place. A bundle's ack id is its wakes' (a tuple of the queue table's row ids,
    DoorbellORM.acknowledge), or None as each of Redis's is (a popped wake needs no ack)."""
    first = hand.popleft()
    if settings.RUNS_PER_WORKER <= 1:
        return first
    wakes = []
    for _, package in (first, *itertools.islice(hand, BUNDLE_MOST - 1)):
        task = _wake_of(package)
        if task is None:
            break
        wakes.append(task)
    if len(wakes) < 2:
        return first
    acks = [first[0]] + [hand.popleft()[0] for _ in wakes[1:]]
    bundle = {**wakes[0], "func": BUNDLE_FUNC, "args": ([tuple(task["args"]) for task in wakes],),
              "name": f"wakes-{len(wakes)}-{wakes[0]['name']}"}
    return (None if first[0] is None else tuple(acks)), SignedPackage.dumps(bundle)


def _wake_of(package):
    """The q2 task a package holds, if it is a wake (anything unreadable is left to q2's pusher to report)."""
    try:
        task = SignedPackage.loads(package)
    except Exception:
        return None
    return task if isinstance(task, dict) and task.get("func") == WAKE_FUNC and not task.get("kwargs") else None


def workers_full() -> bool:
    """Every worker of this host has all its run slots taken: fetch nothing now (look again shortly)."""
    if warm.host_full(Conf.WORKERS):
        time.sleep(warm.FULL_PAUSE)
        return True
    return False


GATE_PAUSE = 0.5  # how often a cut-off pusher looks at the note again
