"""Each qcluster worker is held to a CPU of its own (veronica.engine.cpupin), round-robin over the CPUs
the cluster may use; a replacement takes the CPU its dead predecessor held; nothing else of the
cluster is held. The unit tests pin real child processes; the cluster tests run the real q2 cluster."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import close_old_connections

from tests.harness import isolate_queue, qcluster, wait_for
from veronica.engine import cpupin
from veronica.management.commands.qcluster import descendants

CPUS = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="pinning needs two CPUs to choose from")

# a child that starts a thread before anyone pins it, then waits
THREADED = "import threading, time; threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); print('up', flush=True); time.sleep(60)"


def child(code: str = THREADED) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def held(pid: int) -> set[int]:
    return {cpu for tid in os.listdir(f"/proc/{pid}/task") for cpu in os.sched_getaffinity(int(tid))}


@needs_two
def test_a_pin_holds_every_thread_the_process_already_started():
    proc = child()
    try:
        assert len(os.listdir(f"/proc/{proc.pid}/task")) == 2
        assert cpupin.pin(proc.pid, CPUS[1])
        assert all(os.sched_getaffinity(int(tid)) == {CPUS[1]} for tid in os.listdir(f"/proc/{proc.pid}/task"))
        assert cpupin.pinned_cpu(proc.pid) == CPUS[1]
    finally:
        proc.kill()
        proc.wait()


@needs_two
def test_a_new_worker_takes_the_cpu_the_fewest_live_siblings_hold(monkeypatch):
    monkeypatch.setattr(cpupin, "host_workers", lambda: [])  # no other cluster's workers on this host
    first, second = child(), child()
    try:
        assert cpupin.pin_worker(first.pid, []) == CPUS[0], "the lowest CPU when none is held"
        assert cpupin.pin_worker(second.pid, [first.pid]) == CPUS[1], "not the CPU its sibling holds"
        third = child()
        try:
            assert cpupin.pin_worker(third.pid, [first.pid, second.pid]) == CPUS[0], "round-robin: each held once, the lowest"
        finally:
            third.kill()
            third.wait()
        second.kill()
        second.wait()
        assert cpupin.least_held(CPUS, [first.pid, second.pid]) == CPUS[1], "a dead sibling holds no CPU"
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()


@needs_two
def test_another_clusters_workers_on_the_host_count_too(monkeypatch):
    """Two qclusters of one worker each on one host take two CPUs: a worker forked by any qcluster
    (its command line is the qcluster's) that is pinned counts, whoever its sentinel is."""
    plain = child()
    proc = subprocess.Popen([sys.executable, "-c", THREADED, "qcluster"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        found = cpupin.host_workers()
        assert proc.pid in found and plain.pid not in found
        assert cpupin.pin(proc.pid, CPUS[0])
        monkeypatch.setattr(cpupin, "host_workers", lambda: [proc.pid])
        assert cpupin.pin_worker(plain.pid, []) == CPUS[1], "not the CPU the other cluster's worker holds"
    finally:
        for p in (plain, proc):
            p.kill()
            p.wait()


def test_one_cpu_pins_nothing(monkeypatch):
    before = os.sched_getaffinity(0)
    monkeypatch.setattr(cpupin, "allowed_cpus", lambda: [0])
    assert cpupin.pin_worker(os.getpid(), []) is None
    assert os.sched_getaffinity(0) == before, "this process was left as it was"


def test_a_pin_that_is_refused_is_logged_not_raised(caplog):
    assert cpupin.pin(2**22 + 12345, 0) is False  # no such process
    assert "could not pin worker" in caplog.text


# --- the real cluster -------------------------------------------------------------------------------

@pytest.fixture
def own_queue():
    isolate_queue()
    yield
    close_old_connections()


def workers_of(log: Path) -> list[int]:
    """The workers' pids, from q2's readiness lines ("... ready for work at PID"), the latest last."""
    return [int(pid) for pid in re.findall(r"ready for work at (\d+)", log.read_text())]


def pinned(pids: list[int]) -> dict[int, int]:
    return {pid: cpu for pid in pids if (cpu := cpupin.pinned_cpu(pid)) is not None}


def foreign_pinned(root: int) -> dict[int, int]:
    """The pinned workers on this host of clusters other than the one under `root`."""
    ours = set(descendants(root))
    return pinned([pid for pid in cpupin.host_workers() if pid not in ours])


@needs_two
@pytest.mark.cluster
@pytest.mark.django_db(transaction=True)
def test_each_worker_holds_a_cpu_of_its_own_and_a_replacement_takes_the_dead_ones(tmp_path, own_queue):
    log = tmp_path / "cluster.log"
    with qcluster(workers=2, log_path=log) as proc:
        wait_for(lambda: len(workers_of(log)) == 2, 30, interval=0.2, message="two workers ready")
        workers = workers_of(log)
        held_by = pinned(workers)
        assert set(held_by) == set(workers), f"each worker held to one CPU: {held_by}"
        # Another cluster's pinned workers on this host (a test pass running beside this one) count in
        # the choice; alone, the two take one CPU each and the replacement its predecessor's.
        alone = not foreign_pinned(proc.pid)
        if alone:
            assert sorted(held_by.values()) == CPUS[:2], f"one CPU each: {held_by}"
        others = [pid for pid in descendants(proc.pid) if pid not in workers]
        assert others and not pinned(others), "the sentinel, pusher, monitor and gateway stay free"
        assert all(held(pid) == {held_by[pid]} for pid in workers), "every thread of a worker"

        victim = workers[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(workers_of(log)) == 3, 30, interval=0.2, message="the replacement ready")
        replacement = workers_of(log)[-1]
        assert cpupin.pinned_cpu(replacement) is not None
        if alone and not foreign_pinned(proc.pid):
            assert cpupin.pinned_cpu(replacement) == held_by[victim], "the CPU its predecessor held"
        assert cpupin.pinned_cpu(workers[1]) == held_by[workers[1]]


@needs_two
@pytest.mark.cluster
@pytest.mark.django_db(transaction=True)
def test_pinning_turned_off_leaves_the_workers_to_the_scheduler(tmp_path, own_queue):
    log = tmp_path / "cluster.log"
    with qcluster(workers=2, log_path=log, VERONICA_Q_PIN_WORKERS="0"):
        wait_for(lambda: len(workers_of(log)) == 2, 30, interval=0.2, message="two workers ready")
        assert pinned(workers_of(log)) == {}
