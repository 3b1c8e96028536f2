"""Run-lease tokens name their holder process (veronica.engine.holders): a holder that died on this
machine has its leases ended at once, by the next worker that spawns here; a stopped one, one on
another machine, or a token without a mark waits for its lease as before."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.db import close_old_connections, connection
from django.db.models.functions import Now
from django.utils import timezone

from tests.conftest import make_space
from tests.harness import REPO, isolate_queue, kill_cluster, qcluster, wait_for
from veronica.engine import holders, supervisor
from veronica.plumbing import procstat
from veronica.models import Event, Member, Message, Run, RunOutcome, RunStatus
from veronica.swarm import bus

pytestmark = pytest.mark.django_db(transaction=True)

HOLDER = ("import sys, time; sys.path.insert(0, '.'); from veronica.engine.holders import new_token; "
          "print(new_token(), flush=True); time.sleep(120)")


@pytest.fixture
def holder():
    """Another process of this machine that minted a token and then waits: (process, its token)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=REPO, stdout=subprocess.PIPE, text=True)
    token = proc.stdout.readline().strip()
    yield proc, token
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait(timeout=5)


def leased(tmp_path, token: str) -> Member:
    """w1 busy in a run under `token`, its lease a minute away, its mail unread."""
    space = make_space(tmp_path, workers=("w1",))
    bus.send(space, "boss", "w1", "work")
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(lease_token=token, lease_expires_at=timezone.now() + timedelta(seconds=60),
                                          run_status=RunStatus.BUSY)
    Run.objects.create(member=w1, source="message", lease_token=token, started_at=Now())
    return w1


def test_a_token_names_its_process_and_machine_and_stays_unique():
    tokens = {holders.new_token() for _ in range(1000)}
    assert len(tokens) == 1000
    mark = holders.process_mark()
    assert mark and mark.split(".")[1] == f"{os.getpid():x}"
    for token in tokens:
        assert token.startswith(mark + ".") and len(token) <= holders.TOKEN_LENGTH
        assert len(token.split(".")[3]) >= holders.MIN_RANDOM
        assert not holders.holder_dead(token, mark.split(".")[0])  # this process runs


def test_a_live_holders_lease_is_kept(tmp_path, holder):
    _, token = holder
    w1 = leased(tmp_path, token)
    assert holders.reap_dead_here() == []
    assert Member.objects.get(pk=w1.pk).lease_token == token


def test_a_stopped_holder_keeps_its_lease_until_it_runs_out(tmp_path, holder):
    proc, token = holder
    w1 = leased(tmp_path, token)
    os.kill(proc.pid, signal.SIGSTOP)  # a frozen worker: alive, its fence keeps it from writing
    try:
        assert holders.reap_dead_here() == []
        assert Member.objects.get(pk=w1.pk).lease_token == token
    finally:
        os.kill(proc.pid, signal.SIGCONT)


@pytest.mark.parametrize("collected", [True, False], ids=["gone", "zombie"])
def test_a_dead_holders_lease_ends_at_once_and_its_member_is_owed_a_resume(tmp_path, holder, collected):
    proc, token = holder
    w1 = leased(tmp_path, token)
    proc.kill()
    if collected:
        proc.wait(timeout=5)
    else:  # killed, not yet waited for by its parent (this test): a zombie, which never writes again
        wait_for(lambda: procstat.stat(proc.pid) is None or procstat.stat(proc.pid).state == "Z", 5, message="a zombie")
    assert holders.reap_dead_here() == [w1.pk]
    member = Member.objects.get(pk=w1.pk)
    assert member.lease_token == "" and member.lease_expires_at is None and member.run_status == RunStatus.IDLE
    assert member.retry_at is not None, "a resume is owed"
    run = Run.objects.get(member=w1)
    assert run.outcome == RunOutcome.LEASE_EXPIRED and run.ended_at is not None
    assert Event.objects.filter(kind="run.lease_expired", member=w1).count() == 1
    assert Message.objects.filter(recipient=w1, read_at__isnull=True).count() == 1, "its mail waits for the resume"
    assert holders.reap_dead_here() == []  # once


