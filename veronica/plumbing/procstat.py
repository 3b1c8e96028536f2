"""What /proc says of a process of this pid namespace: one reader for every place that asks whether a
process (a lease's holder, a model call's worker, a queue reader) still runs.

A pid alone does not name a process: the kernel reuses it. A process is its pid and its start time
(clock ticks since boot, field 22 of /proc/<pid>/stat), which no later process of that pid shares.
No Django here: the model gateway (veronica.agent.providers.gateway) reads it too.
"""
from __future__ import annotations

import os
from typing import NamedTuple

PF_EXITING = 0x4  # the kernel's flag of a task in do_exit: set before it closes its files


class Stat(NamedTuple):
    state: str  # R, S, D, T (stopped), t (traced), Z (zombie), X / x (dead), ...
    ppid: int
    start: int  # clock ticks after boot
    flags: int


def stat(pid: int) -> Stat | None:
    """The process's stat, or None when there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()  # the name, in parentheses, may hold spaces
        return Stat(fields[0].decode(), int(fields[1]), int(fields[19]), int(fields[6]))
    except (OSError, IndexError, ValueError):
        return None


def gone(pid: int, start: int, *, exiting: bool = False) -> bool:
    """The process (pid, start) no longer runs: no such pid, a pid reused since, a zombie; with
    `exiting`, also one the kernel is taking down (its sockets close as its last thread exits, when the
    flag is already set: a peer reading EOF then sees it as gone)."""
    now = stat(pid)
    return (now is None or now.start != start or now.state in ("Z", "X", "x")
            or exiting and bool(now.flags & PF_EXITING))


def stopped(pid: int | None) -> bool:
    """The process is stopped (SIGSTOP) or traced."""
    now = stat(pid) if pid else None
    return now is not None and now.state in ("T", "t")


def children() -> dict[int, list[int]]:
    """Every process of this pid namespace, by its parent's pid ({} without /proc)."""
    found: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if entry.isdigit():
            now = stat(int(entry))
            if now is not None:
                found.setdefault(now.ppid, []).append(int(entry))
    return found
