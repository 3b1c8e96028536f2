"""Operations rows: verify-check evidence and outbound notification deliveries."""
from __future__ import annotations

from django.db import models
from django.db.models import Q


class TaskCheck(models.Model):
    """One configured check run against a task in `verifying`: the evidence a reviewer reads."""

    task = models.ForeignKey("veronica.Task", on_delete=models.CASCADE, related_name="checks")
    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="task_checks")
    attempt = models.IntegerField(default=1, help_text="Which verification of this task (1 = the first).")
    name = models.CharField(max_length=60)
    command = models.TextField()
    exit_code = models.IntegerField(null=True, blank=True, help_text="Empty when the check timed out or could not start.")
    timed_out = models.BooleanField(default=False)
    passed = models.BooleanField(default=False)
    output = models.TextField(blank=True, help_text="Combined stdout/stderr, truncated.")
    duration_ms = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["task_id", "attempt", "id"]
        indexes = [models.Index(fields=["space", "passed", "timed_out"])]

    def __str__(self) -> str:
        return f"#{self.task_id} {self.name}: {'passed' if self.passed else 'failed'}"


class Channel(models.TextChoices):
    WEBHOOK = "webhook"
    SLACK = "slack"
    EMAIL = "email"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


class NotificationDelivery(models.Model):
    """One ops alert on its way out through one channel. A row per (event, channel): the alert's
    own once-per-episode dedup carries over, and retries survive restarts (the tick retries due rows)."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey("veronica.Event", null=True, blank=True, on_delete=models.SET_NULL, related_name="deliveries")
    seq = models.BigIntegerField(help_text="The alert's event seq in its space.")
    channel = models.CharField(max_length=10, choices=Channel.choices)
    target = models.TextField(help_text="URL or comma-separated recipients at the time of the alert.")
    subject = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.IntegerField(default=0)
    next_at = models.DateTimeField(null=True, blank=True, help_text="When the next attempt is due (pending only).")
    last_error = models.TextField(blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["space", "seq", "channel"], name="delivery_once_per_alert_channel"),
            models.CheckConstraint(condition=Q(channel__in=Channel.values), name="delivery_channel_valid"),
            models.CheckConstraint(condition=Q(status__in=DeliveryStatus.values), name="delivery_status_valid"),
        ]
        indexes = [models.Index(fields=["status", "next_at"])]
        verbose_name_plural = "notification deliveries"

    def __str__(self) -> str:
        return f"{self.channel} #{self.seq}: {self.status}"


class AlertTally(models.Model):
    """How many ops alerts of one kind a space has raised, for /metrics: a counter that retention
    never lowers (the alerts' events and the watchdogs' episode markers do not last)."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="alert_tallies")
    subject = models.CharField(max_length=40, help_text="The alert's subject: stale task, mailbox backlog, stuck run, ...")
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["space", "subject"], name="alert_tally_one_per_subject")]

    def __str__(self) -> str:
        return f"{self.subject}: {self.count}"
