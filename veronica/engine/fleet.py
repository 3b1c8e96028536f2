"""Many runs per worker process: a run waiting on its model costs a thread and a socket, not a process.

Why threads (and not asyncio, and not one process per run)
----------------------------------------------------------
A run spends seconds waiting on the vendor's HTTP stream and a millisecond or two of CPU per step.
A django-q2 worker process (~100 MB) held for the whole run made the host's concurrency its worker
count (4 by default). Here the q2 task only takes a free slot of the worker's own run pool and
hands the wake to one of its threads (started as the worker warms, each waiting for a wake), which claims the member (the same conditional UPDATE as
before) and runs it; the task returns at once and the worker takes the next wake while its runs
wait. A waiting thread costs its stack's touched pages and one socket (tens of KB), so a process
carries hundreds of runs.

Threads, not asyncio, because every layer below the run is synchronous and already correct: the
vendors' official SDK clients (sync, shared per process, cancelled by shutting the thread's socket,
veronica.agent.providers.sdk), Django's ORM and its transactions (the fence is `transaction.atomic`
on a thread-bound connection), bubblewrap'd commands and MCP stdio sessions. Rewriting all of that
async would change every invariant at once; a thread per run changes none of them. The GIL is no
limit: a step is 1-2 ms of CPU and the rest is waiting, which releases it.

What each run keeps, exactly as before
--------------------------------------
* Lease and fence: every write is still fenced by its own renew-and-check UPDATE on the database's
  clock (veronica.engine.slot). A SIGSTOPped process stops its heartbeat with its runs, so every
  lease it holds runs out and each run's next fence writes nothing; a SIGKILLed one leaves leases the
  watchdog expires and re-wakes (veronica.engine.leases) - per run, however many shared the process.
* Approvals run once: the held-call path is the run's own (veronica.agent.loop), unchanged.
* One heartbeat per *process*, not per run: every RUN_HEARTBEAT_SECONDS one statement renews all the
  leases the process holds and a second reads back their cancel flags (and whether each lease still
  holds). A waiting run's `should_stop` is then a memory read; before, each waiting run renewed on
  its own connection every second (500 statements a second for 500 waiting runs). The heartbeat
  renews only runs whose thread showed life within a lease (a step, a poll while its tool call runs,
  or a model call it is making): a hung run's lease runs out within two, and the watchdog takes its
  member back. That matters more now: q2's task timeout, once the hard stop of a run, bounds only the claim.
* While the heartbeat beats, a run makes its model call on its own thread, polling nothing: the beat
  that hears a stop or a lost lease pushes it into the call (sdk.interrupt shuts down the socket the
  run's thread is using). With the heartbeat lagging, the call goes to a helper thread and the run
  polls should_stop, as without a pool (veronica.agent.providers.sdk).
* A SIGKILL of one q2 worker *process* (the OOM killer's pick: with a run pool it is the largest)
  ends all its runs, each recovered by its lease. django-q2's workers share one multiprocessing task
  queue, and a worker killed while it waits in that queue's get() holds the queue's lock for good, so
  its cluster's other workers stop taking tasks; a run-pool worker waits there most of the time.
  This is django-q2's, not the pool's, but restart a cluster whose worker was killed (its leases
  and the other clusters carry its members meanwhile).

Connections
-----------
Django opens one connection per thread and keeps it; 500 runs would hold 500 PostgreSQL backends. A
run gives its connection back before it waits (the model call, a long tool step) and after each
fenced write when the process has a connection pool, so it holds one only while it writes. Hosted, a
worker with a run pool draws its connections from a per-process psycopg pool
(VERONICA_DB_POOL_SIZE, Django's native pooling): handing a connection back and taking one is a
queue operation, not a new backend (a new PostgreSQL connection costs a process fork on the server).
Embedded (SQLite), giving the connection back closes it (opening one is a file open).

Back-pressure and q2's semantics
--------------------------------
A worker takes a wake only when its pool has a free slot. A full worker hands the wake back to the
broker at once when another worker of its host has a free slot (room_elsewhere: the host's full
notes, veronica.engine.warm); else its task blocks on a slot first (so a wake fetched by a full host
waits, as it did behind a busy worker before) and hands the wake back if no slot frees within a
second (SLOT_WAIT_SECONDS), for another host, instead of it waiting a run's length behind the full
one. Several wakes fetched together come as one task (veronica.engine.runner.wake_all), each taking a
slot the same way; those that find none go back together, in order. The task returns (and q2
acks it) once the wake is in its thread, before the claim: a worker killed between the two loses the
wake as one killed with the wake in its queue always did (the wake-queued flag goes stale and the
tick's sweep rings again, veronica.engine.wakes); from the claim on, the lease, not q2, recovers a
dead run, as it did already. The claim is still the one conditional UPDATE: two wakes of one member
on two threads (or hosts) never both claim. Run threads are not daemons, so a recycled or stopped worker finishes
its runs before it exits (multiprocessing joins them); a killed one leaves expiring leases.

VERONICA_RUNS_PER_WORKER=1 turns the pool off: the task runs the member itself, as before.
"""
from __future__ import annotations

