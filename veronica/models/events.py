from __future__ import annotations

from django.db import models


RUN_MARKS = ["run.started", "run.ended", "approval.requested", "approval.resolved"]


class Event(models.Model):
    """The durable log. seq is gapless per space and its order is commit order (see events.emit)."""

    # Every row a step writes updates each of the table's indexes (issue 25: a fleet's hosted steps write
    # ~4 events each): space_id has no index of its own (event_seq_unique_per_space leads with it) and kind
    # none at all (every read by kind names the member first: event_member_seq_idx / event_run_marks_idx).
    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=60)
    # indexed by event_member_seq_idx (member first), not by a lone member_id index of its own
    member = models.ForeignKey("veronica.Member", null=True, blank=True, on_delete=models.SET_NULL, related_name="events",
                               db_index=False)
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["space_id", "seq"]
        constraints = [models.UniqueConstraint(fields=["space", "seq"], name="event_seq_unique_per_space")]
        indexes = [
            # the run page reads one member's events between its run's marks: an index range of that run's own
            # events, where member_id alone read all of the member's (20,000 in a 1,000,000-event space)
            models.Index(fields=["member", "seq"], name="event_member_seq_idx"),
            # a run's start / end and its approval links, looked up by member and kind: two rows a run
            models.Index(fields=["member", "kind", "seq"], name="event_run_marks_idx", condition=models.Q(kind__in=RUN_MARKS)),
        ]

    def __str__(self) -> str:
        return f"{self.space_id}#{self.seq} {self.kind}"

    def as_wire(self) -> dict:
        return {
            "seq": self.seq,
            "kind": self.kind,
            "member": self.payload.get("member_name") if isinstance(self.payload, dict) else None,
            "payload": self.payload,
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }
