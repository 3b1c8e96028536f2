"""A2A (agent-to-agent protocol): a space served as A2A agents, its callers' credentials, the remote
agents its members may call, and the link from an A2A task id to a task on the board."""
from __future__ import annotations

from django.db import models


class A2AConfig(models.Model):
    """Off unless the owner turns it on. The leader is always the space's agent when on; `members`
    names the other members the owner exposes as agents of their own."""

    space = models.OneToOneField("veronica.Space", on_delete=models.CASCADE, related_name="a2a_config")
    enabled = models.BooleanField(default=False)
    members = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)


class A2ACredential(models.Model):
    """A bearer key an outside agent calls the space with; only its SHA-256 is stored. `name` is the
    caller agent's name, shown as the sender of its mail; `role` is a space role (viewer/operator)."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="a2a_credentials")
    name = models.CharField(max_length=40)
    role = models.CharField(max_length=10)
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_by = models.CharField(max_length=160, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]


class A2ARemote(models.Model):
    """A remote A2A agent the space's members may call as the tool a2a__<name>. `token` is sent as
    the bearer credential (a secret: never shown, scrubbed on export)."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="a2a_remotes")
    name = models.CharField(max_length=32)
    card_url = models.CharField(max_length=500)
    endpoint = models.CharField(max_length=500, blank=True)  # the JSON-RPC URL the card names
    description = models.TextField(blank=True)
    token = models.CharField(max_length=500, blank=True)
    timeout = models.PositiveIntegerField(default=60)
    from_manifest = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["space", "name"], name="a2a_remote_unique_per_space")]


class A2ATaskLink(models.Model):
    """An A2A task id (a UUID the caller sees) for a task on the board, scoped to its space."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="a2a_tasks")
    a2a_id = models.CharField(max_length=64, unique=True)
    context_id = models.CharField(max_length=64)
    task = models.OneToOneField("veronica.Task", on_delete=models.CASCADE, related_name="a2a_link")
    member = models.ForeignKey("veronica.Member", null=True, on_delete=models.SET_NULL, related_name="+")
    credential = models.ForeignKey(A2ACredential, null=True, on_delete=models.SET_NULL, related_name="+")
    caller = models.CharField(max_length=60)
    created_at = models.DateTimeField(auto_now_add=True)


class A2ACall(models.Model):
    """A member's a2a__ call whose remote task outlived the inline wait: the run parked (no worker
    held), the engine tick polls the remote task, and its end wakes the member, whose next run
    takes `result` as the call's result (resolve_held)."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="a2a_calls")
    member = models.ForeignKey("veronica.Member", on_delete=models.CASCADE, related_name="a2a_calls")
    tool_call_id = models.CharField(max_length=80)
    remote = models.ForeignKey(A2ARemote, null=True, on_delete=models.SET_NULL, related_name="calls")
    remote_name = models.CharField(max_length=32)
    remote_task_id = models.CharField(max_length=200)
    deadline = models.DateTimeField()
    next_poll_at = models.DateTimeField()
    state = models.CharField(max_length=20, default="working")
    result = models.TextField(blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    consumed = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
