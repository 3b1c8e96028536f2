"""Wakes are doorbells: a django-q2 task per wake, enqueued only after the commit that caused it.

Mail wakes coalesce at the door. `Member.wake_queued_at` says "a wake is on its way, or a run holds
the slot and will look at the mailbox when it ends", and a mail ring (ring()) enqueues only for the
members whose flag it set, in one conditional UPDATE after the mail's commit: a second message to a
member whose wake is queued, or whose run is in flight, enqueues nothing. The handshake that keeps
every message's wake (see veronica.engine.slot and runner.wake):

* the claim re-stamps the flag in its own UPDATE: the run now owns it, and reads the mailbox after
  that commit, so mail committed before the claim is in the run's view;
* finish() clears the flag in the release's UPDATE, then rings once more if unread mail is left
  (mail that came after the run read its mailbox, including while finish() ran);
* a wake that claims nothing clears the flag if no run holds the slot, and tries the claim once
  more when it did: mail rung while it held the flag is seen by that second look;
* a flag nobody answers (its wake lost with a broker or a killed worker before the claim) stops
  suppressing rings STALE_SECONDS after it was set, when no run holds the slot; mail that rang
  in the meantime is re-woken by the tick's unread sweep (mail older than SWEEP_AFTER). A run that
  dies holding it is released by the lease watchdog, which clears it.

Resume and timer wakes are never suppressed (their claims have other gates); they are recovery or
schedule, and rare.
"""
from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from datetime import timedelta
from typing import Iterable

from django.db import connections, transaction
from django.db.models import DateTimeField, Exists, ExpressionWrapper, OuterRef, Q, Value
from django.db.models.functions import Now
from django.db.models.sql import UpdateQuery

log = logging.getLogger(__name__)

SOURCES = ("message", "task", "timer", "alarm", "resume")
MAIL_SOURCES = ("message", "task", "alarm")  # rung through the wake-queued flag
# A flag this old with no run holding the slot is taken for lost: the next ring enqueues again. As
# long as the tick sweep's SWEEP_AFTER, so a queue backlog this long costs at most one more wake.
STALE_SECONDS = 15.0


def enqueue_wake(member_id: int, source: str, *, front: bool = False, owe: bool = True) -> bool:
    """Put one wake on the broker now (False when the broker refused it). A refused wake is owed:
    the engine tick rings it again at its next pass (owe_ring), so mail sent while the broker was
    down waits one tick after it is back, not the unread sweep's SWEEP_AFTER."""
    if source not in SOURCES:
        raise ValueError(f"unknown wake source {source!r}")
    # A resume is recovery (a dead run's member, a decided approval, a retry whose backoff ran out):
    # it goes to the head of Redis's list, so the next free worker takes it rather than the
    # doorbells queued behind busy members. So does a wake a worker cut off from the database hands back.
    # save=False: a wake that succeeded leaves no q2 result row (its outcome is the Wake and Run rows).
    # Saving one cost q2's monitor a transaction per wake that locked its 200 newest results, and in
    # embedded mode the SQLite write lock the runs' steps wait on (a failed wake is still saved).
    front = front or source == "resume"
    broker = wake_broker(front=front)
    push = getattr(_pushing, "push", None)
    if push is not None and not front and push.takes(broker):
        push.add(member_id, source, owe)  # sent with the others (at the push's end, or when it is full)
        return True
    return _enqueue_alone(broker, member_id, source, owe)


def _enqueue_alone(broker, member_id: int, source: str, owe: bool) -> bool:
    try:
        _async_wake(broker, member_id, source)
    except Exception:
        log.warning("could not enqueue wake for member %s (%s); the engine tick rings it again", member_id, source, exc_info=True)
        if owe:  # (not when the database is known to be down as well: the sweep is the backstop then)
            owe_ring(member_id)
        return False
    return True


_pushing = threading.local()
PUSH_MOST = 256  # wakes in one push at most


