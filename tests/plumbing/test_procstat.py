"""veronica.plumbing.procstat: a process is its pid and start time; gone covers the dead, the zombie
and the reused pid; stopped sees SIGSTOP."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from veronica.plumbing import procstat


def wait(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_running_process_is_not_gone_and_its_start_time_names_it():
    me = procstat.stat(os.getpid())
    assert me is not None and me.ppid == os.getppid() and me.state in ("R", "S")
    assert not procstat.gone(os.getpid(), me.start)
    assert procstat.gone(os.getpid(), me.start + 1)  # the same pid, started at another time: another process


def test_a_zombie_and_a_reaped_process_are_gone_and_a_stopped_one_is_stopped():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    start = procstat.stat(child.pid).start
    os.kill(child.pid, signal.SIGSTOP)
    assert wait(lambda: procstat.stopped(child.pid)) and not procstat.gone(child.pid, start)
    os.kill(child.pid, signal.SIGKILL)
    assert wait(lambda: procstat.stat(child.pid).state == "Z") and procstat.gone(child.pid, start)  # not reaped yet
    child.wait()
    assert procstat.stat(child.pid) is None and procstat.gone(child.pid, start) and not procstat.stopped(child.pid)


def test_children_lists_processes_by_their_parent():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid in procstat.children().get(os.getpid(), [])
    finally:
        child.kill()
        child.wait()
