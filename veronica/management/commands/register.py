from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from veronica.swarm import audit
from veronica.plumbing.errors import VeronicaError
from veronica.portable.manifest import register_space
from veronica.portable.archive import create_from_archive, create_from_template

MODES = {
    "new": "new space: the manifest as written",
    "restart": "restart register: manifest applied, operator and leader changes kept",
    "fresh": "fresh register: the manifest as written, runtime overrides discarded",
}


class Command(BaseCommand):
    help = ("Create or refresh a space from a manifest folder, or create a new space from an exported archive "
            "(.tar.gz, needs --slug) or a bundled template (--template NAME --slug SLUG). By default a restart: members, "
            "schedules, permission modes, clones and skills changed at runtime are kept. --fresh takes the manifest as "
            "written and discards them. A folder's space works in the manifest's workdir inside that folder (default "
            "workspace/); an archive's or a template's in its own folder under $VERONICA_DATA_DIR/spaces/<slug>/.")

    def add_arguments(self, parser):
        parser.add_argument("directory", nargs="?", help="a manifest folder, or an archive from `manage.py export`")
        parser.add_argument("--fresh", action="store_true",
                            help="discard runtime overrides (operator-added/removed members, schedules, permission modes, clones)")
        parser.add_argument("--slug", help="register under this slug instead of the manifest's")
        parser.add_argument("--name", help="the space's name (default: the manifest's)")
        parser.add_argument("--template", help="create a new space from this bundled template (examples/<name>/)")
        parser.add_argument("--workdir", help="a manifest folder only: the folder the space works in, anywhere on this "
                                              "host (the admin's explicit choice; the manifest's own workdir must stay "
                                              "inside its folder)")

    @audit.as_command  # what it changes is the OS user's, via command
    def handle(self, *args, directory: str | None, fresh: bool, slug: str | None = None, name: str | None = None,
               template: str | None = None, workdir: str | None = None, **options):
        try:
            if template or (directory and Path(directory).is_file()):
                self._create(directory, template, slug, name, workdir)
                return
            if not directory:
                raise CommandError("give a manifest folder, an archive, or --template NAME")
            done = register_space(directory, fresh=fresh, slug=slug, name=name, workdir=workdir)
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

    def _create(self, archive: str | None, template: str | None, slug: str | None, name: str | None,
                workdir: str | None) -> None:
        """A new space in its own folder: from an archive or a bundled template (never both, never --workdir)."""
        if workdir:
            raise CommandError("--workdir is for a manifest folder: an archive's or a template's space works in its own folder")
        if template and archive:
            raise CommandError("give an archive or --template, not both")
        if not slug:
            raise CommandError(f"{'a template' if template else 'an archive'} creates a new space: give it a --slug")
        if template:
            space, source = create_from_template(template, slug, name=name), f"template {template}"
        else:
            space, source = create_from_archive(Path(archive).read_bytes(), slug, name=name), archive
        self.stdout.write(self.style.SUCCESS(f"created space '{space.slug}' at {space.workdir} from {source}: "
                                             + self._members(space)))

    @staticmethod
    def _members(space) -> str:
        return ", ".join(f"{m.name} ({m.role})" for m in space.members.filter(removed_at__isnull=True))
