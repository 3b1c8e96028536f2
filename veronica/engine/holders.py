"""Run-lease tokens that name the process holding them, so a holder that died on this machine is
known at once instead of a lease later.

A run lease runs out RUN_LEASE_SECONDS after its holder's last heartbeat: that is how any host tells
that another host died, and it stays the rule. But most deaths are a process on a machine that goes
on: a worker SIGKILLed by the OOM killer (the sentinel forks a new one), a qcluster restarted in
place after a crash. The machine itself can tell at once that the holder is gone. So a token starts
with a mark of the machine (a hash of the kernel's boot id and the pid namespace) and of the process
(its pid and its start time, in clock ticks since boot: a reused pid is another process):

    <machine: 8 hex>.<pid: hex>.<start time: hex>.<random hex>     (40 characters at most)

A worker, as it spawns (veronica.engine.warm), looks at the leases held on its machine (one indexed
select of the busy members) and ends at once those whose holder is no longer running: their leases
are made to have run out and the lease watchdog's own path (veronica.engine.leases.expire_leases)
releases them, ends their runs and re-wakes their members. A stopped holder (SIGSTOP) still runs:
its lease runs out as before and its fence keeps it from writing. A holder on another machine, or a
token without a mark (a machine with no /proc, or minted before this format), waits for its lease.
"""
from __future__ import annotations

import hashlib
import logging
import os
import uuid
from datetime import timedelta

from veronica.plumbing import procstat

log = logging.getLogger(__name__)

TOKEN_LENGTH = 40  # Member.lease_token and Run.lease_token
MIN_RANDOM = 12  # hex digits of randomness a token keeps whatever its prefix's length

_mark: tuple[int, str] | None = None  # (pid, "<machine>.<pid>.<start>") of this process, made after any fork


def _machine() -> str | None:
    """This machine's mark: its boot and its pid namespace (a container beside ours has pids of its own)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return hashlib.sha256(f"{boot}:{namespace}".encode()).hexdigest()[:8]


def process_mark() -> str:
    """"<machine>.<pid>.<start>" of this process, or "" where it cannot be told (no /proc)."""
    global _mark
    pid = os.getpid()
    if _mark is None or _mark[0] != pid:
        machine, me = _machine(), procstat.stat(pid)
        _mark = (pid, f"{machine}.{pid:x}.{me.start:x}" if machine and me else "")
    return _mark[1]


def new_token() -> str:
    """A fresh lease token, marked with its holder when this machine allows it."""
    mark = process_mark()
    if not mark or len(mark) + 1 + MIN_RANDOM > TOKEN_LENGTH:
        return uuid.uuid4().hex
    return f"{mark}.{uuid.uuid4().hex[:TOKEN_LENGTH - len(mark) - 1]}"


def holder_dead(token: str, machine: str) -> bool:
    """True when the token's holder ran on `machine` (this one) and no longer runs. A zombie (killed,
    not yet collected by its parent) is dead: it will never write again."""
    parts = token.split(".")
    return len(parts) == 4 and mark_gone(".".join(parts[:3]), machine)


def mark_gone(mark: str, machine: str) -> bool:
    """True when the process of this mark (process_mark's "<machine>.<pid>.<start>") ran on `machine` and
    no longer runs (its pid gone, a zombie, or reused by a process started since)."""
    parts = mark.split(".")
    if len(parts) != 3 or parts[0] != machine:
        return False
    try:
        pid, start = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return False
    return procstat.gone(pid, start)


def reap_dead_here(*, ring_now: bool = True) -> list[int]:
    """End at once the run leases whose holder was a process of this machine that no longer runs:
    they are made to have run out and the lease watchdog's path takes them (events, the Run's outcome,
    the resume). Returns the members re-woken (ring_now=False: owed a resume, which the caller starts,
    leases.expire_leases). One select when nothing is held here."""
    from django.db import transaction
    from django.db.models.functions import Now

    from veronica.engine import leases
    from veronica.models import Member

    mark = process_mark()
    if not mark:
        return []
    machine = mark.split(".")[0]
    held = Member.objects.exclude(lease_token="").filter(lease_token__startswith=f"{machine}.")  # member_leased_idx
    dead = {pk: token for pk, token in held.values_list("pk", "lease_token") if holder_dead(token, machine)}
    if not dead:
        return []
    # The cut and the expiry in one transaction: the engine tick's lease watchdog expires run-out leases
    # too, and between the two it took some of these (skip_locked splits the rows) and rang their resumes
    # through the broker, for workers already full, instead of leaving them to this caller: ~10 % of a
    # killed worker's 244 resumes started 3.5 s after the others (bench/fleet.py). Until the commit the
    # cut rows are locked, and read as not run out, by every other transaction.
    with transaction.atomic():
        cut = Member.objects.filter(pk__in=list(dead), lease_token__in=list(dead.values())).update(
            lease_expires_at=Now() - timedelta(seconds=1))
        log.warning("%d run lease(s) held by processes of this machine that no longer run: ended now, not at their expiry", cut)
        return leases.expire_leases(ring_now=ring_now)
