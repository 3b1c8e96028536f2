from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from veronica.errors import VeronicaError
from veronica.manifest import register_space
from veronica.portable import create_from_archive

MODES = {
    "new": "new space: the manifest as written",
    "restart": "restart register: manifest applied, operator and leader changes kept",
    "fresh": "fresh register: the manifest as written, runtime overrides discarded",
}


class Command(BaseCommand):
    help = ("Create or refresh a space from a manifest folder, or create a new space from an exported archive "
            "(.tar.gz, needs --slug). By default a restart: members, schedules, permission modes, clones and skills "
            "changed at runtime are kept. --fresh takes the manifest as written and discards them.")

    def add_arguments(self, parser):
        parser.add_argument("directory", help="a manifest folder, or an archive from `manage.py export`")
        parser.add_argument("--fresh", action="store_true",
                            help="discard runtime overrides (operator-added/removed members, schedules, permission modes, clones)")
        parser.add_argument("--slug", help="register under this slug instead of the manifest's")

    def handle(self, *args, directory: str, fresh: bool, slug: str | None = None, **options):
        try:
            if Path(directory).is_file():
                if not slug:
                    raise CommandError("an archive creates a new space: give it a --slug")
                space = create_from_archive(Path(directory).read_bytes(), slug)
                self.stdout.write(self.style.SUCCESS(f"created space '{space.slug}' at {space.workdir} from {directory}: "
                                                     + self._members(space)))
                return
            done = register_space(directory, fresh=fresh, slug=slug)
        except VeronicaError as exc:
            raise CommandError(exc.message) from None
        space = done.space
        self.stdout.write(self.style.SUCCESS(f"registered space '{space.slug}' at {space.workdir} ({MODES[done.mode]}): "
                                             + self._members(space)))
        for line in done.kept:
            self.stdout.write(f"  kept: {line}")
        for line in done.discarded:
            self.stdout.write(f"  discarded: {line}")
        if done.mode == "restart" and done.kept:
            self.stdout.write("  (run with --fresh to take the manifest as written)")

    @staticmethod
    def _members(space) -> str:
        return ", ".join(f"{m.name} ({m.role})" for m in space.members.filter(removed_at__isnull=True))
