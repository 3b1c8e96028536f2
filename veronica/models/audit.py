from __future__ import annotations

from django.db import models


class AppendOnly(Exception):
    """The app tried to change or delete an audit row: only the retention duty may delete."""


class AuditQuerySet(models.QuerySet):
    """No bulk update or delete: an audit row, once written, stays as written."""

    def update(self, **kwargs):
        raise AppendOnly("audit rows are never updated")

    def delete(self):
        raise AppendOnly("audit rows are deleted by the retention duty only (veronica.swarm.audit.purge)")

    def _purge(self) -> int:
        """The retention duty's delete (veronica.swarm.audit.purge); nothing else calls it."""
        return models.QuerySet.delete(self)[0]


class AuditRow(models.Model):
    """One change a person or a token made: who, how, when, from where, what (before -> after).
    The space is a plain reference (no cascade, no constraint): a row outlives its space and user."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    space = models.ForeignKey("veronica.Space", null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
                              related_name="+")
    space_slug = models.CharField(max_length=60, blank=True)
    actor = models.CharField(max_length=160, help_text="user:<name>, or the OS user of a command")
    user_id = models.BigIntegerField(null=True, blank=True)
    via = models.CharField(max_length=10, help_text="session, token, admin or command")
    token_id = models.BigIntegerField(null=True, blank=True)
    ip = models.CharField(max_length=45, blank=True)
    action = models.CharField(max_length=60, db_index=True)
    target = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["space", "created_at"], name="audit_space_created")]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor} ({self.via}) {self.action} {self.target}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AppendOnly("audit rows are never updated")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnly("audit rows are deleted by the retention duty only (veronica.swarm.audit.purge)")

    def as_wire(self) -> dict:
        return {"id": self.pk, "at": self.created_at.isoformat(), "space": self.space_slug or None, "actor": self.actor,
                "via": self.via, "token_id": self.token_id, "ip": self.ip, "action": self.action, "target": self.target,
                "before": self.before, "after": self.after}
