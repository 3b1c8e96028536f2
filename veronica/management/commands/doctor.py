"""Preflight: every member's model spec and provider keys, the workdirs, the services."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from veronica.agent.providers import get_provider
from veronica.agent.providers.base import ProviderError
from veronica.errors import VeronicaError
from veronica.models import Member, Space


class Command(BaseCommand):
    help = "Check the database, the broker, every space's workdir and every member's provider (keys included)."

    def handle(self, *args, **options):
        problems = 0

        def report(ok: bool, text: str) -> None:
            nonlocal problems
            problems += not ok
            self.stdout.write(("  ✓ " if ok else "  ✗ ") + text)

        connection.ensure_connection()
        report(True, f"database: {connection.vendor}")
        if settings.REDIS_URL:
            import redis

            try:
                redis.Redis.from_url(settings.REDIS_URL).ping()
                report(True, "redis: reachable")
            except redis.RedisError as exc:
                report(False, f"redis: {exc}")
        for space in Space.objects.all():
            report(Path(space.workdir).is_dir(), f"space {space.slug}: workdir {space.workdir}")
            for member in Member.objects.filter(space=space, removed_at__isnull=True):
                try:
                    get_provider(member.model)
                    report(True, f"  {member.name}: {member.model}")
                except (ProviderError, VeronicaError) as exc:
                    report(False, f"  {member.name}: {member.model}: {exc}")
        if problems:
            raise CommandError(f"{problems} problem(s) found")
        self.stdout.write(self.style.SUCCESS("all checks passed"))