def test_the_engine_tick_s_watchdog_takes_none_of_the_leases_a_worker_is_reaping(tmp_path, holder, monkeypatch):
    """The reap cut the dead holder's leases (made them run out), then expired them in a transaction of
    its own; the engine tick's watchdog, which expires run-out leases too, took some in between and rang
    their resumes through the broker, not to the reaping worker: ~10 % of a killed worker's resumes
    started 3.5 s after the others (bench/fleet.py). Both now go in one transaction."""
    import threading

    from veronica.engine import leases

    proc, token = holder
    w1 = leased(tmp_path, token)
    proc.kill()
    proc.wait(timeout=5)
    real, ticked = leases.expire_leases, {}

    def watchdog() -> None:
        try:
            ticked["woken"] = real()  # the engine tick's pass, on its own connection
        finally:
            connection.close()

    def between(**kwargs):
        tick = threading.Thread(target=watchdog)
        tick.start()
        tick.join(timeout=10)
        return real(**kwargs)

    monkeypatch.setattr(leases, "expire_leases", between)
    rung = []
    monkeypatch.setattr("veronica.engine.failures.enqueue_wake", lambda *a, **k: rung.append(a) or True)
    assert holders.reap_dead_here(ring_now=False) == [w1.pk], "the reaping worker did not get its member to resume"
    assert ticked == {"woken": []} and rung == [], "the watchdog took the lease and rang its resume through the broker"


@pytest.mark.parametrize("token", ["0123abcd.1.5.aaaaaaaaaaaa", "3f0c1d2e4b5a69788796a5b4c3d2e1f0", "x"],
                         ids=["another-machine", "unmarked", "odd"])
def test_a_holder_this_machine_cannot_see_waits_for_its_lease(tmp_path, token):
    w1 = leased(tmp_path, token)
    assert holders.reap_dead_here() == []
    assert Member.objects.get(pk=w1.pk).lease_token == token


@pytest.mark.cluster
def test_a_killed_cluster_restarted_on_its_machine_resumes_its_runs_at_once_not_a_lease_later(tmp_path):
    """kill -9 of a whole qcluster mid-run, then a new one on the same machine: its worker, as it spawns,
    ends the dead holder's lease, and the member finishes its mail long before the 120 s lease would
    have run out."""
    isolate_queue()
    space = make_space(tmp_path, workers=("w1",))
    w1 = supervisor.get_member(space, "w1")
    with qcluster(workers=1, VERONICA_OFFLINE_DELAY_MS="20000", VERONICA_RUN_LEASE_SECONDS="120") as proc:
        bus.send(space, "boss", "w1", "long job")
        wait_for(lambda: Run.objects.filter(member=w1, ended_at__isnull=True).exists(), 30, message="run in flight")
        kill_cluster(proc)
    close_old_connections()
    assert Member.objects.get(pk=w1.pk).lease_expires_at > timezone.now() + timedelta(seconds=60)
    started = time.monotonic()
    with qcluster(workers=1, VERONICA_RUN_LEASE_SECONDS="120"):
        wait_for(lambda: Run.objects.filter(member=w1, outcome=RunOutcome.DONE).exists(), 60, message="a clean run")
    assert time.monotonic() - started < 60, "the restarted cluster waited for the lease"
    assert Run.objects.filter(member=w1, outcome=RunOutcome.LEASE_EXPIRED).count() == 1
    assert Message.objects.filter(recipient=w1, read_at__isnull=True).count() == 0


class FakePool:
    """A run pool that records the runs it is asked to start (and runs none), with `free` slots."""

    def __init__(self, free: int) -> None:
        self.free, self.started = free, []

    def try_reserve(self) -> bool:
        if self.free <= 0:
            return False
        self.free -= 1
        return True

    def start(self, body, *, name: str) -> None:
        self.started.append(name)