class _Push:
    """The wakes enqueued inside one_push(), sent at its end; .failed: the members whose wake could not be."""

    def __init__(self) -> None:
        self.wakes: list[tuple[int, str, bool]] = []
        self.failed: list[int] = []

    @staticmethod
    def takes(broker) -> bool:
        from django_q.conf import Conf

        return callable(getattr(broker, "enqueue_many", None)) and not Conf.SYNC

    def add(self, member_id: int, source: str, owe: bool) -> None:
        self.wakes.append((member_id, source, owe))
        if len(self.wakes) >= PUSH_MOST:  # a long loop (a cron burst) does not hold its first wakes to its end
            self.send()

    def send(self) -> None:
        wakes, self.wakes = self.wakes, []
        if not wakes:
            return
        broker = wake_broker()
        if len(wakes) > 1:
            try:
                packed = _Packed(broker.list_key)
                for member_id, source, _ in wakes:
                    _async_wake(packed, member_id, source)
                broker.enqueue_many(packed.tasks)
                return
            except Exception:
                log.warning("could not enqueue %d wakes at once; each is enqueued on its own", len(wakes), exc_info=True)
        self.failed += [member_id for member_id, source, owe in wakes if not _enqueue_alone(broker, member_id, source, owe)]


@contextmanager
def one_push():
    """The wakes enqueue_wake is asked for inside the block go to the broker together at its end, in
    one push when the broker takes many (veronica.engine.qbroker: one RPUSH on Redis, one transaction
    of rows on the ORM broker); a push that fails sends each on its own, as enqueue_wake would have
    (a refused one owed). Resumes (the head of the list) and a queue that runs its tasks in place go
    at once, as before. Yields the push, whose .failed names the members whose wake was not enqueued.

    A commit that mails many members (a broadcast, the bench's 500) rang them one push each after it:
    500 round trips to Redis put half a second between the first wake queued and the last (hosted,
    bench/fleet.py), and on SQLite 500 write transactions each queued for the one write lock behind
    the runs' steps."""
    outer = getattr(_pushing, "push", None)  # (nested: this block sends its own, and names its own failures)
    push = _pushing.push = _Push()
    try:
        yield push
    finally:
        _pushing.push = outer
        push.send()  # (also when the block raised: each wake asked for was promised)


def _async_wake(broker, member_id: int, source: str) -> None:
    """q2's async_task of one wake onto this broker (the task as every wake has it)."""
    from django_q.tasks import async_task

    options = {"task_name": f"wake-{member_id}-{source}", "broker": broker, "save": False}
    async_task("veronica.engine.runner.wake", member_id, source, q_options=options)


class _Packed:
    """A broker that keeps the signed tasks async_task gives it: the one push sends them together."""

    def __init__(self, list_key: str) -> None:
        self.list_key = list_key
        self.tasks: list[str] = []

    def enqueue(self, task: str) -> None:
        self.tasks.append(task)


def owe_ring(member_id: int) -> None:
    """A wake the broker refused is owed: a retry due now (unless a failure streak is backing off,
    whose own retry time stands), which the tick's due_retries rings every pass until a run takes
    the slot. Best effort: when the database is down too, the unread sweep is the backstop."""
    from veronica.models import Member

    try:
        # Now() + 0 s, not Now(): on SQLite a bare Now() is stored in another text form than the
        # datetimes Django writes, and due_retries' conditional update compares retry_at for equality.
        due_now = ExpressionWrapper(Now() + Value(timedelta(0)), output_field=DateTimeField())
        Member.objects.filter(pk=member_id, failures=0).update(retry_at=due_now)
    except Exception:
        log.warning("could not record the owed wake of member %s", member_id, exc_info=True)


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
    """Ring these members once the current transaction commits (at once outside one). The rings of
    one transaction coalesce per source: 500 messages mailed in one commit ring with one flag UPDATE
    after it, not 500 one after another (the last of which woke its member a second late)."""
    ids = set(member_ids)
    if not ids:
        return
    conn = transaction.get_connection()
    if not conn.in_atomic_block:
        ring(ids, source)
        return
    _pending_ring(conn, source).update(ids)


