from __future__ import annotations

from django.db import models
from django.db.models import Q


class Space(models.Model):
    """An isolated team: its own members, mail, tasks, blackboard, events and workdir."""

    name = models.CharField(max_length=120)
    slug = models.SlugField(max_length=60, unique=True)
    description = models.TextField(blank=True)
    workdir = models.CharField(max_length=500, help_text="Folder the workspace tools are confined to.")
    manifest_path = models.CharField(max_length=500, blank=True)
    # settings
    member_daily_tokens = models.IntegerField(default=0, help_text="Default daily token budget per member (0 = unlimited).")
    daily_token_ceiling = models.IntegerField(default=0, help_text="Space-wide daily token ceiling (0 = off).")
    daily_usd_ceiling = models.DecimalField(max_digits=10, decimal_places=4, default=0, help_text="Space-wide daily USD ceiling (0 = off).")
    blackboard_cap = models.IntegerField(default=8000, help_text="Maximum blackboard size in characters.")
    stale_task_minutes = models.IntegerField(default=120, help_text="Running tasks older than this raise a reminder (0 = off).")
    retention_days = models.IntegerField(default=0, help_text="Purge read mail, events, wakes, runs, ended sessions and closed tasks older than this (0 = keep forever).")
    spawn_cap = models.IntegerField(default=4, help_text="How many live clones members may spawn.")
    default_permission_mode = models.CharField(max_length=10, default="bypass", choices=[("bypass", "bypass"), ("default", "default")])
    stuck_run_minutes = models.IntegerField(default=30, help_text="A run whose phase has not changed for this long while it holds its lease raises an ops alert (0 = off).")
    mailbox_backlog_minutes = models.IntegerField(default=60, help_text="Unread mail older than this raises an ops alert (0 = off).")
    verify_checks = models.JSONField(default=list, blank=True, help_text='Checks for tasks with verify "checks": [{"name", "command", "timeout"}].')
    notify_webhook_url = models.CharField(max_length=500, blank=True, help_text="Ops alerts are POSTed here as JSON.")
    notify_slack_url = models.CharField(max_length=500, blank=True, help_text="Slack-compatible incoming webhook for ops alerts.")
    notify_emails = models.TextField(blank=True, help_text="Comma-separated addresses that receive ops alerts by email.")
    # HMAC needs the secret itself, so it is stored; it is shown once (console / API on rotate) and
    # never again (admin masks it, the API never returns it). See veronica.ops.webhooks.
    webhook_secret = models.CharField(max_length=200, blank=True)
    webhook_rotated_at = models.DateTimeField(null=True, blank=True)
    rule_review_required = models.BooleanField(default=True, help_text="Learned-rule proposals wait for a person.")
    event_seq = models.BigIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(blackboard_cap__gte=100), name="space_blackboard_cap_min"),
            models.CheckConstraint(condition=Q(spawn_cap__gte=0), name="space_spawn_cap_nonneg"),
            models.CheckConstraint(condition=Q(member_daily_tokens__gte=0), name="space_member_budget_nonneg"),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        # event_seq belongs to events.emit alone: a stale in-memory copy (an admin form, a test
        # fixture) must never write an old counter back, or the next emit would reuse a seq.
        if self.pk and not kwargs.get("force_insert") and kwargs.get("update_fields") is None and not self._state.adding:
            kwargs["update_fields"] = [f.attname for f in self._meta.concrete_fields if not f.primary_key and f.name != "event_seq"]
        super().save(*args, **kwargs)
