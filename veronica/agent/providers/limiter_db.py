"""The embedded limiter: the state lives in the database (veronica.models.limits), so every process
on the host shares it. Each step is a short autocommit statement (a conditional UPDATE), never a
transaction held while waiting. Slot expiry and bucket refills use this host's clock (embedded mode
is one host). The cap is exact (the conditional UPDATE); the FIFO order is exact among live waiters
that poll, since a waiter only tries while fewer older ones wait than there are free slots.
"""
from __future__ import annotations

import time

from django.db import IntegrityError, transaction
from django.db.models import Q

from veronica.agent.providers.limit_config import Limit
from veronica.models import ProviderBucket, ProviderSlot, ProviderWaiter

WAITER_TTL = 15.0  # a waiter that stopped polling this long (a killed process) no longer blocks the queue
REFRESH_EVERY = WAITER_TTL / 3
SLOT_POLL = 0.03  # a slot frees when a call ends: look again soon (same-process waiters are woken at once)


class DbLimiter:
    name = "database"

    def __init__(self, clock=time.time) -> None:
        self.clock = clock
        self._refreshed: dict[str, float] = {}
        self._ids: dict[str, int] = {}  # ticket -> its waiter row (its place in the queue)

    def enqueue(self, limit: Limit, ticket: str) -> None:
        now = self.clock()
        self._ids[ticket] = ProviderWaiter.objects.create(key=limit.key, ticket=ticket, alive_until=now + WAITER_TTL).pk
        self._refreshed[ticket] = now
        if limit.concurrency:
            self._ensure_slots(limit)

    def leave(self, limit: Limit, ticket: str) -> None:
        ProviderWaiter.objects.filter(ticket=ticket).delete()
        self._refreshed.pop(ticket, None)
        self._ids.pop(ticket, None)

    def try_acquire(self, limit: Limit, ticket: str, tokens: int) -> tuple[float, int]:
        """(0, 0): granted (the slot is held, the buckets debited). Otherwise (seconds worth waiting,
        how many live waiters are ahead)."""
        now = self.clock()
        if now - self._refreshed.get(ticket, 0) >= REFRESH_EVERY:
            if not ProviderWaiter.objects.filter(ticket=ticket).update(alive_until=now + WAITER_TTL):
                self._ids[ticket] = ProviderWaiter.objects.create(  # skipped as dead: rejoin at the back
                    key=limit.key, ticket=ticket, alive_until=now + WAITER_TTL).pk
            ProviderWaiter.objects.filter(key=limit.key, alive_until__lt=now).delete()
            self._refreshed[ticket] = now
        me = self._ids.get(ticket) or ProviderWaiter.objects.filter(ticket=ticket).values_list("pk", flat=True).first()
        ahead = ProviderWaiter.objects.filter(key=limit.key, pk__lt=me or 0, alive_until__gte=now).count()
        bucket = self._bucket(limit) if (limit.rpm or limit.tpm) else None
        if bucket is not None:
            wait = self._bucket_wait(limit, bucket, now, ahead, tokens)
            if wait:
                return wait, ahead
        if limit.concurrency:
            free = list(ProviderSlot.objects.filter(key=limit.key, slot__lt=limit.concurrency)
                        .filter(Q(holder="") | Q(expires_at__lt=now)).values_list("pk", flat=True))
            if ahead >= len(free):
                return SLOT_POLL, ahead
            if not any(self._take(pk, ticket, now + limit.lease_seconds, now) for pk in free):
                return SLOT_POLL, ahead
        if bucket is not None and not self._debit(limit, tokens):
            ProviderSlot.objects.filter(key=limit.key, holder=ticket).update(holder="", expires_at=0)
            return SLOT_POLL, ahead
        self.leave(limit, ticket)
        return 0.0, 0

    def renew(self, limit: Limit, ticket: str) -> bool:
        if not limit.concurrency:
            return True
        return bool(ProviderSlot.objects.filter(key=limit.key, holder=ticket).update(
            expires_at=self.clock() + limit.lease_seconds))

    def release(self, limit: Limit, ticket: str, token_delta: int) -> None:
        if limit.concurrency:
            ProviderSlot.objects.filter(key=limit.key, holder=ticket).update(holder="", expires_at=0)
        if limit.tpm and token_delta:  # the estimate taken before the call, corrected by the usage
            with transaction.atomic():
                row = ProviderBucket.objects.select_for_update().filter(key=limit.key).first()
                if row is not None:
                    row.tpm_level = min(row.tpm_level - token_delta, float(limit.tpm))
                    row.save(update_fields=["tpm_level"])

    def pause(self, limit: Limit, seconds: float) -> None:
        until = self.clock() + seconds
        self._bucket(limit)
        ProviderBucket.objects.filter(key=limit.key, paused_until__lt=until).update(paused_until=until)

    def held(self, limit: Limit) -> int:
        return ProviderSlot.objects.filter(key=limit.key, slot__lt=limit.concurrency).exclude(holder="") \
            .filter(expires_at__gte=self.clock()).count()

    # --- the pieces ------------------------------------------------------------------------------------

    def _ensure_slots(self, limit: Limit) -> None:
        if ProviderSlot.objects.filter(key=limit.key, slot__lt=limit.concurrency).count() < limit.concurrency:
            ProviderSlot.objects.bulk_create([ProviderSlot(key=limit.key, slot=n) for n in range(limit.concurrency)],
                                             ignore_conflicts=True)

    def _take(self, pk: int, ticket: str, until: float, now: float) -> bool:
        """The cap's guard: one UPDATE that succeeds only while the slot is still free or expired."""
        return bool(ProviderSlot.objects.filter(pk=pk).filter(Q(holder="") | Q(expires_at__lt=now))
                    .update(holder=ticket, expires_at=until))

    def _bucket(self, limit: Limit) -> ProviderBucket:
        row = ProviderBucket.objects.filter(key=limit.key).first()
        if row is None:
            try:
                with transaction.atomic():
                    row = ProviderBucket.objects.create(key=limit.key, rpm_level=limit.rpm, tpm_level=limit.tpm,
                                                        refilled_at=self.clock())
            except IntegrityError:
                row = ProviderBucket.objects.get(key=limit.key)
        return row

    @staticmethod
    def _levels(limit: Limit, row: ProviderBucket, now: float) -> tuple[float, float]:
        elapsed = max(now - row.refilled_at, 0.0)
        return (min(row.rpm_level + elapsed * limit.rpm / 60.0, float(limit.rpm)),
                min(row.tpm_level + elapsed * limit.tpm / 60.0, float(limit.tpm)))

    def _bucket_wait(self, limit: Limit, row: ProviderBucket, now: float, ahead: int, tokens: int) -> float:
        if row.paused_until > now:
            return row.paused_until - now
        rpm, tpm = self._levels(limit, row, now)
        need_req, need_tok = ahead + 1, min(tokens, limit.tpm)  # the calls ahead take theirs first
        wait = 0.0
        if limit.rpm and rpm < need_req:
            wait = max(wait, (need_req - rpm) * 60.0 / limit.rpm)
        if limit.tpm and tpm < need_tok:
            wait = max(wait, (need_tok - tpm) * 60.0 / limit.tpm)
        return wait

    def _debit(self, limit: Limit, tokens: int) -> bool:
        with transaction.atomic():  # short: read, refill, debit; nobody waits inside it
            row = ProviderBucket.objects.select_for_update().get(key=limit.key)
            now = self.clock()
            rpm, tpm = self._levels(limit, row, now)
            if (limit.rpm and rpm < 1) or (limit.tpm and tpm < min(tokens, limit.tpm)):
                return False
            row.rpm_level, row.tpm_level, row.refilled_at = rpm - (1 if limit.rpm else 0), tpm - (tokens if limit.tpm else 0), now
            row.save(update_fields=["rpm_level", "tpm_level", "refilled_at"])
            return True