import contextvars
import functools
import logging
import multiprocessing
import threading
import time
from typing import Callable

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now

from veronica.agent.providers import sdk
from veronica.engine import gather
from veronica.engine.slot import CLAIM_MANY_MOST, lease_delta
from veronica.models import Member

log = logging.getLogger(__name__)

# How long a wake waits for a free run slot before it goes back to the broker (another worker, or this
# one later, takes it). Short: a slot of a full pool frees only when one of its runs ends, a run's length
# later, while a worker beside it may have free slots. With 30 s, the one wake the full worker of two had
# taken (its task thread is free until it holds one) started 15 s after the other 499 of 500 members
# (bench/fleet.py), and the fleet's completion was that straggler's. When every worker is full a wake
# goes round the broker about once a second per worker, a list push and pop.
SLOT_WAIT_SECONDS = 1.0


class RunThreads:
    """A pool's run threads: each waits for a body, runs it, and waits again. Not daemons: a recycled or
    stopped worker finishes its runs before it exits (at the interpreter's thread shutdown, an idle thread
    is told to end, a busy one ends after its run, and the process joins them).

    The thread that went idle last takes the next run (a stack, not a queue): a worker with 256 slots and
    16 runs at once keeps using about 16 threads, whose stacks and per-thread state (Django's connection
    wrappers, the SDK's per-thread state) are already there, instead of cycling through all 256 and giving
    each its own (the worker's RSS grew 6 % over 100,000 steps that way, against 1.6 % with a thread per run)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._back = threading.Condition(self._lock)  # a thread went idle
        self._idle: list[_RunThread] = []
        self._started = 0
        self._closing = False
        threading._register_atexit(self.shutdown)  # (what concurrent.futures' executors use for the same)

    def prestart(self) -> None:
        with self._lock:
            missing, self._started = self.size - self._started, self.size
        threads = [_RunThread(self, n) for n in range(missing)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.ready.wait(timeout=60)

    def submit(self, fn: Callable[[], object]) -> None:
        """fn on an idle thread (the last to go idle), or a new one while fewer than size were started."""
        with self._lock:
            # Every thread busy while the pool's slots let this run in: a run gave its slot back and its
            # thread is on its way back here (microseconds). Wait for it.
            self._back.wait_for(lambda: self._closing or self._idle or self._started < self.size, timeout=30)
            if self._closing:
                raise RuntimeError("the run threads are shutting down")
            thread = self._idle.pop() if self._idle else None
            if thread is None:
                if self._started >= self.size:
                    raise RuntimeError("no run thread came back within 30 s")
                self._started += 1
        if thread is None:
            thread = _RunThread(self, self._started)
            thread.body = fn
            thread.start()
        else:
            thread.give(fn)

    def back(self, thread: "_RunThread") -> bool:
        """A thread's run ended: it waits for the next (False: the pool is closing, the thread ends)."""
        with self._lock:
            if self._closing:
                return False
            self._idle.append(thread)
            self._back.notify()
            return True

    def shutdown(self, wait: bool = False) -> None:
        with self._lock:
            self._closing = True
            idle, self._idle = self._idle, []
        for thread in idle:
            thread.give(None)
        if wait:
            for thread in idle:
                thread.join()


class _RunThread(threading.Thread):
    def __init__(self, threads: RunThreads, n: int) -> None:
        super().__init__(name=f"run_{n}")
        self.threads = threads
        self.body: Callable[[], object] | None = None
        self.ready = threading.Event()  # set once this thread waits for its first body
        self._go = threading.Semaphore(0)

    def give(self, body: Callable[[], object] | None) -> None:
        self.body = body
        self._go.release()

    def run(self) -> None:
        body = self.body
        if body is None:  # prestarted: wait for the first
            waiting = self.threads.back(self)
            self.ready.set()  # (also when the pool is closing: prestart() waits for no one then)
            if not waiting:
                return
            self._go.acquire()
            body = self.body
        while body is not None:
            self.body = None
            try:
                body()
            except BaseException:  # (RunPool.start's target catches its run's errors: a last resort)
                log.exception("run thread %s: its body raised", self.name)
            if not self.threads.back(self):
                return
            self._go.acquire()
            body = self.body


