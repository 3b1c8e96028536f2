"""`manage.py qcluster`, Veronica's way: django-q2's cluster plus what every worker host needs.

* the q2 schedules are ensured (idempotently) before any worker starts, on every host, so the
  documented recipe `migrate` + `daphne` + `qcluster` needs no extra step;
* the engine ticker runs in this (the cluster's main) process: started after q2 forked its
  sentinel, so no worker is ever forked from a process with a live ticker thread;
* the host's database-outage note (veronica.engine.outage) is named before q2 forks, so the
  pusher, the workers and the ticker share it;
* SIGTERM / SIGINT stop q2 gracefully, bounded by VERONICA_Q_STOP_GRACE: past it (a worker stuck
  on a database it cannot reach, a run that does not end) the whole process tree is SIGKILLed,
  which is always safe (runs hold leases that expire and are re-woken elsewhere);
* q2's sentinel is GuardedSentinel (veronica.engine.qguard): a worker SIGKILLed while it waits for
  a task no longer stalls the cluster's task queue for good.
"""
from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading

from django.conf import settings
from django.db import DatabaseError, connections
import django_q.cluster
from django_q.cluster import Cluster
from django_q.management.commands.qcluster import Command as Q2Command

from veronica.engine import outage, warm
from veronica.engine.qguard import GuardedSentinel
from veronica.engine.ticker import Ticker
from veronica.plumbing import procstat
from veronica.portable.startup import ensure_schedules

log = logging.getLogger("veronica.qcluster")


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (q2's sentinel, its workers, monitor and pusher), from /proc."""
    children = procstat.children()
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree() -> None:
    pids = descendants(os.getpid())
    if not pids and os.getpgrp() == os.getpid():  # no /proc: we lead our group, take it down
        os.killpg(os.getpgrp(), signal.SIGKILL)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


STARTUP_BACKOFF_MAX = 10.0


def ensure_schedules_patiently(stopping: threading.Event) -> bool:
    """The schedules, retried with back-off while the database refuses (SQLite's write lock held by
    a stalled process, PostgreSQL restarting): a worker host that starts during an outage waits for
    it instead of crashing. False when a stop signal came first."""
    delay, failures = 0.5, 0
    while not stopping.is_set():
        try:
            ensure_schedules()
            if failures:
                log.warning("qcluster start-up: the database answered after %d failed attempts", failures)
            return True
        except DatabaseError as exc:
            failures += 1
            connections.close_all()
            log.warning("qcluster start-up: the database refused (%s: %s); retry %d in %.1fs", type(exc).__name__,
                        str(exc).strip()[:200], failures, delay)
            stopping.wait(delay)
            delay = min(delay * 2, STARTUP_BACKOFF_MAX)
    return False


class Command(Q2Command):
    help = "Start the django-q2 cluster with Veronica's engine ticker (schedules ensured, bounded stop)."

    def handle(self, *args, **options):
        settings.SECRET_KEY  # q2 signs tasks with it: fail now, not in a worker
        if options.get("cluster_name"):
            os.environ["Q_CLUSTER_NAME"] = options["cluster_name"]
        django_q.cluster.Sentinel = GuardedSentinel  # what Cluster.start forks (q2 takes no sentinel class)
        cluster = Cluster()
        ticker = Ticker()
        stopping = threading.Event()
        grace = settings.Q_STOP_GRACE

        def force_stop() -> None:
            log.error("qcluster did not stop within %ss of the signal; killing its workers (their runs' leases expire "
                      "and are re-woken elsewhere)", grace)
            kill_tree()
            os._exit(1)

        def on_signal(signum, frame) -> None:
            if stopping.is_set():
                return
            stopping.set()
            ticker.stop()
            timer = threading.Timer(grace, force_stop)
            timer.daemon = True
            timer.start()
            if cluster.sentinel is None:  # signalled before the sentinel was forked
                raise SystemExit(0)
            cluster.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        if not ensure_schedules_patiently(stopping):
            return
        # A cluster of this machine killed before us: its runs resume now, not a lease later. Its leases are
        # reaped by our first worker as it warms (veronica.engine.warm), which resumes them in its own run
        # pool with their starts read ahead. Reaped here, before the fork, their resumes waited in the broker
        # for the warm workers and reached them one task at a time: 250 resumes started 2.6-5.6 s after the
        # reap (bench/fleet.py, a host SIGKILLed and restarted).
        connections.close_all()  # never hand our socket to the forked sentinel and workers
        os.environ[outage.MARK_ENV] = os.path.join(tempfile.gettempdir(), f"veronica-db-outage-{os.getpid()}")
        outage.mark_up()  # (a note a recycled pid left behind)
        os.environ[warm.READY_ENV] = os.path.join(tempfile.gettempdir(), f"veronica-worker-ready-{os.getpid()}")
        warm.clear_ready()  # (the same) the pusher fetches once a worker of this cluster says it is warm
        cluster.start()
        if options.get("run_once", False) or stopping.is_set():
            cluster.stop()
            return
        ticker.start()
        while cluster.sentinel.is_alive() and not stopping.is_set():
            cluster.sentinel.join(0.5)
            ticker.watch()  # a beat stuck on the database: this host stops fetching wakes
        ticker.stop()
        if cluster.sentinel.is_alive():
            cluster.sentinel.join()
        ticker.join(timeout=2)  # hands the role back, so a follower takes over at its next beat
        outage.mark_up()
        warm.clear_ready()
