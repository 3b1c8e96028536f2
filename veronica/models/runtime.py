from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"


class Approval(models.Model):
    """A mutating tool call held for an operator in `default` permission mode."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="approvals")
    member = models.ForeignKey("veronica.Member", on_delete=models.CASCADE, related_name="approvals")
    tool_name = models.CharField(max_length=64)  # a vendor's tool-name limit (an MCP tool's name is up to 64)
    tool_args = models.JSONField(default=dict)
    tool_call_id = models.CharField(max_length=80, blank=True)
    status = models.CharField(max_length=10, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    reason = models.TextField(blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    consumed = models.BooleanField(default=False, help_text="The run has folded the decision into its transcript.")
    started_at = models.DateTimeField(null=True, blank=True, help_text=(
        "An approved call whose effects leave the database (files, commands, MCP) began here; a re-run after a "
        "crash reports it interrupted instead of running it twice."))
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.CheckConstraint(condition=Q(status__in=ApprovalStatus.values), name="approval_status_valid")]
        # the tick's sweep: decisions a run has not folded in yet
        indexes = [models.Index(fields=["decided_at"], condition=Q(consumed=False, decided_at__isnull=False), name="approval_unconsumed_idx")]

    def __str__(self) -> str:
        return f"{self.member} → {self.tool_name} ({self.status})"


class ApprovalRule(models.Model):
    """'Always for this tool on this member': the permission gate lets such calls run without holding
    them (veronica.engine.approvals). Revoking keeps the row (who allowed what, and until when)."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="approval_rules")
    member = models.ForeignKey("veronica.Member", on_delete=models.CASCADE, related_name="approval_rules")
    tool_name = models.CharField(max_length=64)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    from_approval = models.ForeignKey(Approval, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["member", "tool_name"], condition=Q(revoked_at__isnull=True),
                                               name="approval_rule_one_live")]

    def __str__(self) -> str:
        return f"always {self.tool_name} for {self.member}"


class Question(models.Model):
    """ask_operator: a member waits for an operator's answer."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="questions")
    member = models.ForeignKey("veronica.Member", on_delete=models.CASCADE, related_name="questions")
    text = models.TextField()
    tool_call_id = models.CharField(max_length=80, blank=True)
    answer = models.TextField(blank=True)
    answered_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    answered_at = models.DateTimeField(null=True, blank=True)
    consumed = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["answered_at"], condition=Q(consumed=False, answered_at__isnull=False), name="question_unconsumed_idx")]


class Session(models.Model):
    """A member's conversation. Clearing ends it; a new run starts a fresh one."""

    member = models.ForeignKey("veronica.Member", on_delete=models.CASCADE, related_name="sessions")
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=40, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["member"], condition=Q(ended_at__isnull=True), name="one_open_session_per_member")]


class TurnRole(models.TextChoices):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Turn(models.Model):
    """One transcript entry, persisted as it happens so a restart resumes the conversation."""

    # indexed by turn_seq_unique (session first), not by a lone session_id index every step's turns update too
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="turns", db_index=False)
    seq = models.IntegerField()
    role = models.CharField(max_length=10, choices=TurnRole.choices)
    content = models.TextField(blank=True)
    tool_calls = models.JSONField(default=list, blank=True)
    tool_call_id = models.CharField(max_length=80, blank=True)
    tool_name = models.CharField(max_length=64, blank=True)
    elided = models.BooleanField(default=False)
    mail_ids = models.JSONField(default=list, blank=True, help_text="Messages a brief carried; marked read once answered.")
    tokens = models.IntegerField(default=0)
    input_tokens = models.IntegerField(default=0, help_text="The call's input tokens: the member view's context pressure.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session_id", "seq"]
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="turn_seq_unique")]


class RunOutcome(models.TextChoices):
    RUNNING = "running"
    DONE = "done"
    ABORTED = "aborted"
    PAUSED = "paused"
    WAITING = "waiting"
    ERROR = "error"
    BUDGET = "budget"
    LEASE_EXPIRED = "lease_expired"


class Run(models.Model):
    """One claimed run slot, start to end: the record the metrics and the overlap tests read."""

    member = models.ForeignKey("veronica.Member", on_delete=models.CASCADE, related_name="runs")
    source = models.CharField(max_length=10)
    lease_token = models.CharField(max_length=40)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=14, choices=RunOutcome.choices, default=RunOutcome.RUNNING)
    steps = models.IntegerField(default=0)
    model_calls = models.IntegerField(default=0)
    tokens = models.IntegerField(default=0)
    error = models.TextField(blank=True)
    # Built once at the run's start and sent with each of its model calls (the prompt inspector shows
    # it for past calls); written with the run's end, in the same statement; retention purges it with the run.
    system_prompt = models.TextField(blank=True)

    class Meta:
        ordering = ["-id"]


class Wake(models.Model):
    """A wake received by a worker (counted by source for the metrics), claimed or coalesced."""

    member = models.ForeignKey("veronica.Member", on_delete=models.CASCADE, related_name="wakes")
    source = models.CharField(max_length=10)
    claimed = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)


class UsageDay(models.Model):
    """Tokens by class and USD for one member on one UTC day."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="usage_days")
    member = models.ForeignKey("veronica.Member", on_delete=models.CASCADE, related_name="usage_days")
    day = models.DateField()
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cache_read_tokens = models.BigIntegerField(default=0)
    cache_write_tokens = models.BigIntegerField(default=0)
    usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    runs = models.IntegerField(default=0)
    model_calls = models.IntegerField(default=0)
    estimated_calls = models.IntegerField(default=0, help_text="Calls whose usage the vendor did not report (estimated).")
    tripped = models.BooleanField(default=False, help_text="The budget breaker tripped; no more runs today.")
    budget_offset = models.BigIntegerField(default=0, help_text=(
        "Tokens already used when an owner reset the day: the member's own budget counts from there."))

    class Meta:
        ordering = ["-day"]
        constraints = [models.UniqueConstraint(fields=["member", "day"], name="usage_day_unique")]

    @property
    def total_tokens(self) -> int:
        """Every billed token, cache reads and writes included (what a token budget counts)."""
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens


class Alarm(models.Model):
    """A durable one-shot wake. fired_at is set by the conditional update that fires it."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="alarms")
    member = models.ForeignKey("veronica.Member", on_delete=models.CASCADE, related_name="alarms")
    fire_at = models.DateTimeField(db_index=True)
    note = models.TextField(blank=True)
    created_by = models.CharField(max_length=60)
    fired_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["fire_at"]