class RunPool:
    """The runs of one worker process: a bounded set of run threads and their shared heartbeat."""

    def __init__(self, size: int, *, heartbeat: bool = True, on_full: Callable[[bool], None] | None = None,
                 room_elsewhere: Callable[[], bool] = lambda: False) -> None:
        self.size = size
        self._on_full = on_full  # told True when the last free slot is taken, False when one frees again
        self.room_elsewhere = room_elsewhere  # whether another worker of this host has a free slot (warm's full notes)
        self._slots = threading.BoundedSemaphore(size)
        self._free = size  # (the semaphore's count, which it does not tell) for the host's full note
        self._free_lock = threading.Lock()
        self._threads = RunThreads(size)
        self.claims = gather.Gathering(CLAIM_MANY_MOST)  # the runs' first claims, gathered (veronica.engine.runner)
        self._lock = threading.Lock()
        self._leases: dict[int, object] = {}  # member id -> its RunLease, while its run thread lives
        self._beat_at = float("-inf")  # the last beat that read every lease back (time.monotonic)
        if heartbeat:
            threading.Thread(target=self._heartbeat, name="run-heartbeat", daemon=True).start()

    # --- slots ---------------------------------------------------------------------------------
    def reserve(self) -> bool:
        # a third of q2's task timeout at most: a task past it gets its worker killed, runs and all
        return self._took(self._slots.acquire(timeout=min(SLOT_WAIT_SECONDS, settings.Q_TIMEOUT / 3)))

    def try_reserve(self) -> bool:
        """A free slot now, or False at once (a worker starting runs of its own: the rest go to the broker)."""
        return self._took(self._slots.acquire(blocking=False))

    def _took(self, got: bool) -> bool:
        """A slot was taken: the last one puts up this worker's full note (on_full: a q2 worker's is
        veronica.engine.warm.note_full), so the host's pusher fetches no wake every worker would hand back."""
        if got:
            with self._free_lock:  # the note follows the count in order: never left up with a slot free
                self._free -= 1
                if self._free == 0 and self._on_full is not None:
                    self._on_full(True)
        return got

    def _give_back(self) -> None:
        with self._free_lock:
            self._free += 1
            if self._free == 1 and self._on_full is not None:
                self._on_full(False)
        self._slots.release()

    def prestart(self) -> None:
        """Start every run thread now, as the worker warms, instead of one per wake. The worker's main
        thread takes q2's tasks one at a time, and starting a thread made it wait for the new thread to
        run (a GIL handoff among the pool's busy runs, milliseconds each): 500 members woken at once
        started over seconds (bench/fleet.py). Handing a wake to a waiting thread is a semaphore release."""
        self._threads.prestart()

    def start(self, body: Callable[[], object], *, name: str) -> None:
        """Run body (a wake's claim and its run, to the finish) on a run thread; the slot reserved for
        it is given back when it ends, however it ends. Each run starts in an empty context, as on a
        thread of its own: nothing a run set in a context variable is seen by the next run of its thread."""
        def target() -> None:
            threading.current_thread().name = name
            try:
                body()
            except BaseException:  # the run's own handler logs its errors; this is the last resort
                log.exception("run thread %s ended with an error", name)
            finally:
                connections.close_all()
                self._give_back()

        try:
            self._threads.submit(functools.partial(contextvars.Context().run, target))
        except BaseException:
            self._give_back()
            raise

    def idle(self) -> None:
        """A run of this pool is about to wait (a model call, a long tool step): its connection goes back."""
        release_connection()

    def after_write(self) -> None:
        """A run's fenced write committed: with a connection pool, its connection goes back at once."""
        if pooled_connections():
            release_connection()

    def register(self, lease) -> None:
        """The heartbeat renews this lease from now on (called on the run's thread) and pushes a stop it
        hears to the model call the run makes: while the heartbeat beats, the call runs on the run's own
        thread and polls nothing; else on a helper, should_stop polled rarely (veronica.agent.providers.sdk)."""
        lease.beat = self
        lease.thread = threading.get_ident()
        sdk.interruptible(True, self.beating)
        with self._lock:
            self._leases[lease.member.pk] = lease

    def unregister(self, lease) -> None:
        """The run of this lease has ended: the heartbeat leaves it."""
        sdk.interruptible(False)
        lease.thread = None
        with self._lock:
            if self._leases.get(lease.member.pk) is lease:
                del self._leases[lease.member.pk]

    def beating(self) -> bool:
        """The heartbeat read the leases back lately: a stop or a lost lease reaches a run within a beat or
        so, pushed (sdk.interrupt). Lagging (the database is slow or away), a model call starts on a helper
        instead, its caller polling should_stop (which then renews on its own: slot.RunLease.should_stop)."""
        return time.monotonic() - self._beat_at < 3 * settings.RUN_HEARTBEAT_SECONDS

    def running(self) -> int:
        with self._lock:
            return len(self._leases)

    # --- the heartbeat ---------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        dedicate_connection()
        while True:
            time.sleep(settings.RUN_HEARTBEAT_SECONDS)
            try:
                self.beat_once()
            except Exception:  # the database is away: the runs' own fences notice; keep beating
                log.warning("run heartbeat failed", exc_info=True)
                connections.close_all()

    def beat_once(self) -> None:
        """Renew every lease this process holds in one statement, then read back, in a second, which
        still hold and which were asked to stop: the runs' should_stop reads that, not the database."""
        started = time.monotonic()
        with self._lock:
            leases = list(self._leases.values())
        if not leases:
            self._beat_at = started
            return
        ids = [lease.member.pk for lease in leases]
        # Only runs whose thread showed life within a lease (a step, a poll while its tool call runs, a model
        # call it makes inline, which polls nothing): a hung run stops being renewed and its lease runs out,
        # as when each run renewed its own. A call is bounded by its read timeout, as it was on a helper.
        recent = started - settings.RUN_LEASE_SECONDS
        live = [lease for lease in leases if lease.touched >= recent or sdk.calling(lease.thread)]
        if live:
            Member.objects.filter(pk__in=[lease.member.pk for lease in live], lease_token__in=[lease.token for lease in live],
                                  lease_expires_at__gt=Now()).update(lease_expires_at=Now() + lease_delta())
        held = ExpressionWrapper(Q(lease_expires_at__gt=Now()), output_field=BooleanField())
        rows = {pk: (token, cancel, alive) for pk, token, cancel, alive in Member.objects.filter(pk__in=ids).annotate(
            alive=held).values_list("pk", "lease_token", "cancel_requested", "alive")}
        if connections[DEFAULT_DB_ALIAS].settings_dict["OPTIONS"].get("pool"):  # (the heartbeat's own stays open)
            release_connection()
        for lease in leases:
            token, cancel, alive = rows.get(lease.member.pk, ("", False, False))
            lease.heard(token == lease.token and bool(alive), bool(cancel))
        self._beat_at = started


