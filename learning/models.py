"""The rules store: rules, proposals, history, mining ledgers, the writer lease.

Write paths, in one place so they can be audited:

* user rules   -> learning.api.add_user_rule / edit_user_rule / remove_user_rule (people only);
* learned rules -> learning.store.apply_ops (an approved proposal, one transaction) and
  learning.store.restore_learned (a person's revert) and set_learned_enabled (a person's toggle);
* everything else a pass writes is its own bookkeeping (ledgers, reflections, proposals, runs).

`Rule.save()` / `Rule.delete()` refuse a user rule outside the people-write context, so a pass
that tried to write one would fail loudly instead of silently rewriting the operator's rules.

Every rule, proposal, reflection and history row belongs to one `Domain`. A domain is a name in an
owner's namespace (`owner` is an opaque key the host sets, e.g. "space:12"; learning never reads
meaning into it), so two owners naming "conduct" have two domains that never meet. A global domain
(shared by every owner that routes `global:<name>`) is created deliberately by staff in the admin.
A domain with no owner that is not global is unowned: routed to no one, visible to staff only.
"""
from __future__ import annotations

import contextvars
import secrets
from contextlib import contextmanager

from django.db import IntegrityError, models, transaction
from django.db.models import Q

MAX_ACTIVE_RULES_PER_DOMAIN = 25
MAX_RULE_CHARS = 1000
DOMAIN_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
GLOBAL_PREFIX = "global:"  # how a member routes a global domain: "global:<name>"
MAX_OWNER_CHARS = 100

_people_write: contextvars.ContextVar[bool] = contextvars.ContextVar("learning_people_write", default=False)


@contextmanager
def people_write():
    """Marks a write of user rules as coming from a person (admin, console). Used by learning.api only."""
    token = _people_write.set(True)
    try:
        yield
    finally:
        _people_write.reset(token)


class UserRuleWriteRefused(RuntimeError):
    pass


class RuleSource(models.TextChoices):
    USER = "user"
    LEARNED = "learned"


class RuleQuerySet(models.QuerySet):
    """Bulk writes get the same guard as Rule.save(): they may not touch user rules outside the
    people-write context (one extra EXISTS query; rule writes are rare)."""

    def _guard(self) -> None:
        if not _people_write.get() and self.filter(source=RuleSource.USER).exists():
            raise UserRuleWriteRefused("user rules are written only by people, through learning.api")

    def update(self, **kwargs):
        self._guard()
        return super().update(**kwargs)

    def delete(self):
        self._guard()
        return super().delete()

    def bulk_create(self, objs, *args, **kwargs):
        objs = list(objs)
        if not _people_write.get() and any(o.source == RuleSource.USER for o in objs):
            raise UserRuleWriteRefused("user rules are written only by people, through learning.api")
        return super().bulk_create(objs, *args, **kwargs)

    def bulk_update(self, objs, fields, *args, **kwargs):
        objs = list(objs)
        if not _people_write.get() and any(o.source == RuleSource.USER for o in objs):
            raise UserRuleWriteRefused("user rules are written only by people, through learning.api")
        return super().bulk_update(objs, fields, *args, **kwargs)


class Domain(models.Model):
    name = models.CharField(max_length=64)
    owner = models.CharField(max_length=MAX_OWNER_CHARS, blank=True, db_index=True,
                             help_text='Opaque key of the owner (Veronica: "space:<id>"). Empty: global, or unowned.')
    is_global = models.BooleanField(default=False, help_text="Shared by every owner that routes global:<name>. Staff only.")
    note = models.TextField(blank=True, help_text="Where the domain came from (e.g. a migration split).")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-is_global", "owner", "name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "is_global", "name"], name="learning_domain_owner_name_uniq"),
            models.CheckConstraint(condition=Q(is_global=False) | Q(owner=""), name="learning_domain_global_has_no_owner"),
        ]

    @property
    def ref(self) -> str:
        """How a member routes it: the bare name in its owner's namespace, or global:<name>."""
        return f"{GLOBAL_PREFIX}{self.name}" if self.is_global else self.name

    @property
    def label(self) -> str:
        if self.is_global:
            return f"{GLOBAL_PREFIX}{self.name}"
        return f"{self.owner}/{self.name}" if self.owner else f"unowned/{self.name}"

    def __str__(self) -> str:
        return self.label

    def save(self, *args, **kwargs):
        bump_stamp()  # ownership decides who reads the rules: cached blocks must go
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        bump_stamp()
        return super().delete(*args, **kwargs)


