"""waggle's tables. Keys from the host are plain strings (no foreign keys to other apps).

* ForageCall: the recorded call stream, bounded by retention, mined across runs.
* Waggle: a stored route in scope ``space`` (one space's library) or ``global`` (shared).
* LedgerEntry: one reuse (or failed reuse) of a waggle; stats are aggregates of these rows.
* FiredPlan: which concrete plans already fired in a session (so "once per session" holds across
  worker processes).
"""
from __future__ import annotations

from django.db import models, transaction
from django.utils import timezone

from waggle import routecache


class ForageCall(models.Model):
    # indexed by waggle_fc_session_seq and waggle_fc_space_id (space_key first; every read names the space):
    # no index of its own (and its pattern-ops twin) for each recorded tool call to update too
    space_key = models.CharField(max_length=64)
    session_key = models.CharField(max_length=64)
    member_key = models.CharField(max_length=64, blank=True, default="")
    seq = models.PositiveBigIntegerField(help_text="Position in the session's call stream.")
    tool = models.CharField(max_length=200)
    args = models.JSONField(default=dict, blank=True, help_text="Arguments with their JSON types.")
    mutates = models.BooleanField(default=False)
    replayed = models.BooleanField(default=False, help_text="Run by a waggle replay, not by the model (never mined).")
    oversized = models.BooleanField(default=False, help_text="An argument was too long to keep: only a barrier.")
    out_hash = models.CharField(max_length=16, blank=True, default="")
    out_refs = models.JSONField(default=list, blank=True,
                                help_text="Short scalar leaves of a JSON output as [path, value]: what later steps may bind to.")
    est_tokens = models.PositiveIntegerField(default=0)
    created = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        indexes = [
            models.Index(fields=["space_key", "session_key", "seq"], name="waggle_fc_session_seq"),
            models.Index(fields=["space_key", "id"], name="waggle_fc_space_id"),
        ]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.session_key}#{self.seq} {self.tool}"


def _routes_changed() -> None:
    """A write to waggle_waggle: this process's cached routes are stale now, and again at the commit
    (another thread may read the rows in between; see waggle.routecache)."""
    routecache.changed()
    transaction.on_commit(routecache.AtCommit())


class WaggleQuerySet(models.QuerySet):
    """Every bulk write of routes tells the route cache (an update, a delete, a bulk insert)."""

    def update(self, **kwargs):
        try:
            return super().update(**kwargs)
        finally:
            _routes_changed()

    def delete(self):
        try:
            return super().delete()
        finally:
            _routes_changed()

    def bulk_create(self, objs, *args, **kwargs):
        try:
            return super().bulk_create(objs, *args, **kwargs)
        finally:
            _routes_changed()


class Waggle(models.Model):
    SCOPE_SPACE = "space"
    SCOPE_GLOBAL = "global"
    SCOPES = [(SCOPE_SPACE, "space"), (SCOPE_GLOBAL, "global")]

    name = models.CharField(max_length=200)
    scope = models.CharField(max_length=10, choices=SCOPES, default=SCOPE_SPACE)
    space_key = models.CharField(max_length=64, blank=True, default="",
                                 help_text="The owning space; empty for global waggles.")
    route = models.JSONField(default=dict)
    script = models.TextField(blank=True, default="")
    length = models.PositiveSmallIntegerField(default=0)
    mined_count = models.PositiveIntegerField(default=0, help_text="Occurrences when mined.")
    disabled = models.BooleanField(default=False)
    created = models.DateTimeField(default=timezone.now)
    touched = models.DateTimeField(default=timezone.now,
                                   help_text="Creation, or the last demotion / enabling; prune ages from here.")

    objects = WaggleQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "space_key", "name"], name="waggle_unique_name_per_store"),
        ]
        indexes = [models.Index(fields=["space_key", "scope", "disabled"], name="waggle_w_lookup")]
        ordering = ["scope", "space_key", "name"]

    def save(self, *args, **kwargs):
        try:
            super().save(*args, **kwargs)
        finally:
            _routes_changed()

    def delete(self, *args, **kwargs):
        try:
            return super().delete(*args, **kwargs)
        finally:
            _routes_changed()

    def __str__(self) -> str:
        where = self.space_key if self.scope == self.SCOPE_SPACE else "global"
        return f"{self.name} ({where})"


class LedgerEntry(models.Model):
    """One reuse of a waggle. ``yield_tokens`` is an estimate (chars / 4), not a measurement.

    A replay is written unsettled; when the model's next reply arrives it is settled: each replayed
    step the model relied on is *used* (``used_steps``), the others are misses. A replay none of
    whose steps was used is a failure."""

    name = models.CharField(max_length=200)
    scope = models.CharField(max_length=10, choices=Waggle.SCOPES)
    store_key = models.CharField(max_length=64, blank=True, default="",
                                 help_text="The waggle's space (empty for global waggles).")
    space_key = models.CharField(max_length=64, help_text="Where it was used.")
    session_key = models.CharField(max_length=64, blank=True, default="")
    steps = models.PositiveSmallIntegerField(default=0)
    used_steps = models.PositiveSmallIntegerField(default=0, help_text="Replayed steps the model relied on.")
    settled = models.BooleanField(default=True, help_text="False until the model's next reply judged the replay.")
    yield_tokens = models.PositiveIntegerField(default=0, verbose_name="estimated tokens saved")
    fail = models.BooleanField(default=False)
    on_demand = models.BooleanField(default=False)
    detail = models.CharField(max_length=500, blank=True, default="")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["scope", "store_key", "name"], name="waggle_le_owner"),
            models.Index(fields=["space_key", "created"], name="waggle_le_space_day"),
        ]
        ordering = ["-created", "-id"]
        verbose_name_plural = "ledger entries"

    def __str__(self) -> str:
        return f"{self.name} {'fail' if self.fail else 'use'} ~{self.yield_tokens}"


class FiredPlan(models.Model):
    session_key = models.CharField(max_length=64)
    plan_key = models.CharField(max_length=64)
    space_key = models.CharField(max_length=64, blank=True, default="")
    name = models.CharField(max_length=200, blank=True, default="")
    tail = models.JSONField(default=list, blank=True, help_text="The replayed calls, [tool, {key: JSON text}].")
    ledger_id = models.BigIntegerField(null=True, blank=True)
    settled = models.BooleanField(default=True)
    created = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["space_key", "session_key", "plan_key"],
                                    name="waggle_fired_once_per_session"),
        ]
