from __future__ import annotations

from django.db import models


class EngineLease(models.Model):
    """A deployment-wide role held by one process at a time (the engine ticker): whoever holds an
    unexpired lease does the work; the others take over when it runs out. Expiry is compared with
    the database's clock, so hosts with skewed clocks still agree."""

    name = models.CharField(max_length=40, primary_key=True)
    holder = models.CharField(max_length=120, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    acquired_at = models.DateTimeField(null=True, blank=True, help_text="When the current holder took it over.")

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder or 'nobody'}"
