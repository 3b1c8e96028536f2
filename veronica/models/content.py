from __future__ import annotations

from django.db import models
from django.db.models import Q


class Blackboard(models.Model):
    """The team's one shared document, replaced whole on every write."""

    space = models.OneToOneField("veronica.Space", on_delete=models.CASCADE, related_name="blackboard")
    content = models.TextField(blank=True)
    updated_by = models.CharField(max_length=60, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"blackboard of {self.space_id}"


class Skill(models.Model):
    """A markdown skill: the member's own (member set) or shared by the space (member empty)."""

    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="skills")
    member = models.ForeignKey("veronica.Member", null=True, blank=True, on_delete=models.CASCADE, related_name="skills")
    name = models.CharField(max_length=80)
    description = models.CharField(max_length=300, blank=True)
    body = models.TextField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["member", "name"], condition=Q(member__isnull=False), name="skill_unique_per_member"),
            models.UniqueConstraint(fields=["space", "name"], condition=Q(member__isnull=True), name="shared_skill_unique_per_space"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def scope(self) -> str:
        return "member" if self.member_id else "shared"


class MemoryFile(models.Model):
    """A member's durable notes (MEMORY.md and friends), shown read-only to operators."""

    member = models.ForeignKey("veronica.Member", on_delete=models.CASCADE, related_name="memory_files")
    name = models.CharField(max_length=120)
    content = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["member", "name"], name="memory_file_unique")]

    def __str__(self) -> str:
        return self.name
