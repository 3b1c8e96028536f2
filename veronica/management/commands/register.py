from django.core.management.base import BaseCommand, CommandError

from veronica.manifest import register
from veronica.errors import VeronicaError


class Command(BaseCommand):
    help = "Create or refresh a space from a manifest folder (the manifest as written wins)."

    def add_arguments(self, parser):
        parser.add_argument("directory")

    def handle(self, *args, directory: str, **options):
        try:
            space = register(directory)
        except VeronicaError as exc:
            raise CommandError(exc.message) from None
        members = ", ".join(f"{m.name} ({m.role})" for m in space.members.filter(removed_at__isnull=True))
        self.stdout.write(self.style.SUCCESS(f"registered space '{space.slug}' at {space.workdir}: {members}"))
