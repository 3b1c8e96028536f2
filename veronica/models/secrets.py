from __future__ import annotations

from django.db import models
from django.db.models import Q


class Secret(models.Model):
    """A named secret of a space (member empty: every member) or of one member, encrypted at rest
    with the deployment's key (VERONICA_SECRETS_KEY, Fernet). Only veronica.swarm.secrets reads or
    writes `ciphertext`; nothing shows, logs or exports the value."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="secrets")
    member = models.ForeignKey("veronica.Member", null=True, blank=True, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=64)
    ciphertext = models.TextField()
    in_commands = models.BooleanField(default=False, help_text="Also set as an environment variable of run_command.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    rotated_at = models.DateTimeField(null=True, blank=True, help_text="When the master key last re-encrypted it.")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["member", "name"], condition=Q(member__isnull=False), name="secret_unique_per_member"),
            models.UniqueConstraint(fields=["space", "name"], condition=Q(member__isnull=True), name="secret_unique_per_space"),
        ]

    def __str__(self) -> str:
        return self.name
