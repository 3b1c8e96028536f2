from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from veronica.swarm import audit
from veronica.models import Space
from veronica.portable.archive import export_archive


class Command(BaseCommand):
    help = "Write a space as a manifest archive (.tar.gz; secrets scrubbed, runtime state left out)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("path", help="the .tar.gz to write")

    @audit.as_command  # what it changes is the OS user's, via command
    def handle(self, *args, slug: str, path: str, **options):
        space = Space.objects.filter(slug=slug).first()
        if space is None:
            raise CommandError(f"no space '{slug}'")
        data = export_archive(space)
        Path(path).write_bytes(data)
        self.stdout.write(self.style.SUCCESS(f"exported space '{slug}' to {path} ({len(data)} bytes)"))
