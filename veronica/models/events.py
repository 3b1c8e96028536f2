from __future__ import annotations

from django.db import models


class Event(models.Model):
    """The durable log. seq is gapless per space and its order is commit order (see events.emit)."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="events")
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=60, db_index=True)
    member = models.ForeignKey("veronica.Member", null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["space_id", "seq"]
        constraints = [models.UniqueConstraint(fields=["space", "seq"], name="event_seq_unique_per_space")]

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
