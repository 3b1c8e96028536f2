from __future__ import annotations

from django.db import models
from django.db.models import Q


class TaskStatus(models.TextChoices):
    PENDING = "pending"
    READY = "ready"
    RUNNING = "running"
    VERIFYING = "verifying"
    DONE = "done"
    FAILED = "failed"
    BLOCKED = "blocked"
    CANCELLED = "cancelled"


class VerifyPolicy(models.TextChoices):
    AUTO = "auto"
    CHECKS = "checks"
    LEADER = "leader"
    OFF = "off"


class Task(models.Model):
    """A ledger row. Its status changes only through veronica.swarm.ledger."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="tasks")
    title = models.CharField(max_length=200)
    spec = models.TextField(blank=True)
    assignee = models.ForeignKey("veronica.Member", null=True, blank=True, on_delete=models.PROTECT, related_name="tasks")
    creator_name = models.CharField(max_length=60)
    status = models.CharField(max_length=12, choices=TaskStatus.choices, default=TaskStatus.PENDING)
    depends_on = models.ManyToManyField("self", symmetrical=False, blank=True, related_name="dependents")
    not_before = models.DateTimeField(null=True, blank=True)
    engine_managed = models.BooleanField(default=False, help_text="The engine tick dispatches it when ready.")
    verify_policy = models.CharField(max_length=8, choices=VerifyPolicy.choices, default=VerifyPolicy.AUTO)
    check_evidence = models.TextField(blank=True)
    check_claimed_at = models.DateTimeField(null=True, blank=True, help_text="A check runner holds this verification.")
    result = models.TextField(blank=True)
    status_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    stale_notified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=TaskStatus.values), name="task_status_valid"),
            models.CheckConstraint(condition=Q(verify_policy__in=VerifyPolicy.values), name="task_verify_policy_valid"),
        ]
        indexes = [
            models.Index(fields=["space", "status"]), models.Index(fields=["assignee", "status"]),
            # the board's columns, newest first, however many tasks a column holds
            models.Index(fields=["space", "status", "-updated_at", "-id"], name="task_board_idx"),
            # the API's task list without a status, newest first (it sorted all of a space's tasks: 110 ms at 100,000)
            models.Index(fields=["space", "-updated_at", "-id"], name="task_recent_idx"),
            # the engine tick: running tasks not yet reminded, pending ones with a start time, engine-managed open ones
            models.Index(fields=["started_at"], condition=Q(status="running", stale_notified_at__isnull=True), name="task_running_idx"),
            models.Index(fields=["not_before"], condition=Q(status="pending", not_before__isnull=False), name="task_not_before_idx"),
            models.Index(fields=["space"], condition=Q(engine_managed=True, status__in=["pending", "ready"]), name="task_engine_open_idx"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}"
