"""A q2 worker SIGKILLed while it waits for a task (holding the shared task queue's read lock) does
not stall its cluster for good: the sentinel's queue guard gives the dead worker's lock back
(veronica.engine.qguard). Both modes, on the real cluster."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from django.db import close_old_connections

from tests.engine.test_fleet import answered, fleet_space, mail_all
from tests.harness import isolate_queue, qcluster, wait_for
from tests.vendors.mock_openai import MockOpenAI
from veronica.management.commands.qcluster import descendants

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def own_queue():
    isolate_queue()
    yield
    close_old_connections()


def waiting_reader(root: int) -> int | None:
    """The worker holding the task queue's read lock: the one whose main thread is blocked in read()
    on the queue's pipe (the others wait for the lock, in futex). Workers are the cluster's processes
    with a run pool (more than one thread) whose main thread reads; the monitor reads too, alone."""
    found = []
    for pid in descendants(root):
        try:
            syscall = Path(f"/proc/{pid}/syscall").read_text().split()
            threads = len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
        if syscall and syscall[0] == "0" and threads > 1:
            found.append(pid)
    return found[0] if len(found) == 1 else None


def test_a_worker_killed_while_it_waits_for_a_task_does_not_stall_its_cluster(tmp_path):
    members = fleet_space(tmp_path, 4)
    log = tmp_path / "cluster.log"
    with MockOpenAI(api_key="sk-fleet") as mock:
        mock.configure(latency=0.1, steps=1)
        with qcluster(workers=2, log_path=log, OPENAI_BASE_URL=mock.base_url, OPENAI_API_KEY="sk-fleet") as proc:
            holder = wait_for(lambda: waiting_reader(proc.pid), 30, interval=0.2, message="a worker waiting for a task")
            os.kill(holder, signal.SIGKILL)
            mail_all(members)
            wait_for(lambda: answered(members), 60, interval=0.5, message="every member answered after the kill")
    text = log.read_text()
    assert f"worker {holder} died holding the task queue's read lock" in text, "given back as the sentinel replaced it"
    assert "stalled" not in text, "not after a stall"


def _wait_for_a_task(queue) -> None:
    queue.get()


@pytest.mark.django_db(transaction=False)
def test_the_task_queue_knows_which_process_waits_holding_its_read_lock():
    import multiprocessing

    from veronica.engine.qguard import GuardedQueue

    queue = GuardedQueue(maxsize=1)
    reader = multiprocessing.get_context("fork").Process(target=_wait_for_a_task, args=(queue,))
    reader.start()
    wait_for(lambda: queue.reader.value == reader.pid, 10, interval=0.01, message="the reader marked")
    os.kill(reader.pid, signal.SIGKILL)
    reader.join(timeout=10)
    assert not queue._rlock.acquire(block=False), "the dead reader took the lock with it"
    assert not queue.release_for(os.getpid()), "only the marked reader's lock is given back"
    assert queue.release_for(reader.pid)
    assert queue.reader.value == 0
    queue.put("wake")
    assert queue.get() == "wake", "the queue is read again (through the marked path)"
    assert queue.reader.value == 0, "the mark is cleared once the task is read"
    assert queue.qsize() == 0


class FakeWorker:
    def __init__(self, alive: bool = True, timer: float = -1) -> None:
        import multiprocessing

        self.alive, self.pid = alive, os.getpid()
        self.timer = multiprocessing.Value("f", timer)

    def is_alive(self) -> bool:
        return self.alive


class FakeSentinel:
    def __init__(self, workers) -> None:
        from django_q.queues import Queue

        self.task_queue, self.pool = Queue(maxsize=1), list(workers)


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("died_idle, stopped", [(True, False), (False, False), (True, True)])
def test_the_guard_gives_back_only_a_dead_idle_workers_lock_behind_which_a_task_waits(died_idle, stopped, monkeypatch):
    from veronica.engine import qguard

    now = [0.0]
    dead, live = FakeWorker(alive=False, timer=-1 if died_idle else 30), FakeWorker()
    sentinel = FakeSentinel([live])
    guard = qguard.QueueGuard(sentinel, clock=lambda: now[0])
    monkeypatch.setattr(qguard.procstat, "stopped", lambda pid: stopped)
    sentinel.task_queue._rlock.acquire()  # as the dead worker did, waiting for a task
    guard.worker_died(dead)
    sentinel.task_queue.put("wake")
    wait_for(lambda: sentinel.task_queue.qsize() == 1, 5, interval=0.01, message="the task queued")
    assert not guard.look()
    now[0] = qguard.STALL_SECONDS - 0.1
    assert not guard.look(), "released before the stall lasted STALL_SECONDS"
    now[0] = qguard.STALL_SECONDS + 0.1
    released = guard.look()
    assert released == (died_idle and not stopped)
    assert sentinel.task_queue._rlock.acquire(block=False) == released
    if released:
        sentinel.task_queue._rlock.release()
        assert sentinel.task_queue.get(timeout=5) == "wake", "a live worker reads the queue again"


def test_a_dead_worker_is_replaced_on_its_sigchld_while_the_guard_loop_waits(monkeypatch):
    """q2's guard loop looks at its workers every guard_cycle (0.5 s); the replacement of a killed worker
    reaps and resumes its runs, so each resume waited for that look. The sentinel replaces it on SIGCHLD,
    when its loop is waiting (and so not walking the pool), and only in the sentinel itself."""
    import os

    from veronica.engine.qguard import GuardedSentinel, WatchedWait

    class Proc:
        def __init__(self, alive):
            self.alive = alive

        def is_alive(self):
            return self.alive

    dead, live = Proc(False), Proc(True)
    sentinel = object.__new__(GuardedSentinel)
    sentinel.pool, sentinel.guard_pid = [live, dead], os.getpid()
    sentinel.stop_event = WatchedWait(type("Event", (), {"is_set": lambda self: False})())
    replaced = []
    monkeypatch.setattr(GuardedSentinel, "reincarnate", lambda self, p: replaced.append(p))
    sentinel.child_died()
    assert replaced == [], "the guard loop is walking its pool: it replaces the dead itself"
    sentinel.stop_event.waiting = True
    sentinel.child_died()
    assert replaced == [dead]
    sentinel.guard_pid = os.getpid() + 1  # a process forked from the sentinel inherits the handler
    sentinel.child_died()
    assert replaced == [dead]
