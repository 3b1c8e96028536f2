from __future__ import annotations

from django.db import models
from django.db.models import Q


class Role(models.TextChoices):
    LEADER = "leader"
    WORKER = "worker"


class Membership(models.TextChoices):
    ACTIVE = "active"
    FROZEN = "frozen"


class RunStatus(models.TextChoices):
    IDLE = "idle"
    BUSY = "busy"
    SUSPENDED = "suspended"


class PermissionMode(models.TextChoices):
    BYPASS = "bypass"
    DEFAULT = "default"


class Origin(models.TextChoices):
    MANIFEST = "manifest"
    RUNTIME = "runtime"


class RetirePolicy(models.TextChoices):
    NONE = ""
    ON_COMPLETE = "on_complete"
    MANUAL = "manual"


class Phase(models.TextChoices):
    READY = "ready"
    THINKING = "thinking"
    TEXTING = "texting"
    EXECUTING = "executing"
    WAITING_APPROVAL = "waiting-approval"
    WAITING_INPUT = "waiting-input"
    COMPACTING = "compacting"
    PAUSED = "paused"
    ERROR = "error"


def _choices_check(field: str, choices: type[models.TextChoices], name: str) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Q(**{f"{field}__in": choices.values}), name=name)


class Member(models.Model):
    """One long-lived agent of a space. Removal is soft (removed_at) so history stays intact."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="members")
    name = models.CharField(max_length=60)
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.WORKER)
    persona = models.TextField(blank=True, help_text="System prompt.")
    when_to_use = models.TextField(blank=True)
    model = models.CharField(max_length=120, default="offline", help_text="offline | openai:MODEL | anthropic:MODEL")
    fallback = models.JSONField(default=list, blank=True, help_text=(
        "Model specs tried in order when the model is overloaded or down (429 / 5xx / 529 / unreachable after "
        "retries), e.g. [\"openai:gpt-4o\"]."))
    permission_mode = models.CharField(max_length=10, choices=PermissionMode.choices, default=PermissionMode.BYPASS)
    permission_origin = models.CharField(max_length=10, choices=Origin.choices, default=Origin.MANIFEST)
    membership = models.CharField(max_length=10, choices=Membership.choices, default=Membership.ACTIVE)
    run_status = models.CharField(max_length=10, choices=RunStatus.choices, default=RunStatus.IDLE)
    phase = models.CharField(max_length=20, choices=Phase.choices, default=Phase.READY)
    phase_tool = models.CharField(max_length=64, blank=True)  # a tool's name (up to 64) or a short detail
    phase_since = models.DateTimeField(null=True, blank=True)
    current_task = models.ForeignKey("veronica.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # schedule: the live cron, where it came from, and the manifest's own value for a fresh register
    schedule = models.CharField(max_length=120, blank=True)
    schedule_origin = models.CharField(max_length=10, choices=Origin.choices, default=Origin.MANIFEST)
    schedule_set_at = models.DateTimeField(null=True, blank=True)
    schedule_tombstone = models.BooleanField(default=False, help_text="Cleared at runtime; beats the manifest until a fresh register.")
    schedule_next_at = models.DateTimeField(null=True, blank=True)
    budget_override = models.IntegerField(null=True, blank=True, help_text=">0 caps, <0 unlimited, empty = space default")
    spawned_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="clones")
    retire_policy = models.CharField(max_length=12, choices=RetirePolicy.choices, blank=True, default="")
    clone_seq = models.IntegerField(default=0, help_text="Next clone number of this base; never reused.")
    lease_token = models.CharField(max_length=40, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    wake_queued_at = models.DateTimeField(
        null=True, blank=True, help_text="A mail wake is queued, or a run holds the slot and looks at the mailbox when it ends: "
                                         "further mail rings nothing (veronica.engine.wakes.ring).")
    # failure model (DESIGN §3): consecutive failed runs, when a transient one is retried, and why
    failures = models.IntegerField(default=0, help_text="Consecutive failed runs; a clean run resets it.")
    retry_at = models.DateTimeField(null=True, blank=True, help_text="Backoff after a transient failure: no run before this.")
    error_reason = models.TextField(blank=True, help_text="The last failure, shown on the roster and member page.")
    parked_config = models.CharField(max_length=200, blank=True,
                                     help_text="Parked by a permanent error under this 'model|permission mode'; resume or a change un-parks.")
    rule_domains = models.JSONField(default=list, blank=True)
    max_iterations = models.IntegerField(default=24)
    # the member's tool set (seed: active and deferred tools): None offers every tool of its role; a list
    # offers only those names (built-in or mcp__<server>__<tool>, or mcp__<server>__* for a whole server)
    tools = models.JSONField(null=True, blank=True, default=None, help_text="Offered tools; empty = every tool of the role.")
    deferred_tools = models.JSONField(default=list, blank=True,
                                      help_text="Offered but not loaded: named in the prompt, loaded on first use.")
    # fields an operator edited at runtime (supervisor.edit_member): a restart register keeps them, --fresh discards them
    runtime_fields = models.JSONField(default=list, blank=True, help_text="Fields edited at runtime; register keeps them.")
    stuck_alerted_at = models.DateTimeField(null=True, blank=True, help_text="Stuck-run alert raised; cleared when the episode ends.")
    backlog_alerted_at = models.DateTimeField(null=True, blank=True, help_text="Mailbox-backlog alert raised; cleared when the episode ends.")
    removed_at = models.DateTimeField(null=True, blank=True)
    # who made the seat: a restart-register keeps an operator's members and removals (only --fresh undoes them)
    origin = models.CharField(max_length=10, choices=Origin.choices, default=Origin.MANIFEST,
                              help_text="manifest = declared by the manifest; runtime = added by an operator or the API.")
    removed_by = models.CharField(max_length=80, blank=True, help_text="Who removed it ('manifest' = a register).")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["space_id", "role", "name"]
        constraints = [
            models.UniqueConstraint(fields=["space", "name"], condition=Q(removed_at__isnull=True), name="member_name_unique_per_space"),
            models.UniqueConstraint(fields=["space"], condition=Q(role="leader", removed_at__isnull=True), name="one_leader_per_space"),
            _choices_check("role", Role, "member_role_valid"),
            _choices_check("membership", Membership, "member_membership_valid"),
            _choices_check("run_status", RunStatus, "member_run_status_valid"),
            _choices_check("permission_mode", PermissionMode, "member_permission_mode_valid"),
            _choices_check("retire_policy", RetirePolicy, "member_retire_policy_valid"),
            models.CheckConstraint(condition=Q(max_iterations__gte=1), name="member_max_iterations_min"),
        ]
        # The engine tick's reads (issue 25.3): each duty finds what is due through a partial index
        # holding only the members that could be, so a tick costs nothing per idle member.
        indexes = [
            models.Index(fields=["run_status", "membership"]),
            # The leased members, keyed by what a claim writes, not by the lease's end: every fence and
            # heartbeat moves lease_expires_at, and an index on it made each of those updates write a
            # new entry in every index of the table (no HOT update). The watchdog reads the lease ends
            # of the runs in flight from their rows.
            models.Index(fields=["lease_token"], condition=~Q(lease_token=""), name="member_leased_idx"),
            models.Index(fields=["schedule_next_at"], condition=Q(removed_at__isnull=True) & ~Q(schedule=""), name="member_cron_due_idx"),
            models.Index(fields=["retry_at"], condition=Q(retry_at__isnull=False), name="member_retry_due_idx"),
            models.Index(fields=["parked_config"], condition=Q(parked_config__gt=""), name="member_parked_idx"),
            models.Index(fields=["space"], condition=Q(retire_policy="on_complete", removed_at__isnull=True), name="member_clone_idx"),
            models.Index(fields=["stuck_alerted_at"], condition=Q(stuck_alerted_at__isnull=False), name="member_stuck_alert_idx"),
            models.Index(fields=["backlog_alerted_at"], condition=Q(backlog_alerted_at__isnull=False), name="member_backlog_alert_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.space_id}"

    @property
    def is_active(self) -> bool:
        return self.membership == Membership.ACTIVE and self.removed_at is None

    @property
    def display_phase(self) -> str:
        """Suspended wins over the fine phase; executing / waiting-approval carry the tool name, thinking a retry."""
        if self.removed_at is not None:
            return "removed"
        if self.membership == Membership.FROZEN:
            return "frozen"
        if self.run_status == RunStatus.SUSPENDED:
            return "suspended"
        phase = self.phase or self.run_status
        if phase in (Phase.EXECUTING, Phase.WAITING_APPROVAL, Phase.THINKING) and self.phase_tool:  # thinking: retry state
            return f"{phase}:{self.phase_tool}"
        return phase
