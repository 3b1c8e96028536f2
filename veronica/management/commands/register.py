from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from veronica.errors import VeronicaError
from veronica.manifest import register
from veronica.portable import create_from_archive


class Command(BaseCommand):
    help = ("Create or refresh a space from a manifest folder (the manifest as written wins), or create a new "
            "space from an exported archive (.tar.gz, needs --slug).")

    def add_arguments(self, parser):
        parser.add_argument("directory", help="a manifest folder, or an archive from `manage.py export`")
        parser.add_argument("--slug", help="register under this slug instead of the manifest's")

    def handle(self, *args, directory: str, slug: str | None = None, **options):
        try:
            if Path(directory).is_file():
                if not slug:
                    raise CommandError("an archive creates a new space: give it a --slug")
                space = create_from_archive(Path(directory).read_bytes(), slug)
            else:
                space = register(directory, slug=slug)
        except VeronicaError as exc:
            raise CommandError(exc.message) from None
        members = ", ".join(f"{m.name} ({m.role})" for m in space.members.filter(removed_at__isnull=True))
        self.stdout.write(self.style.SUCCESS(f"registered space '{space.slug}' at {space.workdir}: {members}"))