_pool: RunPool | None = None
_pool_lock = threading.Lock()


def current() -> RunPool | None:
    """This process's run pool, or None: the wake runs its member on the task's own thread."""
    return _pool


def enable(on_full: Callable[[bool], None] | None = None, room_elsewhere: Callable[[], bool] = lambda: False) -> RunPool | None:
    """In a q2 worker, as it spawns (veronica.engine.warm): start the run pool, and the connection pool
    its runs share (PostgreSQL). Settings: VERONICA_RUNS_PER_WORKER, VERONICA_DB_POOL_SIZE."""
    global _pool
    size = settings.RUNS_PER_WORKER
    if size <= 1 or multiprocessing.parent_process() is None:
        return None  # off, or not a worker forked by a cluster (a test sending q2's spawn signal)
    with _pool_lock:
        if _pool is None:
            use_connection_pool()
            _pool = RunPool(size, on_full=on_full, room_elsewhere=room_elsewhere)
            _pool.prestart()
    return _pool


def use_connection_pool() -> None:
    """Django's psycopg pool for this process (a forked worker builds its own: the pool is made on first
    use, after the fork). A pooled connection is not kept per thread (CONN_MAX_AGE 0 hands it back at
    close) and is checked by the pool only when handed back broken, not by a round trip per use."""
    db = connections.settings[DEFAULT_DB_ALIAS]
    if db["ENGINE"] != "django.db.backends.postgresql" or not settings.DB_POOL_SIZE:
        return
    connections.close_all()
    db["CONN_MAX_AGE"] = 0
    db["CONN_HEALTH_CHECKS"] = False
    db["OPTIONS"]["pool"] = {"min_size": 1, "max_size": settings.DB_POOL_SIZE, "timeout": 30}


def dedicate_connection() -> None:
    """This thread's connection is its own, opened directly and kept, not drawn from the process's pool:
    the heartbeat's. When a burst of runs queued on the pool (500 members woken at once, eight
    connections a worker), a beat waiting there behind them went silent; each run then renewed its own
    lease, on the same pool, and more of them waited: a few hundred leases ran out with their runs
    alive (bench/fleet.py). The one statement a second that keeps every lease of the process must not
    queue behind the writes of the runs it keeps."""
    conn = connections[DEFAULT_DB_ALIAS]
    options = conn.settings_dict.get("OPTIONS") or {}
    if options.get("pool"):
        conn.close()
        conn.settings_dict = {**conn.settings_dict, "OPTIONS": {k: v for k, v in options.items() if k != "pool"}}


def pooled_connections() -> bool:
    return bool(connections.settings[DEFAULT_DB_ALIAS]["OPTIONS"].get("pool"))


def release_connection() -> None:
    """Give this thread's connection back (to the pool, or closed) unless a transaction holds it."""
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.connection is not None and not conn.in_atomic_block:
        conn.close()
