from __future__ import annotations

from django.db import models
from django.db.models import Q


class McpTransport(models.TextChoices):
    STDIO = "stdio"
    HTTP = "http"  # streamable HTTP


class McpServer(models.Model):
    """An MCP server whose tools a member's runs are offered: the space's (member empty, every member)
    or one member's own. `env` may hold secrets: the console shows its keys, never its values."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="mcp_servers")
    member = models.ForeignKey("veronica.Member", null=True, blank=True, on_delete=models.CASCADE, related_name="mcp_servers")
    name = models.CharField(max_length=32)
    transport = models.CharField(max_length=8, choices=McpTransport.choices)
    command = models.JSONField(default=list, blank=True)  # argv, stdio only
    url = models.CharField(max_length=500, blank=True)  # streamable HTTP only
    env = models.JSONField(default=dict, blank=True)
    timeout = models.PositiveIntegerField(default=30)  # seconds, for start-up, listing and each call
    from_manifest = models.BooleanField(default=False)  # a fresh register replaces these, keeps console ones
    last_error = models.TextField(blank=True)
    tools_cached = models.JSONField(default=list, blank=True)  # [{name, read_only}] as last listed
    checked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["member", "name"], condition=Q(member__isnull=False), name="mcp_unique_per_member"),
            models.UniqueConstraint(fields=["space", "name"], condition=Q(member__isnull=True), name="mcp_unique_per_space"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def target(self) -> str:
        """What the console shows: the command line or the URL (env values never)."""
        return " ".join(self.command) if self.transport == McpTransport.STDIO else self.url

    @property
    def env_names(self) -> list[str]:
        """The variables' names, sorted (jsonb keeps its own key order); their values are never shown."""
        return sorted(self.env or {})