def _pending_ring(conn, source: str) -> set[int]:
    """The ids a ring of `source`, to run after this transaction commits, will wake: this
    transaction's latest one, when a rollback that could still come discards it exactly when it
    would discard mail written now (it was registered inside every savepoint open now: the ones it
    had beyond those were released since, and a released savepoint rolls nothing back); else a new
    hook, registered here, whose fate is that of this savepoint (as a hook per message was)."""
    rings = conn.__dict__.setdefault("_veronica_rings", {})  # id(hook) -> (hook, source, ids)
    active = set(conn.savepoint_ids)
    for sids, func, _ in reversed(conn.run_on_commit):
        entry = rings.get(id(func))
        if entry is not None and entry[0] is func and entry[1] == source:
            if active <= sids:
                return entry[2]
            break
    live = {id(func) for _, func, _ in conn.run_on_commit}
    for stale in [key for key in rings if key not in live]:  # ran, or was discarded with a rollback
        del rings[stale]
    pending: set[int] = set()

    def hook() -> None:
        rings.pop(id(hook), None)
        ring(pending, source)

    rings[id(hook)] = (hook, source, pending)
    transaction.on_commit(hook)
    return pending


def ring(member_ids: Iterable[int], source: str, *, leftover: bool = False) -> list[int]:
    """Wake these members (call it after the commit that gave them work); the ids enqueued.

    A mail source enqueues only for members whose wake-queued flag this call set (one UPDATE ...
    RETURNING for all of them). leftover: finish()'s look at the mailbox, which also requires the
    member idle, active and with unread mail, in the same statement."""
    ids = sorted(set(member_ids))
    if not ids:
        return []
    if source not in MAIL_SOURCES:
        return [member_id for member_id in ids if enqueue_wake(member_id, source) is not False]
    rung = _set_flag(ids, leftover)
    with one_push() as push:
        for member_id in rung:
            if enqueue_wake(member_id, source) is False:
                drop_flag(member_id)  # nothing is queued: the next ring (or the sweep) tries again
    for member_id in push.failed:
        drop_flag(member_id)
    return rung


def drop_flag(member_id: int) -> bool:
    """Clear the flag unless a run holds the slot (its finish() clears it); True when it was set."""
    from veronica.models import Member

    return Member.objects.filter(pk=member_id, wake_queued_at__isnull=False, lease_token="").update(wake_queued_at=None) > 0


def flag_free() -> Q:
    """Which rows a mail ring may flag: no wake queued, or a lost one (stale, and no run holds the slot)."""
    stale = ExpressionWrapper(Now() - Value(timedelta(seconds=STALE_SECONDS)), output_field=DateTimeField())
    return Q(wake_queued_at__isnull=True) | Q(wake_queued_at__lt=stale, lease_token="")


_MEMBER = -918273600  # the sentinel ids the cached statement is compiled with
_flag_sql: dict[tuple, tuple[str, list, list[int]]] = {}


def _set_flag(ids: list[int], leftover: bool) -> list[int]:
    """UPDATE member SET wake_queued_at = now WHERE id IN (ids) AND <flag free> RETURNING id,
    compiled by the ORM once per shape (the ring is on the path from a commit to its run)."""
    from veronica.models import Member, Membership, Message, RunStatus

    conn = connections[Member.objects.db]
    key = (conn.alias, conn.vendor, len(ids), leftover, STALE_SECONDS)
    compiled = _flag_sql.get(key)
    if compiled is None:
        sentinels = [_MEMBER - i for i in range(len(ids))]
        qs = Member.objects.filter(flag_free(), pk__in=sentinels)
        if leftover:
            qs = qs.filter(Exists(Message.objects.filter(recipient=OuterRef("pk"), read_at__isnull=True)),
                           run_status=RunStatus.IDLE, membership=Membership.ACTIVE, removed_at__isnull=True)
        query = qs.query.chain(UpdateQuery)
        query.add_update_values({"wake_queued_at": Now()})
        sql, params = query.get_compiler(conn.alias).as_sql()
        params = list(params)
        at = [params.index(s) for s in sentinels]
        compiled = (sql + " RETURNING " + conn.ops.quote_name("id"), params, at)
        if len(ids) <= 8:  # a broadcast to many is rare: compiled afresh
            if len(_flag_sql) > 32:
                _flag_sql.clear()
            _flag_sql[key] = compiled
    sql, params, at = compiled
    params = list(params)
    for i, member_id in zip(at, ids):
        params[i] = member_id
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return sorted(row[0] for row in cursor.fetchall())