class Rule(models.Model):
    domain = models.ForeignKey(Domain, on_delete=models.PROTECT, related_name="rules")
    source = models.CharField(max_length=10, choices=RuleSource.choices)
    text = models.TextField()
    enabled = models.BooleanField(default=True, help_text="Learned rules only; user rules are always active.")
    strength = models.PositiveIntegerField(default=1, help_text="Learned rules: how many reflections agreed with it.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    created_by = models.CharField(max_length=150, blank=True)
    updated_by = models.CharField(max_length=150, blank=True)

    objects = RuleQuerySet.as_manager()

    class Meta:
        ordering = ["domain", "source", "id"]
        indexes = [models.Index(fields=["domain", "source", "enabled"], name="learning_rule_dse")]
        constraints = [
            models.CheckConstraint(condition=Q(source__in=RuleSource.values), name="learning_rule_source_valid"),
        ]

    def __str__(self) -> str:
        return f"[{self.domain}/{self.source}] {self.text[:60]}"

    @property
    def ref(self) -> str:
        return f"{'U' if self.source == RuleSource.USER else 'L'}{self.pk}"

    def _guard(self) -> None:
        if self.source == RuleSource.USER and not _people_write.get():
            raise UserRuleWriteRefused("user rules are written only by people, through learning.api")

    def save(self, *args, **kwargs):
        self._guard()
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        self._guard()
        return super().delete(*args, **kwargs)


class StoreState(models.Model):
    """Singleton (pk=1). `stamp` is set to a fresh random value in the same transaction as every rule
    change, so a reader can key a cache on it with one cheap query and never serve a stale rule set.
    Random rather than a counter: a rolled-back or flushed counter could come back to a value some
    process already cached for a different rule set; a random stamp cannot (2**-62)."""

    stamp = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = "store state"


# the stamp (cache key): moved here from learning.store so a Domain's save can bump it without importing the store
def bump_stamp() -> int:
    """Call inside the writer's transaction, first: row-locks the singleton on PostgreSQL."""
    stamp = secrets.randbits(62) + 1
    if not StoreState.objects.filter(pk=1).update(stamp=stamp):
        try:
            with transaction.atomic():
                StoreState.objects.create(pk=1, stamp=stamp)
        except IntegrityError:
            StoreState.objects.filter(pk=1).update(stamp=stamp)
    return stamp


class WriterLease(models.Model):
    """The store's writer lock, as a lease row (see learning.lock for why a lease)."""

    name = models.CharField(max_length=40, primary_key=True)
    holder = models.CharField(max_length=64, blank=True, help_text="Token of the current holder; empty when free.")
    holder_label = models.CharField(max_length=200, blank=True)
    acquired_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name}: {self.holder_label or 'free'}"


class MinedKind(models.TextChoices):
    SESSION = "session"
    OUTBOX = "outbox"
    CORRECTION = "correction"
    DISTILLED = "distilled"


class PassKind(models.TextChoices):
    REFLECT = "reflect"
    LEARN = "learn"
    DISTILL = "distill"


class PassStatus(models.TextChoices):
    RUNNING = "running"
    OK = "ok"
    ERROR = "error"  # finished, but at least one item / domain failed (and changed nothing)
    BUSY = "busy"  # could not take the writer lock in time
    LOST = "lost"  # lost the lease mid-pass; stopped without writing
    CRASHED = "crashed"


class PassRun(models.Model):
    kind = models.CharField(max_length=10, choices=PassKind.choices)
    status = models.CharField(max_length=10, choices=PassStatus.choices, default=PassStatus.RUNNING)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    stats = models.JSONField(default=dict, blank=True)
    errors = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} ({self.status})"


class MinedItem(models.Model):
    """The mining ledgers. One table, but every query names its kind and (kind, key) is unique, so a
    key in one ledger never satisfies another."""

    kind = models.CharField(max_length=12, choices=MinedKind.choices)
    key = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    pass_run = models.ForeignKey(PassRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="mined")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "key"], name="learning_mined_kind_key_uniq")]

    def __str__(self) -> str:
        return f"{self.kind}:{self.key}"


class ProposalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


class Proposal(models.Model):
    domain = models.ForeignKey(Domain, on_delete=models.PROTECT, related_name="proposals")
    status = models.CharField(max_length=10, choices=ProposalStatus.choices, default=ProposalStatus.PENDING)
    ops = models.JSONField(default=list, help_text="Operations on the domain's learned rules.")
    original_ops = models.JSONField(null=True, blank=True, help_text="The pass's ops, when a reviewer edited them.")
    base = models.JSONField(default=list, help_text="Learned rules the ops were proposed against.")
    diff = models.JSONField(default=list, help_text="Diff against `base` at proposal time.")
    rationale = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    pass_run = models.ForeignKey(PassRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="proposals")
    decided_by = models.CharField(max_length=150, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)
    auto_approved = models.BooleanField(default=False)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"Proposal #{self.pk} for {self.domain} ({self.status})"


class Reflection(models.Model):
    kind = models.CharField(max_length=12, choices=MinedKind.choices)
    item_key = models.CharField(max_length=255)
    member_key = models.CharField(max_length=150, blank=True)
    domain = models.ForeignKey(Domain, on_delete=models.PROTECT, related_name="reflections")
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    pass_run = models.ForeignKey(PassRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="reflections")
    consumed_at = models.DateTimeField(null=True, blank=True)
    proposal = models.ForeignKey(Proposal, null=True, blank=True, on_delete=models.SET_NULL, related_name="reflections")

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.domain}: {self.text[:60]}"


class ChangeAction(models.TextChoices):
    ADD = "add"
    EDIT = "edit"
    REMOVE = "remove"
    APPLY = "apply"  # an approved proposal
    ENABLE = "enable"
    DISABLE = "disable"
    REVERT = "revert"
    SPLIT = "split"  # a migration gave each owner of a shared domain its own copy


class RuleChange(models.Model):
    """History: who, what, when, and a diff. `before` / `after` are snapshots of the rules the change
    touched (one user rule, or the domain's whole learned set), which is what a revert restores."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=150)
    domain = models.ForeignKey(Domain, on_delete=models.PROTECT, related_name="changes")
    source = models.CharField(max_length=10, choices=RuleSource.choices)
    action = models.CharField(max_length=10, choices=ChangeAction.choices)
    summary = models.CharField(max_length=300, blank=True)
    before = models.JSONField(default=list)
    after = models.JSONField(default=list)
    diff = models.JSONField(default=list)
    proposal = models.ForeignKey(Proposal, null=True, blank=True, on_delete=models.SET_NULL, related_name="changes")
    reverts = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reverted_by")

    class Meta:
        ordering = ["-id"]
        verbose_name = "rule change"

    def __str__(self) -> str:
        return f"#{self.pk} {self.action} {self.domain}/{self.source} by {self.actor}"
