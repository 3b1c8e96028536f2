"""A django-q2 cluster that survives a worker SIGKILLed while it waits for a task.

q2's workers share one multiprocessing task queue, and the worker waiting for the next task holds
the queue's read lock (a POSIX semaphore) for as long as it waits. SIGKILL it there (the OOM
killer's pick: a worker with a run pool is the cluster's largest process, and it waits there most
of the time) and the lock is never released: the sentinel forks a new worker, but it and every
other worker queue behind the dead one's lock, the pusher blocks on the full queue, and the cluster
takes no wake again while it still looks alive (the runs already in flight finish).

GuardedSentinel is q2's sentinel (the process that owns the queues and forks the workers) over a
task queue that knows its reader (GuardedQueue: the pid holding the read lock while it waits for a
task). A worker that dies holding it has the lock given back at once, as the sentinel replaces it, so
a worker killed mid-fleet costs its cluster no stall: its replacement reaps the dead one's run leases
as it spawns (veronica.engine.holders) and takes their resumes.

Two instants are not covered by the reader mark: a kill between taking the lock and writing the mark,
or between clearing it and giving the lock back (a few bytecodes each). For those, a thread of the
sentinel notices the stall and releases the lock on the dead worker's behalf. It acts only when
all of these hold: a worker died while idle (waiting for a task) since the last release; a task has
waited in the queue for STALL_SECONDS while a live worker was idle the whole time; the lock is held;
and no live worker is stopped (SIGSTOP: a frozen reader, which must not find a second one beside it
when it goes on). A live idle worker takes a waiting task within milliseconds, so the only holder
left is the dead one, and nobody alive is reading the queue's pipe when the lock is given back.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.reduction import ForkingPickler

from django_q.cluster import Sentinel
from django_q.pusher import pusher
from django_q.conf import Conf
from django_q.queues import Queue

from veronica.plumbing import procstat

log = logging.getLogger("veronica.qguard")

STALL_SECONDS = 5.0
GATEWAY_RETRY = 5.0  # a model gateway that will not start again is tried this often
LOOK_EVERY = 0.5
IDLE = -1  # q2's worker timer: -1 idle (waiting for a task), > 0 running one, 0 timed out, -2 recycled


def raw(value) -> float:
    """A multiprocessing Value read without its lock (a dead process may hold that lock too)."""
    return value.get_obj().value


class GuardedQueue(Queue):
    """q2's task queue, whose blocking get() marks the process holding the read lock while it waits
    (the worker's `iter(task_queue.get, "STOP")`): the sentinel can tell whether a dead worker took
    the lock with it. Other gets are q2's own (the mark is for the wait that lasts)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reader = multiprocessing.RawValue("i", 0)  # written only by the lock's holder (or for a dead one)

    def __getstate__(self):
        return super().__getstate__() + (self.reader,)

    def __setstate__(self, state):
        super().__setstate__(state[:-1])
        self.reader = state[-1]

    def get(self, block=True, timeout=None):
        if not block or timeout is not None:
            return super().get(block, timeout)
        # multiprocessing.Queue.get's blocking path, with the mark around the wait
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")
        with self._rlock:
            self.reader.value = os.getpid()
            try:
                res = self._recv_bytes()
            finally:
                self.reader.value = 0
        self._sem.release()
        self.size.increment(-1)
        return ForkingPickler.loads(res)

    def release_for(self, pid: int) -> bool:
        """`pid` (dead) held the read lock: give it back. False when it did not."""
        if not pid or self.reader.value != pid:
            return False
        self.reader.value = 0
        self._rlock.release()  # a non-recursive SemLock: any process may post it
        return True


class QueueGuard:
    """The stall check, on the sentinel's queue and worker pool (kept apart from q2's class to be tested)."""

    def __init__(self, sentinel, clock=time.monotonic) -> None:
        self.sentinel, self.clock = sentinel, clock
        self.idle_deaths = 0  # workers that died while idle, counted by the sentinel
        self.handled = 0  # ... of which a release has answered
        self.stalled_since: float | None = None
        self.releases = 0

    def worker_died(self, process) -> None:
        """The sentinel is about to replace a dead worker: note it if it died waiting for a task."""
        if not process.is_alive() and raw(process.timer) == IDLE:
            self.idle_deaths += 1

    def stalled(self) -> bool:
        """A task waits in the queue while a live worker is idle (and none is stopped)."""
        queue = self.sentinel.task_queue
        workers = [p for p in list(self.sentinel.pool) if p.is_alive()]
        waiting = raw(queue.size.count) > 0
        idle = any(raw(p.timer) == IDLE for p in workers)
        return waiting and idle and not any(procstat.stopped(p.pid) for p in workers)

    def look(self) -> bool:
        """One look; True when it released the lock."""
        if self.idle_deaths <= self.handled or not self.stalled():
            self.stalled_since = None
            return False
        now = self.clock()
        if self.stalled_since is None:
            self.stalled_since = now
            return False
        if now - self.stalled_since < STALL_SECONDS:
            return False
        self.stalled_since = None
        self.handled = self.idle_deaths
        lock = self.sentinel.task_queue._rlock
        if lock._semlock._get_value() != 0:
            return False  # not held: the stall is something else (a starved host); nothing to give back
        lock.release()  # a non-recursive SemLock: any process may post it
        self.releases += 1
        log.critical("the task queue stalled %.0fs behind a read lock held by a worker that died waiting for a task; "
                     "released it for the dead worker", STALL_SECONDS)
        return True

    def run(self) -> None:
        while True:
            time.sleep(LOOK_EVERY)
            try:
                self.look()
            except Exception:  # the guard must never take the sentinel down
                log.warning("queue guard look failed", exc_info=True)


class WatchedWait:
    """The sentinel's stop event, marking while q2's guard loop waits on it: then (and only then) the loop
    is not walking its pool, and a SIGCHLD handler may replace a dead worker itself. each_cycle: called
    on the guard loop's thread before each wait (a look of ours beside q2's, at its guard cycle)."""

    def __init__(self, event, each_cycle=None) -> None:
        self.event, self.waiting, self.each_cycle = event, False, each_cycle

    def wait(self, timeout=None):
        if self.each_cycle is not None and not self.event.is_set():
            try:
                self.each_cycle()
            except Exception:  # the guard loop must go on
                log.warning("the sentinel's own look failed", exc_info=True)
        self.waiting = True
        try:
            return self.event.wait(timeout)
        finally:
            self.waiting = False

    def __getattr__(self, name):
        return getattr(self.event, name)


class GuardedSentinel(Sentinel):
    """q2's sentinel with the QueueGuard beside its guard loop (see the module docstring). It also
    replaces a dead worker on its SIGCHLD (child_died) and preloads what the workers it forks later
    inherit (veronica.engine.warm.preload)."""

    def start(self):
        from django.conf import settings

        from veronica.agent.providers import gateway

        # before any worker is forked: they inherit where the host's model gateway listens
        self.gateway = gateway.spawn() if settings.MODEL_GATEWAY else None
        # q2 made its queue in __init__, which calls start(): nothing has used it yet
        self.task_queue = GuardedQueue(maxsize=Conf.QUEUE_LIMIT) if Conf.QUEUE_LIMIT else GuardedQueue()
        self.queue_guard = QueueGuard(self)
        threading.Thread(target=self.queue_guard.run, name="queue-guard", daemon=True).start()
        super().start()

    def guard(self):
        # q2 has forked the first workers, the monitor and the pusher: what is loaded from here on is
        # inherited by the workers forked later only (veronica.engine.warm.preload). The cluster is
        # told it runs first (q2's guard says so again): its start does not wait for the imports.
        from veronica.engine import warm

        self.start_event.set()
        warm.preload()
        self.stop_event = WatchedWait(self.stop_event, each_cycle=self.keep_gateway)
        self.guard_pid = os.getpid()
        signal.signal(signal.SIGCHLD, self.child_died)
        super().guard()

    def stop(self):
        from veronica.agent.providers import gateway

        try:
            super().stop()
        finally:
            gateway.stop(getattr(self, "gateway", None))

    def keep_gateway(self) -> None:
        """A dead model gateway is started again, on the guard loop's thread (the one that forks workers),
        at most every GATEWAY_RETRY seconds while it fails to start."""
        from veronica.agent.providers import gateway

        process = getattr(self, "gateway", None)
        if process is None or process.poll() is None or time.monotonic() < getattr(self, "gateway_retry_at", 0.0):
            return
        self.gateway_retry_at = time.monotonic() + GATEWAY_RETRY
        self.gateway = gateway.respawn(process)

    def spawn_pusher(self):
        return self.spawn_process(push_then_give_back, self.task_queue, self.event_out, self.broker)

    def spawn_process(self, target, *args):
        """q2's spawn; a worker is then held to a CPU of its own (veronica.engine.cpupin)."""
        from django.conf import settings

        from veronica.engine import cpupin

        process = super().spawn_process(target, *args)
        if process in self.pool and settings.Q_PIN_WORKERS:
            cpupin.pin_worker(process.pid, [other.pid for other in self.pool if other is not process and other.is_alive()])
        return process

    def child_died(self, signum=None, frame=None) -> None:
        """SIGCHLD: a worker that died is replaced now, not at the guard loop's next look (up to q2's
        guard_cycle, 0.5 s, later): its replacement reaps the dead one's runs and resumes them, so every
        resume waited for that look (bench/fleet.py, a worker SIGKILLed mid-way). Only while the loop
        waits (it walks the pool otherwise, and replaces the dead itself); never in a process forked
        from here, which inherits the handler."""
        if os.getpid() != getattr(self, "guard_pid", None) or not getattr(self.stop_event, "waiting", False):
            return
        if self.stop_event.is_set():  # the cluster is stopping: its workers end, none is replaced
            return
        try:
            for process in list(self.pool):
                if not process.is_alive():
                    self.reincarnate(process)
        except Exception:  # the guard loop's next look replaces it as before
            log.warning("could not replace a dead worker on its SIGCHLD", exc_info=True)

    def reincarnate(self, process):
        if process in self.pool:
            if not process.is_alive() and self.task_queue.release_for(process.pid):
                log.critical("worker %s died holding the task queue's read lock (waiting for a task); given back at once",
                             process.pid)
            else:
                self.queue_guard.worker_died(process)
        super().reincarnate(process)


def push_then_give_back(task_queue, event, broker=None) -> None:
    """q2's pusher; on its way out (the cluster stops) the wakes still in its hand go back to the broker
    (veronica.engine.qbroker.GatedRedis takes a burst several at a time), for the workers left."""
    try:
        pusher(task_queue, event, broker)
    finally:
        give_back = getattr(broker, "_give_back", None)
        if give_back is not None:
            give_back()
