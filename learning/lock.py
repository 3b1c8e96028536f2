"""The store's writer lock: a lease row, claimed with a conditional UPDATE.

Why a lease row, and not a transaction or an advisory lock:

* a pass spends most of its time in LLM calls. On SQLite (transaction_mode IMMEDIATE) any open
  transaction holds the database's only write lock, so a lock held as a transaction would stall
  every writer of the whole application (runs, events, the console) for minutes. The lease is a
  row; the transactions around it last milliseconds;
* PostgreSQL advisory locks are tied to a connection, and Django closes and reopens connections
  (CONN_MAX_AGE=0, management commands, django-q2 workers) behind our back; and SQLite would still
  need a second mechanism. One conditional UPDATE works the same on both and across hosts;
* a crashed holder cannot wedge it: its lease expires (LEARNING_LOCK_TTL seconds after the last
  renewal) and the next pass takes it over.

Fencing. A pass renews the lease before every LLM call, and every write it makes runs inside
`fence()`: one transaction whose first statement is "renew, if I still hold it". If the lease was
taken over meanwhile (the holder stalled past its TTL), the fence raises LeaseLost and the write
rolls back, so an item is never mined twice even then. On PostgreSQL the fence's UPDATE also
row-locks the lease until commit, so a takeover cannot slip in between the check and the write;
on SQLite the IMMEDIATE transaction serializes it. The (kind, key) unique constraint on the
ledger is the last backstop.

Timestamps use the application clock (hosts are expected to be NTP-synced; the TTL is minutes).
"""
from __future__ import annotations

import os
import random
import secrets
import socket
import time
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from .models import WriterLease

STORE_LOCK = "store"
DEFAULT_TTL = 300.0
DEFAULT_WAIT = 300.0


class LockBusy(RuntimeError):
    pass


class LeaseLost(RuntimeError):
    pass


def lock_ttl() -> float:
    return float(getattr(settings, "LEARNING_LOCK_TTL", DEFAULT_TTL))


def lock_wait() -> float:
    return float(getattr(settings, "LEARNING_LOCK_WAIT", DEFAULT_WAIT))


class WriterLock:
    def __init__(self, name: str = STORE_LOCK, *, ttl: float | None = None, label: str = ""):
        self.name = name
        self.ttl = lock_ttl() if ttl is None else float(ttl)
        self.token = secrets.token_hex(16)
        self.label = (label or "writer") + f" pid={os.getpid()} host={socket.gethostname()}"
        self.held = False

    def _expiry(self):
        now = timezone.now()
        return now, now + timedelta(seconds=self.ttl)

    def try_acquire(self) -> bool:
        now, expires = self._expiry()
        free = Q(holder="") | Q(expires_at__isnull=True) | Q(expires_at__lt=now)
        claimed = WriterLease.objects.filter(Q(name=self.name) & free).update(
            holder=self.token, holder_label=self.label[:200], acquired_at=now, expires_at=expires
        )
        if not claimed and not WriterLease.objects.filter(name=self.name).exists():
            try:
                with transaction.atomic():
                    WriterLease.objects.create(
                        name=self.name, holder=self.token, holder_label=self.label[:200], acquired_at=now, expires_at=expires
                    )
                claimed = 1
            except IntegrityError:
                claimed = 0  # someone else created it first
        self.held = bool(claimed)
        return self.held

    def acquire(self, wait: float | None = None) -> "WriterLock":
        """Take the lock, polling until it is free, for at most `wait` seconds (default
        LEARNING_LOCK_WAIT). Raises LockBusy when it stays taken."""
        wait = lock_wait() if wait is None else wait
        deadline = time.monotonic() + max(0.0, wait)
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                lease = WriterLease.objects.filter(name=self.name).first()
                who = f"{lease.holder_label} until {lease.expires_at:%H:%M:%S}" if lease else "?"
                raise LockBusy(f"the learning store's writer lock is held by {who}")
            time.sleep(0.05 + random.random() * 0.15)
        return self

    def renew(self) -> None:
        if not self.held:
            raise LeaseLost("writer lock not held")
        _now, expires = self._expiry()
        if not WriterLease.objects.filter(name=self.name, holder=self.token).update(expires_at=expires):
            self.held = False
            raise LeaseLost("the writer lease expired and was taken over by another pass")

    @contextmanager
    def fence(self):
        """One short transaction that first proves we still hold the lease."""
        with transaction.atomic():
            self.renew()
            yield

    def release(self) -> None:
        if self.held:
            WriterLease.objects.filter(name=self.name, holder=self.token).update(holder="", holder_label="", expires_at=None)
            self.held = False

    def __enter__(self) -> "WriterLock":
        if not self.held:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
