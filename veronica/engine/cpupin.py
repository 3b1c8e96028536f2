"""Each qcluster worker on a CPU of its own (VERONICA_Q_PIN_WORKERS, on by default).

Why: a worker runs hundreds of runs on threads (veronica.engine.fleet), and only the thread holding
the GIL runs Python. Left to the scheduler, the GIL passes between threads on different cores: each
hand-off wakes a thread on another CPU, and the threads' state moves with it. Held to one CPU, a
worker's threads hand the GIL over on that core; what a worker could run beside it on a second core
is only the short spans its threads spend outside the GIL (a socket read, a database round trip).
bench/fleet.py (hosted, 500 members, 2 workers on 2 cores, runs interleaved): host CPU per model
call ~10 % lower; completion over the ideal, median of six runs, 1.40 pinned against 1.59 unpinned.

The workers go round-robin over the CPUs the sentinel may use (its own affinity: a container's
cpuset is kept), each to the CPU the fewest live workers hold, those of the host's other qclusters
included; a replacement takes its dead predecessor's. Only the workers are held: the sentinel,
pusher, monitor, the model gateway, the database and the web server run wherever there is room.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: nothing to pin
        return []


def pinned_cpu(pid: int) -> int | None:
    """The one CPU a process is held to, or None (free, or gone)."""
    try:
        cpus = os.sched_getaffinity(pid)
    except OSError:
        return None
    return next(iter(cpus)) if len(cpus) == 1 else None


def least_held(cpus: list[int], pids: list[int]) -> int:
    """Of the CPUs, the one the fewest of these processes are pinned to (the lowest on a tie)."""
    held = {cpu: 0 for cpu in cpus}
    for pid in pids:
        cpu = pinned_cpu(pid)
        if cpu in held:
            held[cpu] += 1
    return min(cpus, key=lambda cpu: (held[cpu], cpu))


def pin(pid: int, cpu: int) -> bool:
    """Hold a process, every thread it has already started included, to one CPU (threads it starts
    later inherit it from their starter). False when it could not be done (gone, not permitted)."""
    try:
        os.sched_setaffinity(pid, {cpu})
        for tid in os.listdir(f"/proc/{pid}/task"):
            if int(tid) != pid:
                try:
                    os.sched_setaffinity(int(tid), {cpu})
                except OSError:  # a thread that ended meanwhile
                    pass
    except OSError as exc:
        log.warning("could not pin worker %s to CPU %s: %s", pid, cpu, exc)
        return False
    return True


def host_workers() -> list[int]:
    """Every process of this user on this host that a qcluster forked (their command line is the
    qcluster's): other clusters' workers count too, so two clusters of one worker each, on one host,
    take two CPUs, not the same one."""
    uid, found = os.getuid(), []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if b"qcluster" in fh.read():
                    found.append(int(name))
        except OSError:  # gone meanwhile
            continue
    return found


def pin_worker(pid: int, sibling_pids: list[int]) -> int | None:
    """Pin a freshly forked worker beside its live siblings and the host's other clusters' workers; the
    CPU, or None when there is one CPU (nothing to choose) or the pin failed."""
    cpus = allowed_cpus()
    if len(cpus) < 2:
        return None
    cpu = least_held(cpus, [p for p in {*sibling_pids, *host_workers()} if p and p != pid])
    return cpu if pin(pid, cpu) else None