@pytest.fixture
def broker(monkeypatch):
    """The resume wakes pushed to the broker: (member id, source)."""
    import django_q.tasks

    pushed = []
    monkeypatch.setattr(django_q.tasks, "async_task",
                        lambda func, member_id, source, **kw: source == "resume" and pushed.append((member_id, source)))
    return pushed


@pytest.mark.parametrize("free", [1, 0], ids=["slot-free", "pool-full"])
def test_a_spawning_worker_resumes_its_dead_predecessors_members_in_its_own_run_pool(tmp_path, holder, broker, monkeypatch, free):
    """The replacement of a killed worker reaps the dead one's leases as it spawns and starts their resumes
    on its own run pool's threads, not through the broker (Redis, the pusher, q2's queue and its main
    thread, one task at a time): a free slot takes the resume at once; without one it goes to the broker.
    Either way the resume stays owed (retry_at), so one that no run claims is rung again by the tick."""
    from veronica.engine import fleet, warm

    proc, token = holder
    w1 = leased(tmp_path, token)
    proc.kill()
    proc.wait(timeout=5)
    pool = FakePool(free)
    monkeypatch.setattr(fleet, "enable", lambda **kwargs: pool)
    monkeypatch.setattr(warm, "settle_gc", lambda: None)
    warm.warm_worker(proc_name="Process-1")
    after = Member.objects.get(pk=w1.pk)
    assert after.lease_token != token, "reaped"
    assert after.retry_at is not None, "the resume stays owed"
    if free:
        assert pool.started == [f"wake-{w1.pk}"] and broker == [], "started here, not rung through the broker"
        # PostgreSQL: claimed here, before its run starts (the resumes of a reap are claimed at once);
        # elsewhere its run's thread claims it
        claimed = connection.vendor == "postgresql"
        assert (after.lease_token.startswith(holders.process_mark() + ".") if claimed else after.lease_token == "")
        assert Run.objects.filter(member=w1, source="resume").exists() == claimed
    else:
        assert after.lease_token == "" and pool.started == [] and broker == [(w1.pk, "resume")]


def test_a_worker_without_a_run_pool_rings_its_reaped_members_through_the_broker(tmp_path, holder, broker, monkeypatch):
    from veronica.engine import fleet, warm

    proc, token = holder
    w1 = leased(tmp_path, token)
    proc.kill()
    proc.wait(timeout=5)
    monkeypatch.setattr(fleet, "enable", lambda **kwargs: None)
    monkeypatch.setattr(warm, "settle_gc", lambda: None)
    warm.warm_worker(proc_name="Process-1")
    assert broker == [(w1.pk, "resume")], "rung once, by the reap"


def test_the_sentinel_preloads_the_agent_stack_for_the_workers_it_forks_later(monkeypatch):
    """q2's sentinel, once it has forked the cluster, imports the agent stack and the vendors' SDKs and
    settles its collector, before it guards: a worker it forks for a dead one inherits them, instead of
    importing the SDK on its first model call in the middle of the resumes' burst."""
    import importlib
    import signal

    from django_q.cluster import Sentinel

    from veronica.engine import qguard, warm
    from veronica.plumbing import gcsettle

    done = []
    monkeypatch.setattr(importlib, "import_module", lambda name: done.append(name))
    monkeypatch.setattr(gcsettle, "settle", lambda: done.append("settle"))
    monkeypatch.setattr(Sentinel, "guard", lambda self: done.append("guard"))
    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)  # (its SIGCHLD handler: test_qguard)
    sentinel = object.__new__(qguard.GuardedSentinel)
    sentinel.start_event = type("Event", (), {"set": lambda self: done.append("running")})()
    sentinel.stop_event = None
    qguard.GuardedSentinel.guard(sentinel)
    assert done == ["running", *warm.MODULES, *warm.SDKS, "settle", "guard"]
