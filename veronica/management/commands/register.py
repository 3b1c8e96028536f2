from django.core.management.base import BaseCommand, CommandError

from veronica.errors import VeronicaError
from veronica.manifest import register_space

MODES = {
    "new": "new space: the manifest as written",
    "restart": "restart register: manifest applied, operator and leader changes kept",
    "fresh": "fresh register: the manifest as written, runtime overrides discarded",
}


class Command(BaseCommand):
    help = ("Create or refresh a space from a manifest folder. By default a restart: members, schedules, permission modes, "
            "clones and skills changed at runtime are kept. --fresh takes the manifest as written and discards them.")

    def add_arguments(self, parser):
        parser.add_argument("directory")
        parser.add_argument("--fresh", action="store_true",
                            help="discard runtime overrides (operator-added/removed members, schedules, permission modes, clones)")

    def handle(self, *args, directory: str, fresh: bool, **options):
        try:
            done = register_space(directory, fresh=fresh)
        except VeronicaError as exc:
            raise CommandError(exc.message) from None
        space = done.space
        members = ", ".join(f"{m.name} ({m.role})" for m in space.members.filter(removed_at__isnull=True))
        self.stdout.write(self.style.SUCCESS(f"registered space '{space.slug}' at {space.workdir} ({MODES[done.mode]}): {members}"))
        for line in done.kept:
            self.stdout.write(f"  kept: {line}")
        for line in done.discarded:
            self.stdout.write(f"  discarded: {line}")
        if done.mode == "restart" and done.kept:
            self.stdout.write("  (run with --fresh to take the manifest as written)")
