from __future__ import annotations

from django.conf import settings
from django.db import models


class Message(models.Model):
    """One delivered mail. A broadcast is one row per recipient. Only retention deletes it (read, and
    older than the space's retention_days; see veronica.engine.retention)."""

    # indexed by msg_space_newest_idx (space first), not by a lone space_id index of its own
    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="messages", db_index=False)
    sender = models.ForeignKey("veronica.Member", null=True, blank=True, on_delete=models.PROTECT, related_name="sent_messages")
    sender_name = models.CharField(max_length=60, help_text="Member name, 'operator' or 'system'.")
    recipient = models.ForeignKey("veronica.Member", null=True, blank=True, on_delete=models.PROTECT, related_name="inbox")
    recipient_name = models.CharField(max_length=60, help_text="Member name or 'operator'.")
    subject = models.CharField(max_length=200, blank=True)
    body = models.TextField()
    task = models.ForeignKey("veronica.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="messages")
    broadcast = models.BooleanField(default=False)
    read_at = models.DateTimeField(null=True, blank=True)
    # Mail to the operator is accepted in the console, optionally edited first; an edit is a
    # lesson the learning app mines (its outbox ledger).
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    accepted_body = models.TextField(blank=True)
    # A member's final text for a run woken by operator mail is recorded as its reply (veronica.swarm.chat)
    reply_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replies",
                                 help_text="The operator's message this reply answers (a run's final text).")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["id"]
        # a member's unread mail, oldest first: the claim's and the wake's "any unread?" probes, the brief's
        # read, and the backlog watchdog's oldest-unread per member (one index entry, no sort, with or
        # without planner statistics); a read message leaves it, so marking mail read adds no entry to it
        indexes = [models.Index(fields=["recipient", "created_at"], condition=models.Q(read_at__isnull=True),
                                name="msg_unread_recipient_idx"),
                   # the space's chat panel, newest first: without it a small space beside a big one walked the
                   # whole table backwards by id for its last 30 (1.8 s beside 500,000 messages)
                   models.Index(fields=["space", "-id"], name="msg_space_newest_idx"),
                   # the tick's sweep and backlog watchdog start from old unread mail, not from members
                   models.Index(fields=["created_at"], condition=models.Q(read_at__isnull=True), name="msg_unread_age_idx"),
                   # a member's chat with the operator (veronica.swarm.chat.thread_directions), newest first: without them a
                   # member with no such mail scanned every message of its space for the page's last 50
                   models.Index(fields=["recipient", "-id"], condition=models.Q(sender_name="operator"), name="msg_from_operator_idx"),
                   models.Index(fields=["sender", "-id"], condition=models.Q(recipient_name="operator"), name="msg_to_operator_idx")]

    def __str__(self) -> str:
        return f"{self.sender_name} → {self.recipient_name}: {self.subject or self.body[:40]}"


class WebhookDelivery(models.Model):
    """One accepted inbound webhook call. The unique signature refuses a replay inside the
    timestamp window; rows older than the window are pruned (veronica.engine.retention)."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="webhook_deliveries")
    signature = models.CharField(max_length=64)
    member_name = models.CharField(max_length=60)
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"
        constraints = [models.UniqueConstraint(fields=["space", "signature"], name="webhook_delivery_once")]

    def __str__(self) -> str:
        return f"webhook → {self.member_name} at {self.received_at:%Y-%m-%d %H:%M:%S}"
