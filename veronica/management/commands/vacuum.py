"""manage.py vacuum [--dry-run] [--space SLUG]: purge what each space's retention_days allows."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from veronica.swarm import audit
from veronica.engine import retention
from veronica.models import Space


class Command(BaseCommand):
    help = "Delete rows older than each space's retention_days (never unread mail, open tasks, pending approvals or the newest events)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Count what would go; delete nothing.")
        parser.add_argument("--space", help="Only this space (its slug).")

    @audit.as_command  # what it changes is the OS user's, via command
    def handle(self, *args, dry_run: bool = False, space: str | None = None, **options) -> None:
        spaces = Space.objects.order_by("slug")
        if space:
            spaces = spaces.filter(slug=space)
            if not spaces.exists():
                raise CommandError(f"no space with slug '{space}'")
        verb = "would remove" if dry_run else "removed"
        if not dry_run:
            pruned = retention.prune_webhook_deliveries()
            if pruned:
                self.stdout.write(f"webhook replay guard: removed {pruned} expired deliveries")
            purged = audit.purge()
            if purged:
                self.stdout.write(f"audit trail: removed {purged} rows past their window (VERONICA_AUDIT_RETENTION_DAYS)")
        for sp in spaces:
            if sp.retention_days <= 0:
                self.stdout.write(f"{sp.slug}: retention off (retention_days = 0), nothing removed")
                continue
            counts = retention.purge_space(sp, dry_run=dry_run)
            listing = ", ".join(f"{n} {kind}" for kind, n in counts.items())
            self.stdout.write(f"{sp.slug}: {verb} {listing} older than {sp.retention_days} days; "
                              f"oldest kept event seq {retention.oldest_seq(sp.pk) or '-'}")
