from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError


class PassCommand(BaseCommand):
    def add_arguments(self, parser):
        parser.add_argument("--wait", type=float, default=None,
                            help="Seconds to wait for the writer lock (default LEARNING_LOCK_WAIT, 300).")

    def progress(self, message: str) -> None:
        self.stdout.write(f"  {message}")

    def report(self, run) -> None:
        self.stdout.write(f"{run.kind} run #{run.pk}: {run.status} {run.stats}")
        if run.status in ("busy", "lost", "crashed"):
            raise CommandError(f"{run.kind} pass {run.status}: " + "; ".join(e["error"] for e in run.errors[:3]))
        if run.status == "error":
            raise CommandError(f"{run.kind} pass finished with {len(run.errors)} error(s); see PassRun #{run.pk}")
