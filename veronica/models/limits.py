"""The embedded mode's provider limiter (veronica.agent.providers.limiter_db): slots with expiry,
a FIFO of waiters, token buckets. Hosted mode keeps the same state in Redis instead."""
from __future__ import annotations

from django.db import models


class ProviderSlot(models.Model):
    """One of an endpoint's `concurrency` slots. Taken by a conditional UPDATE (free or expired);
    a holder that stops renewing (a killed worker) loses it at expires_at."""

    key = models.CharField(max_length=200)
    slot = models.PositiveIntegerField()
    holder = models.CharField(max_length=40, blank=True, default="")
    expires_at = models.FloatField(default=0.0, help_text="Epoch seconds.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "slot"], name="provider_slot_unique")]


class ProviderWaiter(models.Model):
    """A call waiting for a slot or for its rate budget; served in id order (first come, first served)."""

    key = models.CharField(max_length=200, db_index=True)
    ticket = models.CharField(max_length=40, unique=True)
    alive_until = models.FloatField(help_text="Epoch seconds; a waiter that stops polling is skipped after it.")


class ProviderBucket(models.Model):
    """Requests- and tokens-per-minute budgets of one limit, refilled continuously; paused_until: a
    vendor's Retry-After, shared so the other callers hold back too."""

    key = models.CharField(max_length=200, unique=True)
    rpm_level = models.FloatField(default=0.0)
    tpm_level = models.FloatField(default=0.0)
    refilled_at = models.FloatField(default=0.0)
    paused_until = models.FloatField(default=0.0)
